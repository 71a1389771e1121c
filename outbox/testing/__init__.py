"""Helpers for testing a project that uses the outbox.

* :class:`RedisServer`: a private Redis-compatible server on a free port (no root, no
  system package; the ``server`` extra ships a Valkey binary).
* :class:`ClusterServer`: a private Redis/Valkey Cluster of N primaries on free ports,
  whose slots can be moved the legacy way (:mod:`outbox.testing.cluster_server`).
* :func:`deliver_all`: deliver everything due, in this process, without an RQ worker
  (:func:`adeliver_all`: the same, awaited, for async tests).
* :class:`SentMessages`: the messages sent during a test, with assertion helpers.
* The pytest plugin :mod:`outbox.pytest_plugin` (installed with the package) wraps these
  as fixtures: ``outbox_redis``, ``outbox_sent``, ``outbox_deliver``, ``aoutbox_deliver``.
* ``OUTBOX["EAGER"] = True`` makes ``send()`` deliver inside the call (inside
  ``transaction.atomic`` too, at call time, not on commit), like Celery's
  ``task_always_eager``: see :mod:`outbox.sending.intake`.

See docs/testing.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# RedisServer and ClusterServer are imported eagerly: settings modules start servers with
# them before Django is set up. The rest needs Django's settings, so it is imported on first
# use (PEP 562).
from outbox.testing.cluster_server import ClusterServer
from outbox.testing.redis_server import RedisServer, find_server_binary, free_port

if TYPE_CHECKING:  # what __getattr__ returns, for type checkers
    from outbox.testing.delivery import Delivered, adeliver_all, deliver_all
    from outbox.testing.sent import SentMessages

_LAZY = {
    "Delivered": ".delivery",
    "adeliver_all": ".delivery",
    "deliver_all": ".delivery",
    "SentMessages": ".sent",
}

__all__ = [
    "ClusterServer",
    "Delivered",
    "RedisServer",
    "SentMessages",
    "adeliver_all",
    "deliver_all",
    "find_server_binary",
    "free_port",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
