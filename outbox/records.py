"""The records the outbox keeps, as Python objects: :class:`Message` and :class:`Attempt`.

A message lives in Redis as two hashes (see ``docs/architecture.md``): the *message
record* (what to send) and the *resend record* (delivery state). :class:`Message`
joins both. Times are UTC epoch seconds (float).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


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

    def to_json(self) -> str:
        return json.dumps(
            {
                "started_at": self.started_at,
                "duration_ms": round(self.duration_ms, 3),
                "outcome": self.outcome,
                "status_code": self.status_code,
                "error": self.error,
                "worker": self.worker,
                "retry_count": self.retry_count,
                **({"detail": self.detail} if self.detail else {}),
                **({"error_class": self.error_class} if self.error_class else {}),
                **({"host": self.host} if self.host else {}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Attempt:
        data = json.loads(raw)
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__ if k in data})

    def inline_fields(self) -> dict[str, str] | None:
        """This attempt as resend-record fields (``ok_at``, ``ok_ms``, ``ok_worker``, and
        ``ok_code``, ``ok_retry``, ``ok_detail``, ``ok_host`` when set), or None when it
        is not a success or a value is over 64 bytes.

        A message's first success is kept this way instead of on an attempts list (a
        list of one entry costs about 340 bytes of Redis memory; these fields about 90
        in the record's compact listpack encoding, which holds while every value is at
        most ``hash-max-listpack-value``, 64 bytes by default).
        """
        if self.outcome != Status.SUCCEEDED.value:
            return None
        fields = {
            "ok_at": repr(self.started_at),
            "ok_ms": repr(round(self.duration_ms, 3)),
            "ok_worker": self.worker,
        }
        if self.status_code is not None:
            fields["ok_code"] = str(self.status_code)
        if self.retry_count:
            fields["ok_retry"] = str(self.retry_count)
        if self.detail:
            fields["ok_detail"] = self.detail
        if self.host:
            fields["ok_host"] = self.host
        if any(len(v.encode()) > INLINE_VALUE_LIMIT for v in fields.values()):
            return None
        return fields

    @classmethod
    def from_inline(cls, resend: dict[str, str]) -> Attempt | None:
        """The success kept in a resend record by :meth:`inline_fields`, or None."""
        if not resend.get("ok_at"):
            return None
        return cls(
            started_at=float(resend["ok_at"]),
            duration_ms=float(resend.get("ok_ms") or 0),
            outcome=Status.SUCCEEDED.value,
            status_code=int(resend["ok_code"]) if resend.get("ok_code") else None,
            worker=resend.get("ok_worker", ""),
            retry_count=int(resend.get("ok_retry") or 0),
            detail=resend.get("ok_detail", ""),
            host=resend.get("ok_host", ""),
        )


#: Resend-record fields of a success kept inline (:meth:`Attempt.inline_fields`).
INLINE_ATTEMPT_FIELDS = ("ok_at", "ok_ms", "ok_worker", "ok_code", "ok_retry", "ok_detail", "ok_host")
INLINE_VALUE_LIMIT = 64  # bytes: Redis's default hash-max-listpack-value


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
            process, so a message that ends its worker is singled out and takes no
            batch mates with it. A dead letter that was lost alone keeps the mark.
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

    # -- Redis encoding -------------------------------------------------------------
    def message_value(self) -> bytes:
        """The message record as Redis keeps it: one string (``SET``), its small fields as
        a JSON object on the first line, then the body's bytes as they are.

        JSON escapes every newline inside a string, so the first ``b"\\n"`` ends the
        header whatever the body holds. The id is the key's own suffix and is not
        repeated; ``headers`` and ``idempotency_key`` are left out when empty.

        A string, not a hash: a hash holding a value over ``hash-max-listpack-value``
        (64 bytes by default, redis.conf) is a hashtable, about 250 bytes more per message
        than this string. Records written by older versions (0.1, and 0.2 snapshots
        before schema 3) are hashes of the same fields (0.1's also hold ``id`` and
        ``headers: "{}"``); every reader accepts both (:meth:`from_redis`).
        """
        header: dict[str, Any] = {
            "destination": self.destination,
            "content_type": self.content_type,
            "created_at": self.created_at,
        }
        if self.headers:
            header["headers"] = self.headers
        if self.idempotency_key:
            header["idempotency_key"] = self.idempotency_key
        return _COMPACT_JSON.encode(header).encode() + b"\n" + self.body

    def resend_fields(self) -> dict[str, str]:
        """The resend record as a flat hash mapping. Fields at their default are left
        out: None fields, ``retry_count`` 0 (about 15 bytes), and ``send_time`` when it
        is ``created_at``, a message sent without a delay (about 30 bytes). Every reader
        takes an absent ``retry_count`` as 0. ``retry`` holds ``max_retries`` and the
        retry policy (:func:`pack_retry`)."""
        # Built field by field (not a full dict filtered afterwards): send() builds one
        # per message, so this is on its fast path.
        fields = {"status": self.status, "destination": self.destination}
        if self.retry_count:
            fields["retry_count"] = str(self.retry_count)
        fields["retry"] = pack_retry(self.retry_policy, self.max_retries)
        if self.send_time != self.created_at:
            fields["send_time"] = repr(self.send_time)
        if self.next_attempt_at is not None:
            fields["next_attempt_at"] = repr(self.next_attempt_at)
        if self.last_attempt_at is not None:
            fields["last_attempt_at"] = repr(self.last_attempt_at)
        if self.last_error != "":
            fields["last_error"] = self.last_error
        if self.last_status_code is not None:
            fields["last_status_code"] = repr(self.last_status_code)
        if self.last_error_class != "":
            fields["last_error_class"] = self.last_error_class
        if self.queue != "":
            fields["queue"] = self.queue
        if self.suspect:
            fields["suspect"] = str(self.suspect)
        if self.ordering_key:
            fields["okey"] = self.ordering_key
        if self.order_seq is not None:
            fields["oseq"] = str(self.order_seq)
        if self.order_prev is not None:
            fields["oprev"] = str(self.order_prev)
        if self.order_epoch is not None:
            fields["oepoch"] = self.order_epoch
        fields["updated_at"] = repr(self.updated_at)
        return fields

    @classmethod
    def from_redis(
        cls,
        message: bytes | dict[bytes, bytes],
        resend: dict[bytes, bytes],
        message_id: str | None = None,
    ) -> Message:
        """Build a message from its two records as redis-py returns them.

        Args:
            message: the message record: the string of :meth:`message_value` (or only
                its start, through the header line: the body is then b""), or the hash
                of a record written by an older version (bytes keys).
            resend: the resend record's hash (bytes keys).
            message_id: the id (only 0.1's hash holds it).

        Raises:
            ValueError: a string record without its header line.
        """
        m = message_header(message)
        r = {k.decode(): v.decode() for k, v in resend.items()}
        max_retries, retry_policy = unpack_retry(r)
        return cls(
            id=message_id if message_id is not None else m["id"],
            destination=m["destination"],
            body=m.get("body", b""),
            content_type=m.get("content_type", ""),
            headers=m.get("headers") or {},
            created_at=float(m.get("created_at", 0.0)),
            idempotency_key=m.get("idempotency_key") or None,
            status=r.get("status", ""),
            retry_count=int(r.get("retry_count", "0")),
            max_retries=max_retries,
            retry_policy=retry_policy,
            send_time=float(r["send_time"]) if r.get("send_time") else float(m.get("created_at", 0.0)),
            next_attempt_at=_float(r.get("next_attempt_at")),
            last_attempt_at=_float(r.get("last_attempt_at")),
            last_error=r.get("last_error", ""),
            last_status_code=int(r["last_status_code"]) if r.get("last_status_code") else None,
            last_error_class=r.get("last_error_class", ""),
            queue=r.get("queue", ""),
            updated_at=float(r.get("updated_at", "0")),
            job_id=r.get("job_id", ""),
            lease=r.get("lease", ""),
            suspect=int(r.get("suspect") or 0),
            ordering_key=r.get("okey") or None,
            order_seq=int(r["oseq"]) if r.get("oseq") else None,
            order_prev=int(r["oprev"]) if r.get("oprev") else None,
            order_epoch=r.get("oepoch") or None,
        )

    def to_record(self) -> str:
        """Every field but ``body``, as JSON (the database capture's ``record`` column)."""
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "body"}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_record(cls, record: str, body: bytes | memoryview) -> Message:
        """The message from :meth:`to_record`'s JSON and its body (bytes, or the memoryview a
        BinaryField reads from PostgreSQL)."""
        data = json.loads(record)
        return cls(body=bytes(body), **{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_flat(cls, message: list[Any], resend: list[bytes]) -> Message:
        """Build a message from a Lua script's reply: ``message`` is ``{id, record}`` (the
        string, or an older version's hash as a flat ``HGETALL``) and ``resend`` a flat
        ``HGETALL``."""
        message_id, record = message
        stored = record if isinstance(record, bytes) else _pairs(record)
        return cls.from_redis(stored, _pairs(resend), message_id.decode())


def message_header(message: bytes | dict[bytes, bytes]) -> dict[str, Any]:
    """The message record's fields as plain values (``body`` as bytes, ``headers`` a
    dict, ``created_at`` a float): from :meth:`Message.message_value`'s string (or its
    start, through the header line, without the body), or a hash written by an older
    version.

    Raises:
        ValueError: a string without a complete header line.
    """
    if isinstance(message, bytes):
        header, newline, body = message.partition(b"\n")
        if not newline:
            raise ValueError("a message record without its header line")
        fields: dict[str, Any] = json.loads(header)
        fields["body"] = body
        return fields
    fields = {k.decode(): v.decode() for k, v in message.items() if k != b"body"}
    fields["body"] = message.get(b"body", b"")
    fields["headers"] = json.loads(fields.get("headers") or "{}")
    return fields


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


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _float(value: str | None) -> float | None:
    return float(value) if value else None


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
