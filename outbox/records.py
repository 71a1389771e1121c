"""The records the outbox keeps, as Python objects: :class:`Message` and :class:`Attempt`.

A message lives in Redis as two hashes (see ``docs/architecture.md``): the *message
record* (what to send) and the *resend record* (delivery state). :class:`Message`
joins both. Times are UTC epoch seconds (float). How they are written to Redis and read
back (the wire format) is :mod:`outbox.store.codec`'s; the retry budget's compact JSON
(:func:`pack_retry`) stays here, public since 0.2.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from outbox.forks import renew_lock_after_fork


class Status(str, Enum):
    """Where a message is in its life; see the status machine in ``docs/architecture.md``."""

    PENDING = "pending"  # waiting for its first attempt (or requeued)
    SENDING = "sending"  # claimed by a worker; an attempt is under way
    RETRYING = "retrying"  # an attempt failed; the next one is due at next_attempt_at
    SUCCEEDED = "succeeded"  # delivered
    FAILED = "failed"  # dead letter: permanent error or retries spent; kept and visible
    CANCELLED = "cancelled"  # withdrawn before delivery
    WAITING = "waiting"  # behind the head of its ordering key; becomes pending in its turn

    def __str__(self) -> str:
        return self.value


STATUSES = tuple(s.value for s in Status)
#: Statuses from which a message can still be delivered without a user acting.
ACTIVE_STATUSES = (
    Status.PENDING.value,
    Status.SENDING.value,
    Status.RETRYING.value,
    Status.WAITING.value,
)
#: Statuses a requeue accepts.
REQUEUEABLE_STATUSES = (Status.FAILED.value, Status.CANCELLED.value, Status.SUCCEEDED.value)
#: Statuses a cancel accepts.
CANCELLABLE_STATUSES = (Status.PENDING.value, Status.RETRYING.value, Status.WAITING.value)
#: Statuses a delete accepts (not ``sending``: an attempt is in flight).
DELETABLE_STATUSES = tuple(s for s in STATUSES if s != Status.SENDING.value)


#: json.dumps(..., separators=(",", ":")) without building an encoder per call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

_id_lock = threading.Lock()
_id_state = [0, 0]  # last millisecond, sequence within it

# (a forked child keeps the sequence state: its ids differ from the parent's by their
# random part, new_message_id)
renew_lock_after_fork(sys.modules[__name__], "_id_lock")


#: The end of a message id of a partitioned deployment (``PARTITIONS`` > 1): ``_p`` and
#: the partition's number, e.g. ``msg_0196f0c1a2b300014f60b163a9e2_p17``.
PARTITION_SUFFIX = re.compile(r"_p(\d+)$")


def partition_of(message_id: str) -> int:
    """The partition a message id names (its ``_p<k>`` end), 0 for an id without one (every
    id of a deployment with one partition, and every id written before partitions).

    The partition of a message is part of its id so that every operation finds the
    message from its id alone (``docs/architecture.md``, "Partitions")."""
    match = PARTITION_SUFFIX.search(message_id)
    return int(match.group(1)) if match else 0


def new_message_id(now: float | None = None, partition: int | None = None) -> str:
    """A new message id: ``msg_`` + 12 hex digits of milliseconds + 4 hex digits of a
    sequence within that millisecond + 12 random hex digits, then, when ``partition`` is
    given (a deployment with more than one partition), ``_p`` and the partition's number
    (see :func:`partition_of`).

    Ids sort by creation time, and within one process in creation order (so messages
    sent in the same millisecond are claimed first-in, first-out: the due index orders
    equal due times by id). They are safe in Redis keys, URLs and the Standard Webhooks
    ``webhook-id`` header.
    """
    millis = int((time.time() if now is None else now) * 1000)
    with _id_lock:
        if millis > _id_state[0]:
            _id_state[0], _id_state[1] = millis, 0
            seq = 0
        elif millis == _id_state[0] and _id_state[1] < 0xFFFF:
            _id_state[1] += 1
            seq = _id_state[1]
        else:  # an earlier time (given, or a clock stepped back), or 65,536 ids in one ms
            seq = 0xFFFF
    core = f"msg_{millis:012x}{seq:04x}{os.urandom(6).hex()}"
    return core if partition is None else f"{core}_p{partition}"


def created_at_of(message_id: str) -> float:
    """The creation time (epoch seconds, to the millisecond) encoded in a message id.

    Ids are ``msg_`` + 12 hex digits of milliseconds + random digits (see
    :func:`new_message_id`). Returns 0.0 for an id of another shape.
    """
    try:
        return int(message_id[4:16], 16) / 1000.0
    except ValueError:
        return 0.0


@dataclass
class Attempt:
    """One delivery attempt, as kept in the capped attempts list.

    Attributes:
        started_at: epoch seconds when the transport was called.
        duration_ms: how long the transport took, in milliseconds.
        outcome: ``"succeeded"``, ``"retrying"``, ``"failed"`` or ``"lost"`` (the worker
            died or overran the visibility timeout).
        status_code: the receiver's HTTP status, if any.
        error: the error text (empty on success).
        worker: name of the worker process (host:pid).
        retry_count: the message's retry count after this attempt.
        detail: the transport's note on a success (e.g. an SMTP reply), or "".
        error_class: the kind of failure (:attr:`outbox.exceptions.DeliveryError.error_class`:
            ``"http"``, ``"timeout"``, ``"ConnectError"`` ...), or "" on success.
        host: the host the attempt went to (``api.example.com[:port]``, from the
            destination's settings at attempt time: :attr:`outbox.transports.Transport.host`),
            or "" when the transport names none (and in records written before it existed).
    """

    started_at: float
    duration_ms: float
    outcome: str
    status_code: int | None = None
    error: str = ""
    worker: str = ""
    retry_count: int = 0
    detail: str = ""
    error_class: str = ""
    host: str = ""


@dataclass
class Message:
    """A message with its delivery state: the message record and the resend record joined.

    Attributes:
        id: the message id (see :func:`new_message_id`).
        destination: name of the destination in ``OUTBOX["DESTINATIONS"]``.
        body: the payload, as bytes.
        content_type: MIME type of ``body``.
        headers: extra headers for the transport (name -> value).
        created_at: epoch seconds.
        idempotency_key: the caller's key, or None.
        status: a :class:`Status` value.
        retry_count: retries so far (attempts after the first); a dead letter that spent
            its budget shows ``max_retries``.
        max_retries: retries allowed after the first attempt.
        retry_policy: the resolved policy dict (see :mod:`outbox.retry`).
        send_time: when the first attempt was due (created_at + delay).
        next_attempt_at: when the next attempt is due (pending/retrying), else None.
        last_attempt_at: when the last attempt started, or None.
        last_error: text of the last failure ("" when none).
        last_status_code: HTTP status of the last attempt, or None.
        last_error_class: kind of the last failure (see :class:`Attempt`), or "".
        queue: the django-rq queue its jobs go to.
        updated_at: epoch seconds of the last status change.
        job_id: id of the RQ job that last carried it (written by versions before 0.2,
            whose jobs named messages; today's jobs only wake workers).
        lease: token of the worker's claim while ``sending`` (the visibility-timeout lease).
        suspect: lost attempts since the message last finished an attempt in a live
            worker (0: none). A message taken back from a lost worker is a *suspect*: it
            is attempted alone (the quarantine lane) until an attempt ends in a live
            process, so a message that ends its worker is singled out and takes none of
            the messages claimed with it down with it. A dead letter that was lost alone keeps
            the mark.
        ordering_key: the caller's ordering key (1 to 200 printable characters), or None:
            the messages of one destination with one key are delivered one at a time,
            in the order they were accepted (``docs/concepts.md``, "Ordered delivery").
        order_seq: its sequence number in its ordering key (1, 2, ...), given when Redis
            accepts it; None without a key.
        order_prev: the sequence number of the message of its key delivered before it
            (None: none was, as far as the key's state remembers), set when it becomes
            the head of its key.
        order_epoch: the epoch of its key when it got ``order_seq`` (the key's state's
            generation: a key whose state expired restarts at 1 in a new epoch); None
            without a key, or for a message that joined its key before epochs existed.
        payload_ref: a delivery of a published event (:func:`outbox.publish`): the event
            id naming its payload record, which holds the body once per partition for
            every delivery of the event (``docs/architecture.md``, "Records"); its own
            records hold this reference instead of the body. None for a message of
            ``send()``, whose body is inline. ``body`` is the payload's bytes once read
            (b"" when the payload record is gone).
    """

    id: str
    destination: str
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    idempotency_key: str | None = None
    status: str = Status.PENDING.value
    retry_count: int = 0
    max_retries: int = 0
    retry_policy: dict[str, Any] = field(default_factory=dict)
    send_time: float = 0.0
    next_attempt_at: float | None = None
    last_attempt_at: float | None = None
    last_error: str = ""
    last_status_code: int | None = None
    last_error_class: str = ""
    queue: str = ""
    updated_at: float = 0.0
    job_id: str = ""
    lease: str = ""
    suspect: int = 0
    ordering_key: str | None = None
    order_seq: int | None = None
    order_prev: int | None = None
    order_epoch: str | None = None
    payload_ref: str | None = None

    # -- conveniences -------------------------------------------------------------
    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            ValueError: the body is not JSON.
        """
        return json.loads(self.body)

    @property
    def is_dead_letter(self) -> bool:
        return self.status == Status.FAILED.value

    def fingerprint(self) -> str:
        """What an idempotency key protects: a hash of the content type and body.

        Sending again under the same key with another fingerprint is an
        :class:`~outbox.exceptions.IdempotencyConflict` (as Stripe refuses a reused key
        with other parameters). Headers are left out: they often carry per-call values
        (trace ids). 32 hex digits of SHA-256.
        """
        digest = hashlib.sha256(self.content_type.encode())
        digest.update(b"\n")
        digest.update(self.body)
        return digest.hexdigest()[:32]

    def capture_json(self) -> str:
        """Every field but ``body``, as JSON (the database capture's ``record`` column)."""
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "body"}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_capture_json(cls, record: str, body: bytes | memoryview) -> Message:
        """The message from :meth:`capture_json`'s JSON and its body (bytes, or the memoryview a
        BinaryField reads from PostgreSQL)."""
        data = json.loads(record)
        return cls(body=bytes(body), **{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


_EXPONENTIAL = ("base", "factor", "max_delay", "jitter")


def _compact(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**53 else value


_packed: dict[tuple[Any, ...], str] = {}


def pack_retry(policy: dict[str, Any], max_retries: int) -> str:
    """A message's retry budget and policy as the compact JSON of its resend record's
    ``retry`` field: ``[max_retries, policy]``, the policy as :func:`pack_policy` gives it.

    One field instead of ``max_retries`` and ``retry_policy`` (older versions; both still
    read): about 18 bytes less per message. Results are memoized (a process sees few
    distinct policies).
    """
    try:
        try:  # most policies (exponential) hold only scalars: no conversion needed
            key: tuple[Any, ...] = (max_retries, *policy.items())
            cached = _packed.get(key)
        except TypeError:  # a schedule's list of delays
            key = (max_retries, *((k, tuple(v) if isinstance(v, list) else v) for k, v in policy.items()))
            cached = _packed.get(key)
    except TypeError:  # an unhashable value: pack without the cache
        key, cached = (), None
    if cached is not None:
        return cached
    packed_text = f"[{max_retries},{pack_policy(policy)}]"
    if key and len(_packed) < 1024:
        _packed[key] = packed_text
    return packed_text


def pack_policy(policy: dict[str, Any]) -> str:
    """A retry policy dict as compact JSON.

    ``["e", base, factor, max_delay, jitter]`` for an exponential policy and
    ``["s", [delays...], jitter]`` for a schedule: under 64 bytes for usual policies, so
    Redis keeps the resend hash in its compact listpack encoding (``hash-max-listpack-value``).
    Anything else is the dict itself.
    """
    if policy.get("strategy") == "exponential" and set(policy) == {"strategy", *_EXPONENTIAL}:
        packed: Any = ["e", *(_compact(policy[k]) for k in _EXPONENTIAL)]
    elif policy.get("strategy") == "schedule" and set(policy) == {"strategy", "delays", "jitter"}:
        packed = ["s", [_compact(d) for d in policy["delays"]], policy["jitter"]]
    else:
        packed = policy
    return _COMPACT_JSON.encode(packed)


def unpack_retry(resend: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``(max_retries, policy dict)`` of a resend record: its ``retry`` field
    (:func:`pack_retry`), or an older record's ``max_retries`` and ``retry_policy``."""
    if "retry" in resend:
        max_retries, policy = json.loads(resend["retry"])
        return int(max_retries), _unpack_policy(policy)
    return int(resend.get("max_retries", "0")), unpack_policy(resend.get("retry_policy", "{}"))


def unpack_policy(raw: str | bytes) -> dict[str, Any]:
    """The retry policy dict from :func:`pack_policy`'s JSON (or an older record's dict)."""
    return _unpack_policy(json.loads(raw))


def _unpack_policy(value: Any) -> dict[str, Any]:
    if isinstance(value, list) and value and value[0] == "e" and len(value) == 5:
        return {"strategy": "exponential", **dict(zip(_EXPONENTIAL, value[1:], strict=True))}
    if isinstance(value, list) and value and value[0] == "s" and len(value) == 3:
        return {"strategy": "schedule", "delays": value[1], "jitter": value[2]}
    return value if isinstance(value, dict) else {}


@dataclass
class Outcome:
    """The result of one delivery attempt, before it is written (made by the worker's
    claim loop, :func:`outbox.delivery.loop.attempt`; read by tracing and the outcome
    decision)."""

    message: Message
    started_at: float
    duration_ms: float
    status_code: int | None = None
    error: str = ""
    ok: bool = False
    permanent: bool = False
    retry_after: float | None = None
    detail: str = ""
    error_class: str = ""
    host: str = ""  # the transport's host (Transport.host) at attempt time
