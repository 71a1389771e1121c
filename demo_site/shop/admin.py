from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("reference", "customer", "sku", "quantity", "unit_price", "created_at", "message_id")
    search_fields = ("reference", "customer", "email", "message_id")
    list_filter = ("sku",)
