"""Issue 30, item 5: the capture table is scoped to a deployment.

Two configurations (two private Redis servers) share the test database: a message
captured under one is never pushed into the other's Redis, by its relay or by a push of
its own ordered message; each deployment's relay pushes its own rows, and every relay
pushes legacy rows (written before rows carried a deployment). Real Redis servers, SQLite
(the default alias) and PostgreSQL (the ``postgres`` alias, where one answers).

The tests are not wrapped in a transaction of their own (``django_db`` without
``transaction=True``): the on-commit fast path never runs, so a captured row stays as it
does when a process dies between commit and push, and the relay finds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

import outbox
from outbox.testing import RedisServer
from tests.support import ROOT

PG_MISSING = django_settings.POSTGRES_MISSING
DATABASES = ["default"] if PG_MISSING else ["default", "postgres"]
db = pytest.mark.django_db(databases=DATABASES)
ALIASES = [
    pytest.param("default", id="sqlite"),
    pytest.param(
        "postgres", id="postgres", marks=pytest.mark.skipif(bool(PG_MISSING), reason=PG_MISSING or "")
    ),
]


@pytest.fixture
def other() -> Iterator[RedisServer]:
    """A second private Redis server: the other deployment's."""
    server = RedisServer().start()
    yield server
    server.stop()


def on(url: str, **outbox: object) -> override_settings:
    """The settings of a configuration whose outbox data lives on the plain server ``url``
    (its own cache alias, no cluster), with ``outbox`` keys of ``OUTBOX`` besides."""
    caches = {
        **django_settings.CACHES,
        "deployment": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
    }
    settings = {
        **django_settings.OUTBOX,
        "CLUSTER": None,
        "PARTITIONS": 1,
        "REDIS_ALIAS": "deployment",
        **outbox,
    }
    return override_settings(CACHES=caches, OUTBOX=settings)


def in_redis(message_id: str) -> bool:
    """Whether the current configuration's Redis holds the message."""
    from outbox.store import get_repository

    repo = get_repository()
    return bool(repo.connection.exists(repo.keys.message(message_id)))


def rows(alias: str):
    from outbox.models import CapturedMessage

    return CapturedMessage.objects.using(alias)


def capture(alias: str, n: int, **kwargs: object):
    """A message captured in a transaction on ``alias`` (its push never runs: see the module)."""
    with transaction.atomic(using=alias):
        return outbox.send("mem", {"n": n}, using=alias, **kwargs)


# -- the relay pushes only its own deployment's rows ----------------------------------------
@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_relay_never_pushes_a_message_another_deployment_captured(alias, other):
    from outbox.sending.capture import relay

    a, b = django_settings.REDIS_URL, other.url
    with on(a):
        mine = capture(alias, 1)
    with on(b):
        theirs = capture(alias, 2)
        assert relay(alias, older_than=0) == 1  # b's own row, not a's
        assert in_redis(theirs.id)
        assert not in_redis(mine.id)
    assert rows(alias).filter(id=mine.id).exists()  # left to its own relay
    with on(a):
        assert not in_redis(theirs.id)
        assert relay(alias, older_than=0) == 1
        assert in_redis(mine.id)
    assert not rows(alias).exists()


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_push_of_an_ordered_message_never_takes_another_deployments_earlier_rows(alias, other):
    """The two deployments number one (destination, key) from one sequence row; b's push
    of its message (number 2) writes no earlier row of a's (number 1) into b's Redis."""
    from outbox.sending.capture import push, relay

    a, b = django_settings.REDIS_URL, other.url
    with on(a):
        first = capture(alias, 1, ordering_key="k")
    with on(b):
        second = capture(alias, 2, ordering_key="k")
        push([second], alias)
        assert in_redis(second.id)
        assert not in_redis(first.id)
        assert relay(alias, older_than=0) == 0
    with on(a):
        assert relay(alias, older_than=0) == 1
        assert in_redis(first.id) and not in_redis(second.id)


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_an_idempotency_key_is_one_per_deployment(alias, other):
    a, b = django_settings.REDIS_URL, other.url
    with on(a):
        mine = capture(alias, 1, idempotency_key="order-1")
    with on(b):
        theirs = capture(alias, 2, idempotency_key="order-1")  # another body: no conflict
        assert capture(alias, 2, idempotency_key="order-1").id == theirs.id
    assert theirs.id != mine.id
    assert rows(alias).count() == 2


# -- legacy rows ------------------------------------------------------------------------------
@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_row_written_before_rows_carried_a_deployment_is_pushed_by_any_relay(alias, other):
    """A row whose deployment is "" (every row the upgrade's migration found, and those a
    process of the previous version writes meanwhile: the column's database default) is
    pushed by whichever relay runs first, as before the upgrade: none is stranded."""
    from outbox.sending.capture import relay

    with on(django_settings.REDIS_URL):
        old = capture(alias, 1, ordering_key="k")
    rows(alias).filter(id=old.id).update(deployment="")
    with on(other.url):
        new = capture(alias, 2, ordering_key="k")
        assert relay(alias, older_than=0) == 2  # the legacy row first, in its key's order
        assert in_redis(old.id) and in_redis(new.id)
        assert outbox.get(old.id).order_seq == 1 and outbox.get(new.id).order_seq == 2
    assert not rows(alias).exists()


@pytest.mark.django_db(databases=["default"])
def test_the_database_default_makes_a_row_written_without_the_column_legacy():
    from django.db import connection

    from outbox.models import CapturedMessage

    table = connection.ops.quote_name(CapturedMessage._meta.db_table)
    with connection.cursor() as cursor:  # as the previous version's INSERT: no deployment column
        cursor.execute(
            f"INSERT INTO {table} (id, destination, fingerprint, body, record, created_at) "
            "VALUES ('m-old', 'mem', '', %s, '{}', 0)",
            [b""],
        )
    assert rows("default").get(id="m-old").deployment == ""


# -- the identity -----------------------------------------------------------------------------
@pytest.mark.django_db(databases=["default"])
def test_a_captured_row_carries_its_deployments_identity(other):
    from outbox.sending import deployment

    with on(other.url):
        m = capture("default", 1)
        assert rows("default").get(id=m.id).deployment == deployment.current()


def test_the_identity_is_the_redis_address_and_prefix_normalised(other):
    from outbox.sending.deployment import current, describe

    port = other.port
    with on(f"redis://127.0.0.1:{port}/0"):
        base = current()
        assert describe() == f"redis://localhost:{port}/0 prefix=outbox"
        assert base.startswith("auto-") and len(base) == 21
    for same in (f"redis://localhost:{port}", f"redis://LOCALHOST.:{port}/0", f"redis://[::1]:{port}"):
        with on(same):
            assert current() == base, same
    for url, extra in (
        (f"redis://127.0.0.1:{port}/1", {}),  # another database
        (f"redis://127.0.0.1:{port + 1}/0", {}),  # another server
        (f"redis://10.0.0.7:{port}/0", {}),  # another host
        (f"redis://127.0.0.1:{port}/0", {"KEY_PREFIX": "staging"}),  # another prefix
    ):
        with on(url, **extra):
            assert current() != base, (url, extra)
    with on("unix:///tmp/redis.sock?db=2"):
        assert describe() == "unix:///tmp/redis.sock/2 prefix=outbox"


def test_a_cluster_is_its_startup_nodes_in_any_order():
    from outbox.sending.deployment import current, describe

    def cluster(*nodes: str) -> override_settings:
        return override_settings(
            OUTBOX={**django_settings.OUTBOX, "CLUSTER": {"NODES": list(nodes)}, "PARTITIONS": 16}
        )

    with cluster("redis://10.0.0.2:7000", "redis://10.0.0.1:7000", "redis://10.0.0.1:7000"):
        assert describe() == "cluster://10.0.0.1:7000,10.0.0.2:7000 prefix=outbox"
        base = current()
    with cluster("rediss://10.0.0.1:7000", "rediss://10.0.0.2:7000"):
        assert current() == base
    with cluster("10.0.0.1:7000", "10.0.0.3:7000"):
        assert current() != base


def test_a_named_deployment_is_its_name_and_a_bad_name_is_refused(other):
    from outbox.sending.deployment import current

    with on(other.url, DEPLOYMENT="shop-prod.eu:1"):
        assert current() == "shop-prod.eu:1"
    with on(django_settings.REDIS_URL, DEPLOYMENT="shop-prod.eu:1"):
        assert current() == "shop-prod.eu:1"  # one name, whatever the address
    for bad in ("", "with space", "x" * 65, 42):
        with on(other.url, DEPLOYMENT=bad), pytest.raises(ImproperlyConfigured, match="DEPLOYMENT"):
            current()


def test_the_identity_is_the_same_in_another_process():
    """A web process and a worker (or this process after a restart) with the same
    settings agree: nothing random or process-bound goes into the identity."""
    from outbox.sending.deployment import current

    code = "import django; django.setup(); from outbox.sending.deployment import current; print(current())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == current()


# -- stranded rows: seen by the relay, adopted by outbox_recover ------------------------------
@pytest.fixture
def stranded_check():
    """The relay's check for other deployments' rows runs at its next pass, whatever an
    earlier test's relay did."""
    from outbox.sending import stranded

    stranded.reset()
    yield stranded
    stranded.reset()


def age(alias: str, message_id: str, seconds: float) -> None:
    """Make a captured row ``seconds`` old."""
    import time

    rows(alias).filter(id=message_id).update(created_at=time.time() - seconds)


def stranded_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "--adopt-captured" in r.getMessage()]


def recover(*args: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("outbox_recover", *args, stdout=out)
    return out.getvalue()


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_the_relay_warns_once_per_interval_of_another_deployments_old_rows(
    alias, other, caplog, stranded_check, monkeypatch
):
    from outbox.sending import deployment
    from outbox.sending.capture import relay

    a, b = django_settings.REDIS_URL, other.url
    with on(a, DEPLOYMENT="old-address"):
        old = capture(alias, 1)
        young = capture(alias, 2)
        also = capture(alias, 3)
    age(alias, old.id, 3600)
    age(alias, also.id, 700)
    with on(b):
        legacy = capture(alias, 4)
    rows(alias).filter(id=legacy.id).update(deployment="", created_at=0)  # pushed by any relay: not stranded
    with on(b):
        own = deployment.current()
        caplog.clear()
        relay(alias, older_than=0)
        relay(alias, older_than=0)  # within the interval: no second warning
        (warning,) = stranded_warnings(caplog)
        assert "2 captured message(s)" in warning  # the young one is not counted yet
        assert "'old-address'" in warning and repr(own) in warning
        assert "OUTBOX['DEPLOYMENT'] = 'old-address'" in warning
        assert "outbox_recover --adopt-captured old-address" in warning
        assert "oldest waiting 60 min" in warning
        monkeypatch.setattr(stranded_check, "CHECK_INTERVAL", 0.0)  # the interval is over
        relay(alias, older_than=0)
        assert len(stranded_warnings(caplog)) == 2
    assert rows(alias).filter(id__in=[old.id, young.id, also.id], deployment="old-address").count() == 3


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_relay_says_nothing_when_no_other_deployments_row_is_old(alias, other, caplog, stranded_check):
    from outbox.sending.capture import relay

    with on(django_settings.REDIS_URL, DEPLOYMENT="elsewhere"):
        capture(alias, 1)  # fresh: its own relay has time
    with on(other.url):
        relay(alias, older_than=0)
    assert stranded_warnings(caplog) == []


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_adopted_rows_are_pushed_by_this_deployments_relay_and_delivered(alias, other, stranded_check):
    from outbox.sending import deployment
    from outbox.sending.capture import relay
    from outbox.testing import deliver_all

    with on(django_settings.REDIS_URL, DEPLOYMENT="old-address"):
        first = capture(alias, 1, ordering_key="k")
        second = capture(alias, 2, ordering_key="k")
    with on(other.url):
        own = deployment.current()
        dry = recover("--adopt-captured", "old-address", "--dry-run")
        assert "would adopt 2" in dry
        assert rows(alias).filter(deployment="old-address").count() == 2
        out = recover("--adopt-captured", "old-address")
        assert "adopted 2" in out and "'old-address'" in out and repr(own) in out
        assert rows(alias).filter(deployment=own).count() == 2
        assert relay(alias, older_than=0) == 2
        assert in_redis(first.id) and in_redis(second.id)
        assert deliver_all().succeeded == 2
        assert outbox.get(first.id).status == "succeeded"
        assert outbox.get(second.id).order_seq == 2
    assert not rows(alias).exists()


@pytest.mark.django_db(databases=["default"])
def test_adopting_this_deployments_own_rows_or_the_legacy_ones_is_refused(other):
    from django.core.management.base import CommandError

    from outbox.sending import deployment

    with on(other.url):
        with pytest.raises(CommandError, match="this deployment's own"):
            recover("--adopt-captured", deployment.current())
        with pytest.raises(CommandError, match="legacy"):
            recover("--adopt-captured", "")
    with on(other.url, DEPLOYMENT="shop"), pytest.raises(CommandError, match="this deployment's own"):
        recover("--adopt-captured", "shop")


@db
@pytest.mark.parametrize("alias", ALIASES)
def test_a_row_whose_idempotency_key_this_deployment_has_is_left_and_reported(alias, other):
    """Keys are unique per deployment: the old deployment's row of a key this one has
    captured too stays where it is (both rows kept), and the command names it."""
    from outbox.sending import deployment

    with on(django_settings.REDIS_URL, DEPLOYMENT="old-address"):
        taken = capture(alias, 1, idempotency_key="order-1")
        free = capture(alias, 2, idempotency_key="order-2")
        plain = capture(alias, 3)
    with on(other.url):
        own = deployment.current()
        mine = capture(alias, 9, idempotency_key="order-1")
        out = recover("--adopt-captured", "old-address")
        assert "adopted 2" in out
        assert "1 left" in out and taken.id in out
    assert rows(alias).get(id=taken.id).deployment == "old-address"
    assert rows(alias).get(id=mine.id).deployment == own
    assert set(rows(alias).filter(deployment=own).values_list("id", flat=True)) == {
        mine.id,
        free.id,
        plain.id,
    }
