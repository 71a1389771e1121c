"""The records' wire format: how a :class:`~outbox.records.Message` and an
:class:`~outbox.records.Attempt` are written to Redis and read back. The one place that
knows the encodings (``docs/architecture.md``, "Records"):

- the *message record* (what to send): one string, a JSON header line then the body
  (:func:`message_value`, read by :func:`message_header`);
- the *resend record* (delivery state): a flat hash of strings (:func:`resend_fields`),
  the retry budget in its compact form (:func:`outbox.records.pack_retry`);
- a message from both records as redis-py or a Lua script returns them
  (:func:`message_from_redis`, :func:`message_from_flat`);
- an attempt as the JSON of the attempts list (:func:`attempt_json`,
  :func:`attempt_from_json`), and a first success kept inline in the resend record
  (:func:`inline_fields`, :func:`attempt_from_inline`).

Times are written with ``repr`` (a float read back exactly).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from outbox.records import Attempt, Message, Status, pack_retry, unpack_retry

#: json.dumps(..., separators=(",", ":")) without building an encoder per call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
#: (destination, content type) -> the start of a message record's header line, up to its
#: created_at (:func:`message_value`).
_header_heads: dict[tuple[str, str], bytes] = {}

#: Resend-record fields of a success kept inline (:func:`inline_fields`).
INLINE_ATTEMPT_FIELDS = ("ok_at", "ok_ms", "ok_worker", "ok_code", "ok_retry", "ok_detail", "ok_host")
INLINE_VALUE_LIMIT = 64  # bytes: Redis's default hash-max-listpack-value


# -- the message record and the resend record ---------------------------------------
def message_value(message: Message) -> bytes:
    """The message record as Redis keeps it: one string (``SET``), its small fields as a
    JSON object on the first line, then the body's bytes as they are.

    JSON escapes every newline inside a string, so the first ``b"\\n"`` ends the header
    whatever the body holds. The id is the key's own suffix and is not repeated;
    ``headers`` and ``idempotency_key`` are left out when empty.

    A string, not a hash: a hash holding a value over ``hash-max-listpack-value`` (64
    bytes by default, redis.conf) is a hashtable, about 250 bytes more per message than
    this string. Records written by older versions (0.1, and 0.2 snapshots before schema
    3) are hashes of the same fields (0.1's also hold ``id`` and ``headers: "{}"``); every
    reader accepts both (:func:`message_from_redis`).

    A delivery of a published event (``payload_ref`` set) has no body here: its payload
    record holds it once for the event's deliveries in the partition, and its resend
    record holds the reference (:func:`resend_fields`).
    """
    body = b"" if message.payload_ref else message.body
    created = message.created_at
    headers, key = message.headers, message.idempotency_key
    if type(created) is float and math.isfinite(created):
        # without a JSON encoder per message (send(), publish() and every message of
        # send_many and of a fan-out build one): the fixed start once per destination and
        # content type, created_at as json writes a float (float.__repr__), then the
        # headers and key as json writes them when every one is plain text (_plain_tail)
        head = _header_heads.get((message.destination, message.content_type))
        if head is None:
            head = _header_head(message.destination, message.content_type)
        if not (headers or key):
            return head + repr(created).encode() + b"}\n" + body
        tail = _plain_tail(headers, key)
        if tail is not None:
            return head + repr(created).encode() + tail + body
    tail_fields: dict[str, Any] = {"content_type": message.content_type, "created_at": created}
    if headers:
        tail_fields["headers"] = headers
    if key:
        tail_fields["idempotency_key"] = key
    return (
        b'{"destination":'
        + _COMPACT_JSON.encode(message.destination).encode()
        + b","
        + _COMPACT_JSON.encode(tail_fields).encode()[1:]
        + b"\n"
        + body
    )


#: Plain text: printable ASCII but ``"`` and ``\\``, which json.dumps writes between quotes
#: as it is (a pattern); a JSON object's members of such names and values, joined as
#: :func:`_plain_tail` joins them (name ``":"`` value, then ``","`` and the next).
_PLAIN = r"[ !#-\[\]-~]*"
_PLAIN_TEXT = re.compile(_PLAIN)
_PLAIN_MEMBERS = re.compile(f'{_PLAIN}":"{_PLAIN}(?:","{_PLAIN}":"{_PLAIN})*')


def _header_head(destination: str, content_type: str) -> bytes:
    """The start of a message record's header line, through ``"created_at":``; the first
    1,024 (destination, content type) pairs met are kept (a fan-out to 1,000 endpoints
    writes 1,000 of them), the others built each time (about 1 µs)."""
    if _PLAIN_TEXT.fullmatch(destination + content_type) is not None:
        text = '{"destination":"' + destination + '","content_type":"' + content_type + '","created_at":'
    else:
        fixed = _COMPACT_JSON.encode({"destination": destination, "content_type": content_type})
        text = fixed[:-1] + ',"created_at":'
    head = text.encode()
    if len(_header_heads) < 1024:
        _header_heads[(destination, content_type)] = head
    return head


def _plain_tail(headers: dict[str, str] | None, key: str | None) -> bytes | None:
    """The end of a message record's header line after its created_at, from
    ``,"headers":`` through the newline, as :data:`_COMPACT_JSON` writes it, when every
    header name and value and the idempotency key are plain text; else None (the caller
    encodes them with JSON). A published event's deliveries carry two such headers (its id
    and type): byte for byte what the encoder writes (tests/store/test_codec.py), in
    about half its time."""
    tail = b""
    if headers:
        try:
            members = '","'.join([name + '":"' + value for name, value in headers.items()])
        except TypeError:  # a name or value not a str
            return None
        if _PLAIN_MEMBERS.fullmatch(members) is None:
            return None
        tail = b',"headers":{"' + members.encode() + b'"}'
    if key:
        if type(key) is not str or _PLAIN_TEXT.fullmatch(key) is None:
            return None
        tail += b',"idempotency_key":"' + key.encode() + b'"'
    return tail + b"}\n"


def resend_fields(message: Message) -> dict[str, str]:
    """The resend record as a flat hash mapping. Fields at their default are left out:
    None fields, ``retry_count`` 0 (about 15 bytes), and ``send_time`` when it is
    ``created_at``, a message sent without a delay (about 30 bytes). Every reader takes an
    absent ``retry_count`` as 0. ``retry`` holds ``max_retries`` and the retry policy
    (:func:`outbox.records.pack_retry`). ``payload`` is a published event's delivery's
    reference to its payload record (the event id): the scripts that delete or requeue a
    message read it with the fields they read already."""
    # Built field by field (not a full dict filtered afterwards): send() builds one per
    # message, so this is on its fast path.
    m = message
    fields = {"status": m.status, "destination": m.destination}
    if m.retry_count:
        fields["retry_count"] = str(m.retry_count)
    fields["retry"] = pack_retry(m.retry_policy, m.max_retries)
    if m.send_time != m.created_at:
        fields["send_time"] = repr(m.send_time)
    if m.next_attempt_at is not None:
        fields["next_attempt_at"] = repr(m.next_attempt_at)
    if m.last_attempt_at is not None:
        fields["last_attempt_at"] = repr(m.last_attempt_at)
    if m.last_error != "":
        fields["last_error"] = m.last_error
    if m.last_status_code is not None:
        fields["last_status_code"] = repr(m.last_status_code)
    if m.last_error_class != "":
        fields["last_error_class"] = m.last_error_class
    if m.queue != "":
        fields["queue"] = m.queue
    if m.suspect:
        fields["suspect"] = str(m.suspect)
    if m.ordering_key:
        fields["okey"] = m.ordering_key
    if m.order_seq is not None:
        fields["oseq"] = str(m.order_seq)
    if m.order_prev is not None:
        fields["oprev"] = str(m.order_prev)
    if m.order_epoch is not None:
        fields["oepoch"] = m.order_epoch
    if m.payload_ref:
        fields["payload"] = m.payload_ref
    fields["updated_at"] = repr(m.updated_at)
    return fields


def message_from_redis(
    message: bytes | dict[bytes, bytes], resend: dict[bytes, bytes], message_id: str | None = None
) -> Message:
    """Build a message from its two records as redis-py returns them.

    Args:
        message: the message record: the string of :func:`message_value` (or only its
            start, through the header line: the body is then b""), or the hash of a
            record written by an older version (bytes keys).
        resend: the resend record's hash (bytes keys).
        message_id: the id (only 0.1's hash holds it).

    Raises:
        ValueError: a string record without its header line.
    """
    m = message_header(message)
    r = {k.decode(): v.decode() for k, v in resend.items()}
    max_retries, retry_policy = unpack_retry(r)
    return Message(
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
        payload_ref=r.get("payload") or None,
    )


def message_from_flat(message: list[Any], resend: list[bytes]) -> Message:
    """Build a message from a Lua script's reply: ``message`` is ``{id, record}`` (the
    string, or an older version's hash as a flat ``HGETALL``) and ``resend`` a flat
    ``HGETALL``."""
    message_id, record = message
    stored = record if isinstance(record, bytes) else _pairs(record)
    return message_from_redis(stored, _pairs(resend), message_id.decode())


def message_header(message: bytes | dict[bytes, bytes]) -> dict[str, Any]:
    """The message record's fields as plain values (``body`` as bytes, ``headers`` a
    dict, ``created_at`` a float): from :func:`message_value`'s string (or its start,
    through the header line, without the body), or a hash written by an older version.

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


# -- attempts -------------------------------------------------------------------------
def attempt_json(attempt: Attempt) -> str:
    """An attempt as the JSON of the attempts list (``detail``, ``error_class`` and
    ``host`` only when set)."""
    a = attempt
    return json.dumps(
        {
            "started_at": a.started_at,
            "duration_ms": round(a.duration_ms, 3),
            "outcome": a.outcome,
            "status_code": a.status_code,
            "error": a.error,
            "worker": a.worker,
            "retry_count": a.retry_count,
            **({"detail": a.detail} if a.detail else {}),
            **({"error_class": a.error_class} if a.error_class else {}),
            **({"host": a.host} if a.host else {}),
        },
        separators=(",", ":"),
    )


def attempt_from_json(raw: bytes | str) -> Attempt:
    """An attempt from :func:`attempt_json`'s JSON (fields it does not know are left out)."""
    data = json.loads(raw)
    return Attempt(**{k: data.get(k) for k in Attempt.__dataclass_fields__ if k in data})


def inline_fields(attempt: Attempt) -> dict[str, str] | None:
    """An attempt as resend-record fields (``ok_at``, ``ok_ms``, ``ok_worker``, and
    ``ok_code``, ``ok_retry``, ``ok_detail``, ``ok_host`` when set), or None when it is
    not a success or a value is over 64 bytes.

    A message's first success is kept this way instead of on an attempts list (a list of
    one entry costs about 340 bytes of Redis memory; these fields about 90 in the record's
    compact listpack encoding, which holds while every value is at most
    ``hash-max-listpack-value``, 64 bytes by default).
    """
    a = attempt
    if a.outcome != Status.SUCCEEDED.value:
        return None
    fields = {"ok_at": repr(a.started_at), "ok_ms": repr(round(a.duration_ms, 3)), "ok_worker": a.worker}
    if a.status_code is not None:
        fields["ok_code"] = str(a.status_code)
    if a.retry_count:
        fields["ok_retry"] = str(a.retry_count)
    if a.detail:
        fields["ok_detail"] = a.detail
    if a.host:
        fields["ok_host"] = a.host
    if any(len(v.encode()) > INLINE_VALUE_LIMIT for v in fields.values()):
        return None
    return fields


def attempt_from_inline(resend: dict[str, str]) -> Attempt | None:
    """The success kept in a resend record by :func:`inline_fields`, or None."""
    if not resend.get("ok_at"):
        return None
    return Attempt(
        started_at=float(resend["ok_at"]),
        duration_ms=float(resend.get("ok_ms") or 0),
        outcome=Status.SUCCEEDED.value,
        status_code=int(resend["ok_code"]) if resend.get("ok_code") else None,
        worker=resend.get("ok_worker", ""),
        retry_count=int(resend.get("ok_retry") or 0),
        detail=resend.get("ok_detail", ""),
        host=resend.get("ok_host", ""),
    )


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _float(value: str | None) -> float | None:
    return float(value) if value else None
