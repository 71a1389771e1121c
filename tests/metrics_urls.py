"""URLs for tests/integrations/test_metrics.py: the outbox's metrics view, and django-prometheus's /metrics."""

from django.urls import include, path

urlpatterns = [
    path("outbox/metrics", include("outbox.metrics.urls")),
    path("", include("django_prometheus.urls")),
]
