"""outbox.E011: the partition count of a deployment cannot change while it holds messages
(its keys would have other names: every message written before out of sight). Real
Redis and a real cluster; the check reads what the first write recorded."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

import outbox
from outbox.checks import check_redis_safety
from outbox.store import get_repository


def e011() -> list[str]:
    return [e.msg for e in check_redis_safety() if e.id == "outbox.E011"]


def partitions(settings, n: int) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": n}
    get_repository.cache_clear()


def test_an_empty_redis_takes_any_count(settings):
    for n in (1, 16, 4):
        partitions(settings, n)
        assert e011() == []


@pytest.mark.django_db(transaction=True)  # Django 6.1's check runs the model checks on every database
# (JSONField's reads SQLite's features); a transaction test, so that send() writes to Redis, not the capture table
def test_messages_written_with_one_partition_refuse_sixteen(settings):
    partitions(settings, 1)
    outbox.send("mem", {"a": 1})
    assert e011() == []
    partitions(settings, 16)
    (msg,) = e011()
    assert "PARTITIONS'] is 16" in msg and "written with 1 partition" in msg
    with pytest.raises(SystemCheckError, match="outbox.E011"):
        call_command("check")


def test_messages_written_with_sixteen_refuse_another_count_and_one(settings):
    partitions(settings, 16)
    outbox.send("mem", {"a": 1})
    assert e011() == []
    for other in (1, 4):
        partitions(settings, other)
        (msg,) = e011()
        assert f"PARTITIONS'] is {other}" in msg and "written with 16 partition" in msg


def test_on_a_cluster_the_count_is_checked_too(cluster_mode, settings):
    outbox.send("mem", {"a": 1})
    assert e011() == []
    partitions(settings, 32)
    (msg,) = e011()
    assert "written with 16 partition" in msg
