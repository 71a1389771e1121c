"""Placing orders: the one place the shop talks to the outbox.

Both functions create the order rows and call the outbox inside one database
transaction, so the outbox writes to Redis only when the orders are committed (and
sends nothing if the transaction rolls back).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from django.db import transaction

import outbox
from outbox.records import Message

from .models import CATALOG, Order

CUSTOMERS: Sequence[str] = (
    "Ada",
    "Grace",
    "Linus",
    "Margaret",
    "Guido",
    "Barbara",
    "Ken",
    "Radia",
    "Edsger",
    "Frances",
)


def idempotency_key(order: Order) -> str:
    """The outbox idempotency key of an order's webhook: one message per order, ever."""
    return f"order-{order.reference}"


def place_order(*, customer: str, email: str, sku: str, quantity: int, notify: bool = True) -> Order:
    """Create an order and queue its ``orders`` webhook (and, if ``notify``, an email).

    The outbox writes happen when the transaction commits (``transaction.on_commit``).

    Raises:
        KeyError: ``sku`` is not in the catalog.
        outbox.InvalidMessage: the outbox refused the message (nothing is written).
        redis.exceptions.RedisError: Redis could not be reached at commit time.
    """
    _name, price = CATALOG[sku]
    with transaction.atomic():
        order = Order.objects.create(
            customer=customer, email=email, sku=sku, quantity=quantity, unit_price=price
        )
        message = outbox.send("orders", order.as_json(), idempotency_key=idempotency_key(order))
        if notify:
            outbox.send(
                "emails",
                f"Order {order.reference}: {quantity} x {CATALOG[sku][0]} for {customer} <{email}>, total {order.total}.",
                headers={"Subject": f"New order {order.reference}"},
                idempotency_key=f"order-email-{order.reference}",
            )
        order.message_id = message.id
        order.save(update_fields=["message_id"])
    return order


def random_order(rng: random.Random) -> Order:
    """An unsaved order with a random customer, product and quantity."""
    customer = rng.choice(CUSTOMERS)
    sku = rng.choice(sorted(CATALOG))
    return Order(
        customer=customer,
        email=f"{customer.lower()}@example.com",
        sku=sku,
        quantity=rng.randint(1, 4),
        unit_price=CATALOG[sku][1],
    )


def place_random_orders(count: int, *, rng: random.Random | None = None) -> list[tuple[Order, Message]]:
    """Create ``count`` random orders and queue their webhooks in one batch (``send_many``).

    One transaction: the orders are inserted, then the messages are written to Redis in
    one round trip when it commits.

    Returns:
        (order, message) pairs, in order.

    Raises:
        ValueError: ``count`` is not positive.
        redis.exceptions.RedisError: Redis could not be reached at commit time.
    """
    if count < 1:
        raise ValueError(f"count must be positive, not {count}")
    rng = rng or random.Random()
    with transaction.atomic():
        orders = Order.objects.bulk_create([random_order(rng) for _ in range(count)])
        messages = outbox.send_many(
            [
                {"destination": "orders", "body": o.as_json(), "idempotency_key": idempotency_key(o)}
                for o in orders
            ]
        )
        for order, message in zip(orders, messages, strict=True):
            order.message_id = message.id
        Order.objects.bulk_update(orders, ["message_id"], batch_size=500)
    return list(zip(orders, messages, strict=True))
