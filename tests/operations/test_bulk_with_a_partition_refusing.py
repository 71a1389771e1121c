"""Bulk requeue and cancel over 16 partitions (the single test server) while one
partition's call is refused (issue 31, "also check" item 1): the partitions that applied
send their signals and wake their queues; the action still raises the refusal (nothing
of the refused partition changed: the same action again does it). Real Redis; the
refusal is injected at the client (the reply of one partition's call replaced by the
error a slot in flux answers, the other calls run for real)."""

from __future__ import annotations

import pytest
from redis.exceptions import TryAgainError

import outbox
from outbox import events
from outbox.store.keys import partition_of
from outbox.store.messages import MessageStore
from tests.support import hook_settings

PARTITIONS = 16


def refusing(monkeypatch, refused_partition: int) -> list[int]:
    """The ``bulk`` call of ``refused_partition`` answers TRYAGAIN without running (as a
    slot in flux does), once; the other calls of the round trip run and apply."""
    real = MessageStore.run_scripts
    hits: list[int] = []

    def run_scripts(self, calls, client=None, *, errors=False):
        refused = [
            i
            for i, call in enumerate(calls)
            if not hits and call[0] == "bulk" and partition_of(call[1][-1]) == refused_partition
        ]
        if not refused:
            return real(self, calls, client, errors=errors)
        hits.extend(refused)
        others = real(self, [c for i, c in enumerate(calls) if i not in refused], client, errors=True)
        error = TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot")
        replies = iter(others)
        out = [error if i in refused else next(replies) for i in range(len(calls))]
        if not errors:
            for r in out:
                if isinstance(r, Exception):
                    raise r
        return out

    monkeypatch.setattr(MessageStore, "run_scripts", run_scripts)
    return hits


def spread(n: int = 40) -> list:
    """``n`` messages of 'hook' over the partitions."""
    sent = outbox.send_many(
        [{"destination": "hook", "body": i, "idempotency_key": f"s{i}"} for i in range(n)]
    )
    assert len({partition_of(m.id) for m in sent}) > 4
    return sent


def listen(signal, got: list[str]):
    def receiver(sender, message_ids, **kwargs):
        got.extend(message_ids)

    signal.connect(receiver, weak=False)
    return receiver


@pytest.mark.parametrize("action", ["cancel", "requeue"])
def test_the_partitions_that_applied_signal_and_wake_though_one_refused(
    partitioned, receiver, monkeypatch, action
):
    repo = partitioned
    with hook_settings(receiver.url):
        sent = spread()
        if action == "requeue":
            assert outbox.cancel([m.id for m in sent]).acted == len(sent)
        refused_partition = partition_of(sent[0].id)
        repo.connection.delete(*(repo.keys.wake(q) for q in ("outbox", "outbox_high", "outbox_low")))
        signal = events.messages_cancelled if action == "cancel" else events.messages_requeued
        got: list[str] = []
        listener = listen(signal, got)
        try:
            hits = refusing(monkeypatch, refused_partition)
            with pytest.raises(TryAgainError):
                getattr(outbox, action)([m.id for m in sent])
            assert hits, "no partition was refused: the test tested nothing"
        finally:
            signal.disconnect(listener)
    applied = [m.id for m in sent if partition_of(m.id) != refused_partition]
    untouched = [m.id for m in sent if partition_of(m.id) == refused_partition]
    after = "cancelled" if action == "cancel" else "pending"
    assert {outbox.get(i).status for i in applied} == {after}
    assert {outbox.get(i).status for i in untouched} == {"cancelled" if action == "requeue" else "pending"}
    assert sorted(got) == sorted(applied)  # their signal was sent
    if action == "requeue":  # their queue was woken
        assert repo.connection.exists(repo.keys.wake("outbox"))
