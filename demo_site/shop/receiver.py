"""The demo's flaky webhook receiver, and its counters in Redis.

``POST /receiver/<name>`` is where the ``orders`` destination delivers. It

1. verifies the Standard Webhooks signature with ``standardwebhooks.Webhook(secret).verify``
   (HTTP 401 when it does not match, or headers are missing or too old);
2. sleeps 1 to 2 seconds for a fraction ``DEMO_SLOW_RATE`` of requests (default 2 %);
3. answers HTTP 500 for a fraction ``DEMO_FAILURE_RATE`` of requests (default 30 %);
4. otherwise records the ``webhook-id`` (the outbox message id) in a Redis set of accepted
   ids and answers 200. An id accepted twice is counted as a duplicate delivery.

``GET /receiver/<name>`` returns the running totals as JSON.

State lives in Redis (so several server processes count together) under
``DEMO_RECEIVER_PREFIX`` (``demo:receiver``), apart from the outbox's keys. Per-id
counters let ``outbox_demo`` count exactly the messages of its own run.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from redis import Redis
from standardwebhooks import Webhook

logger = logging.getLogger("demo_site.receiver")

KEY_TTL = 24 * 3600  # seconds the receiver's keys live after their last write
CHUNK = 1000  # ids per pipelined read
PER_ID = ("requests", "errors", "slow", "duplicates")  # per-id counters (hashes id -> count)
TOTALS = ("requests", "errors", "slow", "accepted", "duplicates", "bad_signature")


def get_redis() -> Redis:
    """The Redis client of the outbox's django-redis cache alias (``OUTBOX["REDIS_ALIAS"]``,
    ``REDIS_URL`` in the demo): the demo receiver keeps its counters there under
    ``DEMO_RECEIVER_PREFIX``."""
    from django_redis import get_redis_connection

    from outbox.conf import outbox_settings

    return get_redis_connection(outbox_settings.REDIS_ALIAS)


@dataclass
class ReceiverStore:
    """The counters of one receiver name in Redis.

    Keys, for prefix ``demo:receiver`` and name ``orders``: ``demo:receiver:orders:accepted``
    (set of ids answered 2xx), ``...:requests``/``errors``/``slow``/``duplicates`` (hashes
    id -> count), ``...:totals`` (hash of the counters in :data:`TOTALS`). Redis errors propagate.
    """

    connection: Redis
    name: str = "orders"
    prefix: str = "demo:receiver"

    @classmethod
    def from_settings(cls, name: str = "orders") -> ReceiverStore:
        return cls(get_redis(), name, getattr(settings, "DEMO_RECEIVER_PREFIX", "demo:receiver"))

    def key(self, what: str) -> str:
        return f"{self.prefix}:{self.name}:{what}"

    def count(self, kind: str, message_id: str | None = None) -> None:
        """Count one event of ``kind`` (one of :data:`TOTALS`), per id too when in :data:`PER_ID`."""
        pipe = self.connection.pipeline(transaction=False)
        pipe.hincrby(self.key("totals"), kind, 1)
        pipe.expire(self.key("totals"), KEY_TTL)
        if message_id is not None and kind in PER_ID:
            pipe.hincrby(self.key(kind), message_id, 1)
            pipe.expire(self.key(kind), KEY_TTL)
        pipe.execute()

    def accept(self, message_id: str) -> bool:
        """Record an accepted id. Returns False if it had been accepted before (a duplicate)."""
        pipe = self.connection.pipeline(transaction=False)
        pipe.sadd(self.key("accepted"), message_id)
        pipe.expire(self.key("accepted"), KEY_TTL)
        first = bool(pipe.execute()[0])
        self.count("accepted" if first else "duplicates", message_id)
        return first

    def totals(self) -> dict[str, int]:
        """Running totals since the keys were created (all runs that shared this Redis)."""
        raw = self.connection.hgetall(self.key("totals"))
        values = {k.decode(): int(v) for k, v in raw.items()}
        return {kind: values.get(kind, 0) for kind in TOTALS}

    def accepted_among(self, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` that were answered 2xx at least once."""
        out: set[str] = set()
        for start in range(0, len(ids), CHUNK):
            chunk = list(ids[start : start + CHUNK])
            pipe = self.connection.pipeline(transaction=False)
            for message_id in chunk:
                pipe.sismember(self.key("accepted"), message_id)  # SMISMEMBER needs Redis 6.2
            flags = pipe.execute()
            out.update(i for i, flag in zip(chunk, flags, strict=True) if flag)
        return out

    def counts_for(self, ids: Sequence[str]) -> dict[str, int]:
        """Sums of the per-id counters (:data:`PER_ID`) over ``ids``: this run's share."""
        sums = dict.fromkeys(PER_ID, 0)
        for start in range(0, len(ids), CHUNK):
            chunk = list(ids[start : start + CHUNK])
            pipe = self.connection.pipeline(transaction=False)
            for kind in PER_ID:
                pipe.hmget(self.key(kind), chunk)
            for kind, values in zip(PER_ID, pipe.execute(), strict=True):
                sums[kind] += sum(int(v) for v in values if v)
        return sums


@csrf_exempt
def receive(request: HttpRequest, name: str) -> HttpResponse:
    """The flaky webhook endpoint (see the module docstring). GET returns the totals."""
    store = ReceiverStore.from_settings(name)
    failure_rate = float(getattr(settings, "DEMO_FAILURE_RATE", 0.3))
    slow_rate = float(getattr(settings, "DEMO_SLOW_RATE", 0.02))
    if request.method == "GET":
        return JsonResponse(
            {"name": name, "failure_rate": failure_rate, "slow_rate": slow_rate, **store.totals()}
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    try:
        Webhook(settings.DEMO_WEBHOOK_SECRET).verify(request.body, dict(request.headers), json_parse=False)
    except Exception as exc:  # WebhookVerificationError, or malformed headers that break its parsing
        store.count("bad_signature")
        logger.warning("receiver %s: refused a request: %s", name, exc)
        return JsonResponse({"error": f"signature verification failed: {exc}"}, status=401)
    message_id = request.headers["webhook-id"]
    store.count("requests", message_id)
    if random.random() < slow_rate:
        store.count("slow", message_id)
        low, high = getattr(settings, "DEMO_SLOW_SECONDS", (1.0, 2.0))
        time.sleep(random.uniform(low, high))
    if random.random() < failure_rate:
        store.count("errors", message_id)
        return JsonResponse({"error": "simulated failure (DEMO_FAILURE_RATE)"}, status=500)
    first = store.accept(message_id)
    return JsonResponse({"accepted": message_id, "duplicate": not first})
