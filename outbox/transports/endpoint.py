"""The transport of endpoints registered at runtime (``docs/webhooks.md``): a
:class:`~outbox.transports.webhook.WebhookTransport` per endpoint configuration, every
one of them sending through **one HTTP client pool per process** (10,000 endpoints are
10,000 small objects, not 10,000 pools).

What differs from a settings webhook destination:

* ``webhook-id`` is the event's id (the ``Outbox-Event-Id`` header its deliveries carry,
  :data:`EVENT_ID_HEADER`), the same for every endpoint the event fanned out to and on
  every retry, as Svix's ``svix-id`` is its message id: a receiver deduplicates by it even
  when two of its endpoints subscribed to one event. The delivery's own id is the
  ``Outbox-Delivery-Id`` header.
* connections: the pool is shared; the private-network guard, TLS verification and the
  timeouts are those of ``OUTBOX["ENDPOINTS"]`` (one setting for every endpoint), and
  the environment's proxy is never used.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

import httpx

from outbox.forks import renew_lock_after_fork
from outbox.records import Message
from outbox.transports.ssrf import GuardedTransport
from outbox.transports.webhook import WebhookTransport
from outbox.version import __version__

#: The header a delivery of an event carries its event's id in (its ``webhook-id``).
EVENT_ID_HEADER = "Outbox-Event-Id"
#: The header a delivery carries its own (message) id in.
DELIVERY_ID_HEADER = "Outbox-Delivery-Id"
#: The header a delivery carries its event type in.
EVENT_TYPE_HEADER = "Outbox-Event-Type"
#: Connections the shared pool keeps open at most (across every endpoint), and opens at most.
KEEPALIVE_CONNECTIONS = 256
MAX_CONNECTIONS = 1024

_lock = threading.Lock()
_pools: dict[tuple[int, bool, float, float], tuple[httpx.Client, GuardedTransport]] = {}

renew_lock_after_fork(sys.modules[__name__], "_lock")  # the child makes its own pool: see shared_pool


def shared_pool(
    block_private: bool, timeout: float, connect_timeout: float
) -> tuple[httpx.Client, GuardedTransport]:
    """This process's client pool for endpoints (one per guard setting and timeouts),
    created on first use; a forked child gets its own."""
    key = (os.getpid(), block_private, timeout, connect_timeout)
    pool = _pools.get(key)
    if pool is not None:
        return pool
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            transport = GuardedTransport(
                verify=True,
                block_private=block_private,
                limits=httpx.Limits(
                    max_connections=MAX_CONNECTIONS, max_keepalive_connections=KEEPALIVE_CONNECTIONS
                ),
            )
            client = httpx.Client(
                transport=transport,
                timeout=httpx.Timeout(timeout, connect=connect_timeout),
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": f"django-redis-outbox/{__version__}", "Accept-Encoding": "identity"},
            )
            pool = _pools[key] = (client, transport)
    return pool


def close_shared_pools() -> None:
    """Close this process's endpoint pools (best effort; the next delivery opens one)."""
    with _lock:
        for key in [k for k in _pools if k[0] == os.getpid()]:
            client, _ = _pools.pop(key)
            with contextlib.suppress(Exception):  # closing is best effort
                client.close()
        _pools.clear()  # an inherited pool of a parent is dropped unclosed


class EndpointTransport(WebhookTransport):
    """The webhook transport of one endpoint (its URL, secrets, headers), sharing
    :func:`shared_pool`. Options as :class:`WebhookTransport`'s, but ``verify`` and
    ``trust_env`` (always the defaults).

    Raises:
        ImproperlyConfigured: from ``__init__``, for any invalid option.
    """

    allow_private_hint = "OUTBOX['ENDPOINTS']['ALLOW_PRIVATE_NETWORKS'] = True allows it for every endpoint"
    options: tuple[str, ...] = (
        "url",
        "secret",
        "timeout",
        "connect_timeout",
        "deadline",
        "headers",
        "allow_private_networks",
    )

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)

    @property
    def client(self) -> httpx.Client:
        client, self._transport = shared_pool(self.block_private_networks, self.timeout, self.connect_timeout)
        return client

    def webhook_id(self, message: Message) -> str:
        """The event's id (:data:`EVENT_ID_HEADER`), else the delivery's."""
        return message.headers.get(EVENT_ID_HEADER) or message.id

    def request_headers(self, message: Message, timestamp: int) -> dict[str, str]:
        headers = super().request_headers(message, timestamp)
        headers[DELIVERY_ID_HEADER] = message.id
        return headers

    def close(self) -> None:
        """Nothing: the pool is shared (:func:`close_shared_pools` closes it)."""
