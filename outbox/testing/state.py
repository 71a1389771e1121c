"""An empty outbox for one test: :func:`empty_outbox`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis import Redis

from outbox.conf import outbox_settings
from outbox.destinations.config import close_transports
from outbox.store import get_repository
from outbox.store.client.connection import empty_database


@contextmanager
def empty_outbox() -> Iterator[Redis]:
    """Drop the outbox's cached settings, repository and transports, empty its Redis
    database (``FLUSHDB``), and yield the connection; on exit close the transports and
    forget the repository again. Used by the pytest plugin's ``outbox_redis`` fixture
    (and this project's own tests) after the settings point at a private server.
    """

    outbox_settings.reload()
    get_repository.cache_clear()
    close_transports()
    connection = empty_database()
    try:
        yield connection
    finally:
        close_transports()
        get_repository.cache_clear()
