from django.urls import path

from . import receiver, views

app_name = "shop"

urlpatterns = [
    path("", views.index, name="index"),
    path("orders/", views.place, name="place"),
    path("orders/burst/", views.burst, name="burst"),
    path("receiver/<slug:name>", receiver.receive, name="receiver"),
]
