"""Destination state in Redis: health and circuit breaker (``lua/health.lua``), the
operator's pause/resume/disable/enable (``lua/admin.lua``), parked messages put back
(``lua/unpark.lua``) and the probes due (``outbox:probes``). See docs/destinations.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from outbox.store.base import Members, RepositoryBase, ScriptCall, first_of, queue_first
from outbox.store.client.outages import PARTITION_UNAVAILABLE
from outbox.store.keys import Keys
from outbox.store.scripts import field_names, named

#: The latency histogram's buckets per destination and minute: bucket i (0 .. N - 1) counts
#: attempts of at most 2^i ms, bucket N the longer ones. ``lua/health.lua`` gets it as its
#: ``buckets`` input; :mod:`outbox.destinations.health` reads the histogram with it.
LATENCY_BUCKETS = 16

#: The fields of each attempt outcome given to :meth:`MessageRepository.health_args`, in order.
OUTCOME_FIELDS = (
    "destination",
    "kind",
    "ms",
    "code",
    "class",
    "error",
    "retry_after",
    "id",
    "started_at",
    "lease",
    "seq",
)
#: The fields of each destination's breaker settings in the health config JSON, in order
#: (:func:`outbox.destinations.config.breaker_config_json`).
BREAKER_FIELDS = (
    "failures",
    "failure_rate",
    "min_attempts",
    "window",
    "cooldown",
    "max_cooldown",
    "disable_after",
)


class RunMark(NamedTuple):
    """A worker run's part in ``lua/health.lua``: ``token`` ("" = none): with it, an
    outcome whose ``seq`` the run's mark for its destination
    (:meth:`~outbox.store.keys.Keys.counted`) already covers is not counted again (an
    exchange written again after a lost reply or a failed later step); ``horizon``:
    seconds that mark is kept (the lease: no exchange is retried longer); ``sent``: the
    highest ``seq`` an earlier call of the run carried (None: unknown). A destination
    whose outcomes are all numbered above ``sent`` cannot have been counted, so its mark
    is not read (one GET less per destination and exchange)."""

    token: str = ""
    horizon: float = 0.0
    sent: int | None = None


#: No worker run: every outcome counted.
NO_RUN = RunMark()


def health_args(
    keys: Keys,
    channel: str,
    outcomes: Sequence[Sequence[Any]],
    config: str,
    now: float,
    run: RunMark = NO_RUN,
) -> list[Any]:
    """ARGV of ``lua/health.lua`` (its KEYS: ``[keys.probes]``).

    Args:
        keys: the key names (their prefix is the script's).
        channel: Pub/Sub channel for events, or "" for none.
        outcomes: per attempt ``[destination, kind ("s", "r", "p"), duration ms,
            status code (0 = none), error class, error text, retry-after seconds
            (0 = none), message id, started_at (epoch seconds, optional), the claim's
            lease token, seq (the outcome's number in its run, from 1, in the order
            decided; 0 = none)]`` (:data:`OUTCOME_FIELDS`).
        config: JSON destination -> breaker settings (:data:`BREAKER_FIELDS`,
            :func:`outbox.destinations.config.breaker_config_json`).
        now: epoch seconds.
        run: the worker run's token, its mark's horizon and the highest ``seq`` sent
            before (:class:`RunMark`).
    """
    return named(
        prefix=keys.prefix,
        parts=keys.partitions,
        now=repr(now),
        channel=channel,
        config=config,
        config_fields=field_names(BREAKER_FIELDS),
        outcomes=json.dumps(list(outcomes), separators=(",", ":")),
        outcome_fields=field_names(OUTCOME_FIELDS),
        run=run.token,
        horizon=repr(run.horizon),
        buckets=LATENCY_BUCKETS,
        **({} if run.sent is None else {"sent": run.sent}),
    )


def health_keys(keys: Keys, destination: str, config: str, now: float, run: str = "") -> list[str]:
    """With more than one partition, every key ``lua/health.lua`` may touch for the
    outcomes of ``destination`` at ``now`` (epoch seconds), as its KEYS, all in the
    destination's home slot: its state hash, its in-flight grants, its health of this
    minute and its errors of this hour (written), and its health of each minute of its
    breaker's failure-rate window (``config``'s ``window`` seconds, read). Declared so
    that a slot half moved by a legacy migration answers ``TRYAGAIN`` before anything is
    written, instead of the script aborting at the first key that moved ("Script
    attempted to access a non local key"), its earlier writes kept. With a ``run``
    token, also the run's counted mark (:func:`health_args`)."""
    minute, hour = math.floor(now / 60), math.floor(now / 3600)
    values = json.loads(config).get(destination) if config else None
    window = float(values[BREAKER_FIELDS.index("window")]) if values else 0.0
    read = range(minute - math.ceil(window / 60) + 1, minute) if window > 0 else range(0)
    return [
        keys.dest(destination),
        keys.inflight(destination),
        keys.health(destination, minute),
        keys.errors(destination, hour),
        *(keys.health(destination, m) for m in read),
        *([keys.counted(destination, run)] if run else []),
    ]


class DestinationState(RepositoryBase):
    """The destination-state part of :class:`~outbox.store.repository.MessageRepository`."""

    def health_args(
        self, outcomes: Sequence[Sequence[Any]], config: str, now: float, run: RunMark = NO_RUN
    ) -> list[Any]:
        """ARGV of ``lua/health.lua`` for this repository (see :func:`health_args`)."""
        return health_args(self.keys, self.events_channel, outcomes, config, now, run)

    def record_outcomes(self, outcomes: Sequence[Sequence[Any]], config: str, now: float) -> list[str]:
        """Record attempt outcomes in destination health alone (``lua/health.lua``);
        returns the destination events (JSON strings)."""
        if not outcomes:
            return []
        if not self.keys.partitioned:
            reply = self.run_script(
                "health", self.health_args(outcomes, config, now), keys=[self.keys.probes]
            )
            return [e.decode() for e in reply]
        events, _ = self.record_outcomes_by_destination(outcomes, config, now)
        return events

    def record_outcomes_by_destination(
        self, outcomes: Sequence[Sequence[Any]], config: str, now: float, run: RunMark = NO_RUN
    ) -> tuple[list[str], set[str]]:
        """With more than one partition: ``lua/health.lua`` once per destination (its home
        slot, every key it may touch declared: :func:`health_keys`), in one round trip;
        the probe times it returns written to
        ``outbox:{g}:probes``. Returns (the destination events, the destinations that hold
        their messages now). ``run``: as :func:`health_args`.

        Raises:
            redis.exceptions.RedisError: a destination's call failed (see
                :meth:`record_health` for one that reports it instead)."""
        events, holding, failed = self.record_health(outcomes, config, now, run)
        for exc in failed.values():
            raise exc
        return events, holding

    def record_health(
        self,
        outcomes: Sequence[Sequence[Any]],
        config: str,
        now: float,
        run: RunMark = NO_RUN,
    ) -> tuple[list[str], set[str], dict[str, Exception]]:
        """:meth:`record_outcomes_by_destination`, with the destinations whose call met an
        outage (:data:`~outbox.store.client.outages.PARTITION_UNAVAILABLE`: their home slot
        moving, its primary away) reported instead of raised: (events, holding, destination
        -> the error). The other destinations' health is written.

        Raises:
            redis.exceptions.RedisError: a call failed for another reason (a bug), or the
                probe times could not be written."""
        by_dest: dict[str, list[Sequence[Any]]] = {}
        for row in outcomes:
            by_dest.setdefault(str(row[0]), []).append(row)
        names = list(by_dest)
        calls: list[ScriptCall] = [
            (
                "health",
                self.health_args(by_dest[d], config, now, run),
                health_keys(self.keys, d, config, now, run.token),
            )
            for d in names
        ]
        events: list[str] = []
        holding: set[str] = set()
        probes: dict[str, float] = {}
        failed: dict[str, Exception] = {}
        replies = self.run_scripts(calls, errors=True) if calls else []
        for d, reply in zip(names, replies, strict=True):
            if isinstance(reply, Exception):
                if not isinstance(reply, PARTITION_UNAVAILABLE):
                    raise reply  # a bug, not an outage
                failed[d] = reply
                continue
            raw_events, probe_times, held = reply
            events += [e.decode() for e in raw_events]
            holding.update(h.decode() for h in held)
            for i in range(0, len(probe_times), 2):
                probes[probe_times[i].decode()] = float(probe_times[i + 1])
        if probes:  # when the wake check must look at each destination (a key across them)
            self.connection.zadd(self.keys.probes, probes)
        return events, holding, failed

    def unpark(self, destination: str, now: float, batch: int = 1000) -> tuple[int, list[str], int]:
        """Put parked messages of ``destination`` back in their due index as far as its
        gate allows (``lua/unpark.lua``, one call, at most ``batch`` messages).

        Returns:
            (messages moved, queues whose wake-up flag the call set, messages still parked).
        """
        base: dict[str, Any] = {
            "prefix": self.keys.prefix,
            "parts": self.keys.partitions,
            "now": repr(now),
            "destination": destination,
            "batch": batch,
            "wake_ttl_ms": self.wake_ttl_ms,
        }
        if not self.keys.partitioned:
            moved, woken, left, _ = self.run_script(
                "unpark",
                named(**base),
                keys=[self.keys.probes, self.keys.dest(destination), self.keys.parked(destination)],
            )
            return int(moved), [q.decode() for q in woken], int(left)
        return self._unpark_partitioned(destination, now, base)

    def _unpark_partitioned(
        self, destination: str, now: float, base: dict[str, Any]
    ) -> tuple[int, list[str], int]:
        """:meth:`unpark` with more than one partition: the destination's state read from
        its home slot, then ``lua/unpark.lua`` once per partition with that state (all in
        one round trip while its breaker is closed; one partition at a time while a probe
        may go, until one message moved); ``outbox:{g}:probes`` written here from what the
        calls say (the earliest time asked for, or removed when every call says so)."""
        fields = ("admin", "breaker", "next_probe_at", "probe_deadline")
        state = cast(list[bytes | None], self.connection.hmget(self.keys.dest(destination), fields))
        args = named(**base, **{f: (v.decode() if v else "") for f, v in zip(fields, state, strict=True)})
        parked = [self.keys.partition(k).parked(destination) for k in self.keys.partition_numbers()]
        replies: list[Any] = []
        if (state[1] or b"closed") != b"closed":  # a probe may go: one message, the oldest parked
            # the partition whose parked message is due first goes first; empty ones last
            pipe = self.connection.pipeline(transaction=False)
            for key in parked:
                queue_first(pipe, key)
            firsts = [f[1] if (f := first_of(reply)) else float("inf") for reply in pipe.execute()]
            parked = [key for _, key in sorted(zip(firsts, parked, strict=True), key=lambda pair: pair[0])]
            for key in parked:
                replies.append(self.run_scripts([("unpark", args, [key])])[0])
                if int(replies[-1][0]):
                    break
            # the partitions not looked at keep what they hold (one round trip for them all)
            pipe = self.connection.pipeline(transaction=False)
            for key in parked[len(replies) :]:
                pipe.zcard(key)
            replies += [[0, [], n, False] for n in pipe.execute()]
        else:
            replies = self.run_scripts([("unpark", args, [key]) for key in parked])
        moved = sum(int(r[0]) for r in replies)
        left = sum(int(r[2]) for r in replies)
        woken: list[str] = []
        for r in replies:
            woken += [q.decode() for q in r[1] if q.decode() not in woken]
        adds = [float(r[3][1]) for r in replies if r[3] and r[3][0] == b"add"]
        if adds:
            self.connection.zadd(self.keys.probes, {destination: min(adds)})
        elif any(r[3] for r in replies):
            self.connection.zrem(self.keys.probes, destination)
        return moved, self.raise_wake_flags(woken, now), left

    def destination_action(self, destination: str, action: str, now: float, reason: str = "") -> str | None:
        """Pause, resume, disable or enable a destination (``lua/admin.lua``).

        Returns:
            The event published (JSON), or None when the state did not change.
        """
        reply = self.run_script(
            "admin",
            named(
                now=repr(now),
                channel=self.events_channel,
                destination=destination,
                action=action,
                reason=reason,
            ),
            keys=[self.keys.dest(destination)],
        )
        return bytes(reply).decode() if reply else None

    def breakers_not_closed(self, destinations: Sequence[str]) -> list[str]:
        """Those of ``destinations`` whose breaker state is ``open`` or ``half_open`` (one
        HGET each, in one pipeline; each state hash is in its destination's home slot)."""
        if not destinations:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for destination in destinations:
            pipe.hget(self.keys.dest(destination), "breaker")
        states = pipe.execute()
        return [d for d, state in zip(destinations, states, strict=True) if state not in (None, b"closed")]

    def due_probes(self, now: float, limit: int = 100) -> list[str]:
        """Destinations whose parked messages the wake check must look at now (``outbox:probes``)."""
        rows = cast(
            Members,
            self.connection.zrangebyscore(self.keys.probes, "-inf", repr(now), start=0, num=limit),
        )
        return [raw.decode() for raw in rows]
