from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_site.shop"
    label = "shop"
    verbose_name = "Demo shop"
