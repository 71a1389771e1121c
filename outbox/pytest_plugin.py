"""pytest plugin for projects that use the outbox (registered with the ``pytest11`` entry
point, so it loads wherever django-redis-outbox is installed; it does nothing until a
test asks for one of its fixtures).

Fixtures:

* ``outbox_redis``: a private Redis server for the test session (:class:`outbox.testing.RedisServer`),
  with the outbox's cache alias (``OUTBOX["REDIS_ALIAS"]``) and every django-rq queue
  pointed at it for the test, and emptied before it. Needs pytest-django's ``settings``.
* ``outbox_sent``: :class:`outbox.testing.SentMessages` of the test (uses ``outbox_redis``).
* ``outbox_deliver``: :func:`outbox.testing.deliver_all`, ready to call (uses ``outbox_redis``).
* ``aoutbox_deliver``: :func:`outbox.testing.adeliver_all` for async tests:
  ``await aoutbox_deliver()`` (it runs in Django's sync thread, not on the loop).

The fixtures are synchronous and work in async tests (pytest-asyncio, anyio);
``outbox_sent``'s reads have awaitable twins there (``await outbox_sent.aassert_sent(...)``).

Example::

    def test_order_sends_a_webhook(outbox_sent, outbox_deliver, client):
        client.post("/orders/", {...})
        outbox_sent.assert_sent("orders", count=1)
        assert outbox_deliver().succeeded == 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def _outbox_redis_server() -> Iterator[Any]:
    from outbox.testing import RedisServer  # the plugin loads before Django is set up

    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def outbox_redis(_outbox_redis_server: Any, settings: Any) -> Iterator[Any]:
    """The private Redis (a ``redis.Redis`` client), empty, with the outbox and django-rq on
    it (a project's ``OUTBOX["CLUSTER"]`` is dropped for the test: the outbox's data goes
    to the private server too, never to the cluster of the settings)."""
    from outbox.conf import RQ_CONNECTION_KEYS, outbox_settings  # the plugin loads before Django is set up
    from outbox.testing.state import empty_outbox  # the plugin loads before Django is set up

    url = _outbox_redis_server.url
    alias = outbox_settings.REDIS_ALIAS
    caches = {name: dict(conf) for name, conf in settings.CACHES.items()}
    caches[alias] = {
        **caches.get(alias, {}),
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
    }
    settings.CACHES = caches
    queues = dict(getattr(settings, "RQ_QUEUES", {}))
    settings.RQ_QUEUES = {
        name: {
            **{k: v for k, v in queues.get(name, {}).items() if k not in RQ_CONNECTION_KEYS},
            "USE_REDIS_CACHE": alias,
        }
        for name in [*queues, *(q for q in outbox_settings.queue_names if q not in queues)]
    }
    if "CLUSTER" in (getattr(settings, "OUTBOX", None) or {}):
        settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "CLUSTER"}
    with empty_outbox() as connection:
        yield connection


@pytest.fixture
def outbox_sent(outbox_redis: Any) -> Any:
    """The messages sent during this test (:class:`outbox.testing.SentMessages`)."""
    from outbox.testing import SentMessages  # the plugin loads before Django is set up

    return SentMessages()


@pytest.fixture
def outbox_deliver(outbox_redis: Any) -> Callable[..., Any]:
    """:func:`outbox.testing.deliver_all` (call it to deliver what is due, in process)."""
    from outbox.testing import deliver_all  # the plugin loads before Django is set up

    return deliver_all


@pytest.fixture
def aoutbox_deliver(outbox_redis: Any) -> Callable[..., Any]:
    """:func:`outbox.testing.adeliver_all`: ``report = await aoutbox_deliver()`` in async tests."""
    from outbox.testing import adeliver_all  # the plugin loads before Django is set up

    return adeliver_all
