"""The shop's one model: an order."""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import Any

from django.db import models

#: sku -> (name, unit price)
CATALOG: dict[str, tuple[str, Decimal]] = {
    "mug": ("Outbox mug", Decimal("12.50")),
    "tee": ("Retry T-shirt", Decimal("24.00")),
    "sticker": ("Dead-letter sticker pack", Decimal("3.20")),
    "book": ("Designing Data-Intensive Applications", Decimal("45.90")),
}


def new_reference() -> str:
    """A random public order reference, e.g. ``"A3F09C11D2"``."""
    return secrets.token_hex(5).upper()


class Order(models.Model):
    """An order placed in the shop; its JSON goes to the ``orders`` webhook."""

    reference = models.CharField(max_length=16, unique=True, default=new_reference)
    customer = models.CharField(max_length=100)
    email = models.EmailField()
    sku = models.CharField(max_length=20, choices=[(sku, name) for sku, (name, _) in CATALOG.items()])
    quantity = models.PositiveIntegerField(default=1)
    unit_price = models.DecimalField(max_digits=8, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)
    message_id = models.CharField(max_length=40, blank=True, help_text="the outbox message that announced it")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Order {self.reference}"

    @property
    def total(self) -> Decimal:
        return self.unit_price * self.quantity

    def as_json(self) -> dict[str, Any]:
        """The order as the webhook receives it."""
        return {
            "type": "order.placed",
            "order": {
                "id": self.pk,
                "reference": self.reference,
                "customer": self.customer,
                "email": self.email,
                "items": [{"sku": self.sku, "quantity": self.quantity, "unit_price": str(self.unit_price)}],
                "total": str(self.total),
                "created_at": self.created_at.isoformat() if self.created_at else None,
            },
        }
