from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from outbox import checks  # noqa: F401  (registers the system checks)
        from outbox.conf import outbox_settings

        if outbox_settings.METRICS_REGISTER:  # for django-prometheus's /metrics (needs the metrics extra)
            from outbox.metrics import register

            register()
