"""Demo URLs: the shop at /, the flaky webhook receiver at /receiver/<name>, the admin at /admin/."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("demo_site.shop.urls")),
]
