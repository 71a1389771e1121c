"""The shop's pages: place an order (or a burst of random ones) and watch them go out."""

from __future__ import annotations

import logging

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from redis.exceptions import RedisError

from outbox.store import get_repository

from .models import CATALOG, Order
from .orders import place_order, place_random_orders
from .receiver import ReceiverStore

logger = logging.getLogger("demo_site.shop")

RECENT = 15  # orders listed on the page


class OrderForm(forms.Form):
    customer = forms.CharField(max_length=100, initial="Ada")
    email = forms.EmailField(initial="ada@example.com")
    sku = forms.ChoiceField(
        label="Product", choices=[(sku, f"{name} ({price})") for sku, (name, price) in CATALOG.items()]
    )
    quantity = forms.IntegerField(min_value=1, max_value=10, initial=1)


class BurstForm(forms.Form):
    count = forms.IntegerField(label="Random orders", min_value=1, max_value=500, initial=50)


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The order form, the recent orders with their outbox status, and the counters."""
    orders = list(Order.objects.all()[:RECENT])
    context = {
        "form": OrderForm(),
        "burst_form": BurstForm(),
        "orders": orders,
        "failure_rate": settings.DEMO_FAILURE_RATE,
        "receiver_url": settings.DEMO_RECEIVER_URL,
        "redis_error": "",
    }
    try:
        repo = get_repository()
        found = repo.get_many([o.message_id for o in orders if o.message_id])
        by_id = {m.id: m for m in found if m is not None}
        context["rows"] = [(o, by_id.get(o.message_id)) for o in orders]
        context["counts"] = repo.counts("orders")
        context["receiver"] = ReceiverStore.from_settings("orders").totals()
    except RedisError as exc:
        context["rows"] = [(o, None) for o in orders]
        context["redis_error"] = f"Redis is not reachable at {settings.REDIS_URL}: {exc}"
    return render(request, "shop/index.html", context)


@require_POST
def place(request: HttpRequest) -> HttpResponse:
    """Place one order from the form: the order row and its outbox message commit together."""
    form = OrderForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Invalid order: {form.errors.as_text()}")
        return redirect("shop:index")
    try:
        order = place_order(**form.cleaned_data)
    except RedisError as exc:
        logger.exception("placing an order failed")
        messages.error(request, f"The order could not be queued: Redis error {exc}")
        return redirect("shop:index")
    messages.success(request, f"Order {order.reference} placed; webhook message {order.message_id} queued.")
    return redirect("shop:index")


@require_POST
def burst(request: HttpRequest) -> HttpResponse:
    """Place a burst of random orders, queued in one ``send_many`` batch."""
    form = BurstForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Invalid count: {form.errors.as_text()}")
        return redirect("shop:index")
    try:
        placed = place_random_orders(form.cleaned_data["count"])
    except RedisError as exc:
        logger.exception("placing orders failed")
        messages.error(request, f"The orders could not be queued: Redis error {exc}")
        return redirect("shop:index")
    messages.success(request, f"{len(placed)} random orders placed and queued in one batch.")
    return redirect("shop:index")
