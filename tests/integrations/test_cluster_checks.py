"""The system checks of cluster mode, against real servers: the django-redis alias on a
cluster node (E008), RQ's queues on a cluster node (E009), W001 and E003 when RQ has a
plain Redis of its own beside OUTBOX["CLUSTER"], and the Redis checks of every primary."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outbox.checks import check_outbox_settings, check_redis_safety, check_shared_cache_alias
from outbox.store.client import diagnostics

QUEUES = ("outbox_high", "outbox", "outbox_low")


def ids(messages) -> list[str]:
    return sorted({m.id for m in messages})


def rq_on(url: str) -> dict:
    return {name: {"URL": url} for name in QUEUES}


@pytest.fixture
def rq_beside(cluster_outbox, settings):
    """Cluster mode, RQ's queues on the private single Redis: a deployment as documented
    (with partitions: outbox.E010 refuses one on a cluster)."""
    settings.RQ_QUEUES = rq_on(settings.REDIS_URL)
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 16}
    return cluster_outbox


# -- E008: the alias on a cluster node ----------------------------------------------------


@pytest.mark.django_db  # Django 6.1's check runs the model checks on every database: JSONField's reads SQLite's features
def test_the_alias_on_a_cluster_node_is_an_error_naming_the_cluster_setting(settings, redis_cluster):
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": redis_cluster.url}}
    (error,) = [m for m in check_redis_safety() if m.id == "outbox.E008"]
    assert "'default'" in error.msg and "cluster" in error.msg
    assert "OUTBOX['CLUSTER']" in error.hint and "RQ_QUEUES" in error.hint
    with pytest.raises(SystemCheckError, match="outbox.E008"):
        call_command("check")


def test_the_alias_on_a_single_server_is_no_error(settings):
    assert "outbox.E008" not in ids(check_redis_safety())
    assert diagnostics.inspect_redis().cluster_enabled is False


# -- cluster mode: the outbox's checks ----------------------------------------------------


def test_rq_on_its_own_plain_redis_is_clean(rq_beside):
    # no W001: RQ off the outbox's alias is required here
    assert ids(check_outbox_settings()) == []
    assert check_shared_cache_alias() == []  # no W005: the messages are not in the alias
    assert "outbox.E009" not in ids(check_redis_safety())


@pytest.mark.django_db  # Django 6.1's check runs the model checks on every database: JSONField's reads SQLite's features
def test_rq_queues_on_a_cluster_node_are_an_error_naming_the_fix(cluster_outbox, redis_cluster, settings):
    settings.RQ_QUEUES = rq_on(redis_cluster.url)
    (error,) = [m for m in check_redis_safety() if m.id == "outbox.E009"]
    assert all(repr(q) in error.msg for q in QUEUES) and "RQ cannot run on a cluster" in error.msg
    assert "plain Redis" in error.hint and "URL" in error.hint
    with pytest.raises(SystemCheckError, match="outbox.E009"):
        call_command("check")


def test_rq_on_the_alias_of_a_cluster_node_is_an_error_too(cluster_outbox, redis_cluster, settings):
    settings.CACHES = {**settings.CACHES, "rq": {**settings.CACHES["default"], "LOCATION": redis_cluster.url}}
    settings.RQ_QUEUES = {name: {"USE_REDIS_CACHE": "rq"} for name in QUEUES}
    assert "outbox.E009" in ids(check_redis_safety())


def test_an_rq_redis_that_does_not_answer_is_not_judged(cluster_outbox, settings):
    from outbox.testing import free_port

    settings.RQ_QUEUES = rq_on(f"redis://127.0.0.1:{free_port()}/0")
    assert "outbox.E009" not in ids(check_redis_safety())


def test_every_primary_is_inspected(rq_beside, redis_cluster):
    found = diagnostics.inspect_redis()
    assert found.source == "cluster"
    assert sorted(found.primaries) == sorted(f"{h}:{p}" for h, p in redis_cluster.nodes)
    # the test cluster keeps nothing on disk: each primary says so
    warned = [m for m in check_redis_safety() if m.id == "outbox.W004"]
    assert sorted(w.msg.split("primary ")[1].split(" ")[0] for w in warned) == sorted(found.primaries)


def test_an_unreachable_cluster_is_a_quick_warning(settings):
    from outbox.testing import free_port

    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": {"NODES": [f"redis://127.0.0.1:{free_port()}"]}}
    settings.RQ_QUEUES = rq_on(settings.REDIS_URL)
    assert ids(check_redis_safety()) == ["outbox.W007"]


def test_queues_on_different_connections_warn_in_cluster_mode(rq_beside, settings):
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "outbox_low": {"URL": settings.REDIS_URL + "1"}}
    (warning,) = [m for m in check_outbox_settings() if m.id == "outbox.W001"]
    assert "different connections" in warning.msg and "'outbox_low'" in warning.msg
    assert "plain Redis" in warning.hint


def test_a_missing_queue_says_to_give_it_a_plain_redis(rq_beside, settings):
    settings.RQ_QUEUES = {k: v for k, v in settings.RQ_QUEUES.items() if k != "outbox"}
    (error,) = [m for m in check_outbox_settings() if m.id == "outbox.E003"]
    assert "'outbox'" in error.msg and "'URL'" in error.hint and "plain Redis" in error.hint


def test_the_alias_is_not_required_in_cluster_mode(rq_beside, settings):
    settings.OUTBOX = {**settings.OUTBOX, "REDIS_ALIAS": "missing"}
    assert "outbox.E004" not in ids(check_outbox_settings())


@pytest.mark.parametrize(
    "cluster,text",
    [
        ({"NODES": []}, "OUTBOX['CLUSTER']['NODES'] is required"),
        ({"NODES": ["redis://h:1"], "TIMEOUT": 1}, "unknown key(s) 'TIMEOUT'"),
        ({"NODES": ["redis://h:1"], "OPTIONS": {"colour": 1}}, "'colour'"),
    ],
)
def test_an_invalid_cluster_setting_is_e001(settings, cluster, text):
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": cluster}
    errors = [m for m in check_outbox_settings() if m.id == "outbox.E001"]
    assert any(text in e.msg for e in errors), errors
    assert check_redis_safety() == []  # nothing to inspect until it is valid
