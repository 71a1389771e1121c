"""``asend`` on the real cluster under concurrency: the two guards of
``aconnection._cluster_batch`` around ``redis.asyncio``'s ``RedisCluster``, found by the
``cluster`` fault scenario run through ``asend`` (docs/faults.md)."""

from __future__ import annotations

import asyncio

import pytest

import outbox
from outbox.store import get_repository
from outbox.store.client import aconnection
from tests.support.cluster import cluster_settings


@pytest.mark.asyncio
async def test_more_concurrent_asends_than_the_pool_has_connections_all_succeed(
    cluster_mode, redis_cluster, settings
):
    """A node's pool past ``MAX_CONNECTIONS`` raises ``MaxConnectionsError``, which
    redis-py answers by disconnecting that node's connections under the other calls: the
    calls past the bound wait instead."""
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": cluster_settings(redis_cluster, MAX_CONNECTIONS=2)}
    get_repository.cache_clear()
    await outbox.asend(
        "mem", "warm"
    )  # the scripts loaded (a NOSCRIPT reload is the sync client's, in a thread)
    results = await asyncio.gather(
        *(outbox.asend("mem", {"n": n}) for n in range(60)), return_exceptions=True
    )
    assert [r for r in results if not isinstance(r, outbox.Message)] == []
    assert get_repository().count() == 61
    await aconnection.aclose()


@pytest.mark.asyncio
async def test_a_connection_closed_under_a_write_is_an_unknown_outcome_not_an_attribute_error(
    cluster_mode, monkeypatch
):
    async def torn_down(client, commands, on_sent):
        if on_sent is not None:
            on_sent()
        raise AttributeError("'NoneType' object has no attribute 'writelines'")  # redis-py's, seen

    monkeypatch.setattr(aconnection, "_direct_batch", torn_down)
    with pytest.raises(outbox.SendOutcomeUnknown) as raised:
        await outbox.asend("mem", "x")
    monkeypatch.undo()
    assert "closed during the write" in str(raised.value.__cause__)
    (again,) = await outbox.asend_again(raised.value.unknown)
    assert get_repository().count() == 1 and again.id == raised.value.unknown[0].id
    await aconnection.aclose()
