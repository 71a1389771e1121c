from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Imported once the app registry is ready (app loading), for what importing does:
        from outbox import alerts, checks  # noqa: F401  (connects the alerts to destination events; registers the checks)
        from outbox.conf import outbox_settings  # app loading: settings are read once ready
        from outbox.destinations import endpoints  # noqa: F401  (models; its receivers keep endpoint rows in line with Redis and announce application and event type changes: publish() keeps them)
        from outbox.model_events import connect  # app loading: it looks models up in the registry

        connect()  # OUTBOX["MODEL_EVENTS"]' receivers; raises ImproperlyConfigured

        from outbox import tracing  # app loading: OpenTelemetry imported now, not in the first send

        tracing.preload()

        if outbox_settings.METRICS_REGISTER:  # for django-prometheus's /metrics (needs the metrics extra)
            from outbox.metrics import register  # optional: the metrics extra

            register()
