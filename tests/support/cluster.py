"""A real 3-primary Redis/Valkey Cluster for the tests that ask for one.

Fixtures (imported by ``tests/conftest.py``; a test using either is marked ``cluster``
there, so ``-m "not cluster"`` skips them):

- ``redis_cluster`` (session): a :class:`outbox.testing.cluster_server.ClusterServer` of
  3 primaries, started the first time a test asks for it (about 2 s) and stopped, by pid,
  when the session ends. Shared: a test that moves slots moves them back.
- ``cluster_outbox``: the cluster settled (no slot left half moved by a test before) and
  emptied (``FLUSHALL`` on every primary) and the outbox
  pointed at it for the test (``OUTBOX["CLUSTER"]``); yields the outbox's connection, a
  ``redis.cluster.RedisCluster``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from outbox.testing.cluster_server import ClusterServer

PRIMARIES = 3


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServer]:
    """The session's cluster of 3 primaries, started on first use."""
    with ClusterServer(primaries=PRIMARIES) as cluster:
        yield cluster


def cluster_settings(cluster: ClusterServer, **options: Any) -> dict[str, Any]:
    """``OUTBOX["CLUSTER"]`` for ``cluster``: its nodes' URLs and ``options``."""
    return {"NODES": cluster.urls, **options}


@pytest.fixture
def cluster_outbox(redis_cluster: ClusterServer, settings: Any) -> Iterator[Any]:
    """The outbox on the (emptied) cluster for this test: its RedisCluster connection."""
    from outbox.testing.state import empty_outbox

    left = redis_cluster.settle()
    if left:
        import warnings

        warnings.warn(f"a test before this one left slots {left} half moved: finished now", stacklevel=1)
    redis_cluster.flush()
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": cluster_settings(redis_cluster)}
    with empty_outbox() as connection:
        yield connection


#: Partitions of the outbox in cluster mode in the tests (the issue's P = 16).
PARTITIONS = 16
RQ_QUEUE_NAMES = ("outbox_high", "outbox", "outbox_low")


@pytest.fixture
def cluster_mode(cluster_outbox: Any, settings: Any) -> Iterator[Any]:
    """The outbox as a cluster deployment runs it: its data on the (emptied) cluster in
    ``PARTITIONS`` partitions, RQ's queues on a plain Redis beside it (the private single
    server). Yields the outbox's connection, a ``redis.cluster.RedisCluster``."""
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": PARTITIONS}
    settings.RQ_QUEUES = {name: {"URL": settings.REDIS_URL} for name in RQ_QUEUE_NAMES}
    from outbox.store import get_repository

    get_repository.cache_clear()
    yield cluster_outbox
