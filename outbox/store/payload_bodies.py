"""The payload bodies of published events a worker process read lately, so that its
claims do not read the same payload record again and again.

A published event's deliveries reference one payload record per partition (``keys.payload``)
and a claim returns the bodies of the records its deliveries reference
(``lua/lib/claimed.lua``). When deliveries spread over many endpoints, claims are small
(about 1.4 deliveries each in ``benchmarks.compare --endpoints``), and each claim read the
whole payload again: 0.73 ``HGET`` a delivery there, a full copy of the payload each time.
A claim is now told which events' bodies the worker holds (``have``: their ids, at most
:data:`HAVE_MOST`, the most recently used first) and returns only the others.

A payload record never changes: it is written once with the event's deliveries, and an
idempotent publish again with another payload is refused (``IdempotencyConflict``); it
is deleted with the last of its deliveries, so no claim names it afterwards. A body is
kept at most :data:`MAX_AGE` seconds (an erasure leaves no copy in a worker's memory for
longer), and the process keeps at most :data:`MAX_BYTES` bytes of bodies
(:data:`MAX_ENTRIES` records), the least recently used dropped first.

Lock-free: each operation is one or two ``dict`` operations, atomic under the GIL; two
threads racing may each drop an entry or count a body's bytes twice for a moment, which
bounds memory loosely, never wrongly answers a read (a key holds the one body its record
has). No lock also means nothing to renew in a forked child (RQ's work horses).
"""

from __future__ import annotations

import time

#: Bytes of bodies a process keeps at most (the sum of their lengths).
MAX_BYTES = 8 * 1024 * 1024
#: Payload records a process keeps at most.
MAX_ENTRIES = 256
#: Seconds a body is kept after it was read from Redis.
MAX_AGE = 60.0
#: Event ids a claim is told about at most (its ``have`` input): a claim's deliveries
#: come from the few events published last, and each name costs some 30 bytes a claim.
HAVE_MOST = 16


class PayloadBodies:
    """Bodies of payload records, by the record's key (``<partition prefix>:payload:<event id>``)."""

    def __init__(self) -> None:
        self._bodies: dict[str, tuple[float, bytes]] = {}
        self._bytes = 0

    def get(self, key: str, now: float | None = None) -> bytes | None:
        """The body of record ``key`` when this process holds it (and made it most
        recently used), else None."""
        entry = self._bodies.pop(key, None)
        if entry is None:
            return None
        if (time.monotonic() if now is None else now) - entry[0] > MAX_AGE:
            self._bytes -= len(entry[1])
            return None
        self._bodies[key] = entry  # to the end: most recently used
        return entry[1]

    def put(self, key: str, body: bytes, now: float | None = None) -> None:
        """Keep ``body`` as record ``key``'s (a body larger than :data:`MAX_BYTES` / 4
        is not kept); drop the least recently used beyond the bounds."""
        if len(body) > MAX_BYTES // 4:
            return
        old = self._bodies.pop(key, None)
        if old is not None:
            self._bytes -= len(old[1])
        self._bodies[key] = ((time.monotonic() if now is None else now), body)
        self._bytes += len(body)
        while self._bodies and (self._bytes > MAX_BYTES or len(self._bodies) > MAX_ENTRIES):
            oldest = next(iter(self._bodies), None)
            dropped = None if oldest is None else self._bodies.pop(oldest, None)
            if dropped is not None:
                self._bytes -= len(dropped[1])

    def held(self, prefix: str, now: float | None = None) -> str:
        """The event ids of the fresh records held whose key starts with ``prefix`` (a
        partition's ``keys.payload("")``), the most recently used first, at most
        :data:`HAVE_MOST`, comma-separated (event ids hold no comma): a claim's ``have``."""
        now = time.monotonic() if now is None else now
        ids: list[str] = []
        for key in reversed(list(self._bodies)):
            entry = self._bodies.get(key)
            if entry is None or now - entry[0] > MAX_AGE or not key.startswith(prefix):
                continue
            ids.append(key[len(prefix) :])
            if len(ids) == HAVE_MOST:
                break
        return ",".join(ids)


__all__ = ["HAVE_MOST", "MAX_AGE", "MAX_BYTES", "MAX_ENTRIES", "PayloadBodies"]
