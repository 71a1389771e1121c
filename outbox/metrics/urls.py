"""URLs of the metrics endpoint: ``path("outbox/metrics", include("outbox.metrics.urls"))``
serves :func:`outbox.metrics.views.metrics` at ``/outbox/metrics``."""

from django.urls import path

from outbox.metrics import views

app_name = "outbox_metrics"
urlpatterns = [path("", views.metrics, name="metrics")]
