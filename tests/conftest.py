"""Fixtures: a private Redis (see tests/settings.py), a private 3-primary cluster
(tests/support/cluster.py), real RQ workers, real HTTP receivers, real worker processes,
and the console's users. The helpers they use are in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.support.cluster import PARTITIONS, cluster_mode, cluster_outbox, redis_cluster  # noqa: F401 (fixtures)
from tests.support.http import Receiver, receiving
from tests.support.messages import hook_settings, run_worker
from tests.support.processes import Supervisor

#: The per-test time bound (OUTBOX_TEST_TIME_LIMIT, default 60 s) and its ``slow`` marker.
pytest_plugins = ["tests.support.time_limit"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cluster`` every test that uses the real cluster (tests/support/cluster.py);
    when the whole suite runs on the cluster (OUTBOX_TEST_CLUSTER), skip the tests marked
    ``single_server``, with their reason; on PostgreSQL (OUTBOX_TEST_DATABASE=postgres,
    tests/settings.py) where none answers, skip every test, saying why."""
    on_cluster = bool(os.environ.get("OUTBOX_TEST_CLUSTER"))
    from django.conf import settings

    no_postgres = settings.TEST_DATABASE == "postgres" and settings.POSTGRES_MISSING
    for item in items:
        if no_postgres:
            item.add_marker(pytest.mark.skip(reason=f"OUTBOX_TEST_DATABASE=postgres: {no_postgres}"))
        if "redis_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        mark = item.get_closest_marker("single_server")
        if on_cluster and mark is not None:
            why = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"single server only: {why}"))
    # The longest tests first (the fault scenarios, the browser's): run in parallel
    # processes (scripts/test), the suite then ends on short tests instead of waiting on
    # one process's last scenario. A stable sort: the rest keep their order.
    items.sort(key=lambda item: not any(item.get_closest_marker(name) for name in LONG_MARKERS))


#: Markers of the suite's longest tests, started first (see pytest_collection_modifyitems).
LONG_MARKERS = ("faults", "browser", "slow")


@pytest.fixture(autouse=True)
def _close_executor_connections() -> Iterator[None]:
    """After each test, close the database connections opened in asgiref's executor
    thread (``sync_to_async`` outside ``async_to_sync``: async tests, ``apublish``). No
    request cycle closes them in tests, and on PostgreSQL an open one kept the test
    database from being dropped at the session's end ("being accessed by other users")."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture
def rq_redis():
    """RQ's Redis (a plain server; beside the cluster when the suite runs on one)."""
    import django_rq

    return django_rq.get_connection("outbox")


@pytest.fixture(autouse=True)
def redis(settings):
    """The outbox's connection, emptied before each test; outbox caches reset: the private
    test Redis, or with OUTBOX_TEST_CLUSTER the private cluster (a ``RedisCluster``), the
    plain Redis beside it (RQ's) emptied too."""
    from outbox.testing.state import empty_outbox

    if settings.CLUSTER_NODES:
        from redis import Redis

        with Redis.from_url(settings.REDIS_URL) as plain:
            plain.flushdb()
    with empty_outbox() as conn:
        yield conn


@pytest.fixture
def repo(redis):
    from outbox.store import get_repository

    return get_repository()


@pytest.fixture
def partitioned(redis, settings):
    """The outbox on the single test server with ``PARTITIONS`` (16) partitions: every
    script call in one partition's slot, as on a cluster. Yields the repository."""
    from outbox.store import get_repository

    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": PARTITIONS}
    get_repository.cache_clear()
    yield get_repository()
    get_repository.cache_clear()


@pytest.fixture(params=["single", "cluster"])
def spread(request):
    """The repository with 16 partitions, on the single test server (:func:`partitioned`)
    or on the real cluster (``cluster_mode``): a test of partitions runs on both."""
    if request.param == "cluster":
        from outbox.store import get_repository

        request.getfixturevalue("cluster_mode")
        yield get_repository()
    else:
        yield request.getfixturevalue("partitioned")


@pytest.fixture
def worker() -> Callable[..., None]:
    """:func:`tests.support.messages.run_worker`: a burst outbox worker in this process."""
    return run_worker


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A :class:`tests.support.http.Receiver` on loopback for the test."""
    with receiving() as state:
        yield state


@pytest.fixture
def hook(receiver):
    """The 'hook' destination pointed at the ``receiver`` fixture for the test."""
    with hook_settings(receiver.url):
        yield receiver


@pytest.fixture
def processes() -> Iterator[Supervisor]:
    """A :class:`tests.support.processes.Supervisor` whose processes are stopped (SIGTERM,
    then SIGKILL) when the test ends."""
    with Supervisor() as supervisor:
        yield supervisor


# -- the console's users -------------------------------------------------------------------


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def superuser_client(client, superuser):
    """A test client logged in as the ``superuser`` fixture ("root"). Not pytest-django's
    ``admin_client``, which logs in a user of its own ("admin")."""
    client.force_login(superuser)
    return client


@pytest.fixture
def viewer_client(client, django_user_model):
    """A test client logged in as staff with only ``view_message``."""
    from tests.support.console import staff

    client.force_login(staff(django_user_model, "viewer", "view_message"))
    return client
