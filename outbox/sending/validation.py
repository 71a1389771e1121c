"""Checks and conversions of ``send()`` arguments (:class:`SendArguments`), done before
anything is written, and :func:`build_message`, which turns them into a
:class:`~outbox.records.Message`.

Every function raises :class:`~outbox.exceptions.InvalidMessage` (a ``ValueError``)
with the argument's name in ``field``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from outbox import headers as header_rules
from outbox.conf import PRIORITIES, outbox_settings
from outbox.destinations.config import Destination, get_destination, get_transport, validate_max_retries
from outbox.exceptions import InvalidMessage, MessageTooLarge, UnknownDestination
from outbox.records import Message, Status, new_message_id
from outbox.retry import RetryPolicy
from outbox.store.keys import partition_for, random_partition

#: Kept for callers of the old names; the rules live in :mod:`outbox.headers`.
MAX_HEADERS = header_rules.MAX_HEADERS
MAX_HEADER_BYTES = header_rules.MAX_HEADER_BYTES

MAX_IDEMPOTENCY_KEY = 255
#: Characters an ordering key may have at most.
MAX_ORDERING_KEY = 200
MAX_DELAY = 365 * 24 * 3600  # seconds


def shown(value: Any, limit: int = 80) -> str:
    """A short, safe rendering of a refused value for an error message: the repr of a
    str or number cut to ``limit`` characters, else just its type (a repr of arbitrary
    data can be huge, or raise ``RecursionError``)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a very large int"
        return text if len(text) <= limit else text[: limit - 3] + "..."
    if value is None or isinstance(value, bool):
        return repr(value)
    return f"a {type(value).__name__}"


#: One encoder for every body (stateless between calls, so shared by threads): json.dumps
#: with these options would build a new one per call.
_BODY_JSON = DjangoJSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_body(body: Any, content_type: str | None) -> tuple[bytes, str]:
    """Encode a body for storage.

    bytes stay as they are (``application/octet-stream`` unless told); str is UTF-8
    (``text/plain; charset=utf-8``); anything else is JSON with Django's encoder
    (dates, decimals, UUIDs) as ``application/json``.

    Returns:
        (body bytes, content type).

    Raises:
        InvalidMessage: not JSON-serializable (or nested too deeply), a content type
            :func:`outbox.headers.clean_content_type` refuses, or larger than
            ``MAX_BODY_BYTES`` (:class:`MessageTooLarge`).
    """
    if content_type is not None:
        header_rules.clean_content_type(content_type)
    if isinstance(body, (bytes, bytearray, memoryview)):
        data, default_type = bytes(body), "application/octet-stream"
    elif isinstance(body, str):
        try:
            data = body.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise InvalidMessage(f"body is not valid Unicode text: {exc}", field="body") from exc
        default_type = "text/plain; charset=utf-8"
    else:
        try:
            data = _BODY_JSON.encode(body).encode()
        except RecursionError as exc:  # nested deeper than the interpreter's recursion limit
            raise InvalidMessage("body is nested too deeply to be serialized as JSON", field="body") from exc
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidMessage(
                f"body cannot be serialized as JSON: {str(exc)[:200]}", field="body"
            ) from exc
        default_type = "application/json"
    limit = outbox_settings.MAX_BODY_BYTES
    if len(data) > limit:
        raise MessageTooLarge(len(data), limit)
    return data, content_type or default_type


def clean_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Check ``send()``'s extra headers with the rules of :mod:`outbox.headers`.

    Raises:
        InvalidMessage: a bad name or value (never quoted: it may be a secret), a framing,
            hop-by-hop, ``Proxy-*`` or ``webhook-*`` header, or over 100 headers / 8 KiB.
    """
    return header_rules.clean_headers(headers)


def clean_destination(destination: Any) -> str:
    """Check a destination name before it is looked up (a hashable str).

    Raises:
        UnknownDestination: not a str (a list would otherwise raise ``TypeError`` from
            the lookup's cache).
    """
    if not isinstance(destination, str):
        raise UnknownDestination(
            f"destination must be the name (str) of a configured destination, not {type(destination).__name__}",
            field="destination",
        )
    return destination


def clean_idempotency_key(key: str | None) -> str | None:
    """Check an idempotency key: a non-empty str of at most 255 printable characters.

    Raises:
        InvalidMessage: otherwise.
    """
    return _clean_key(key, "idempotency_key", MAX_IDEMPOTENCY_KEY)


def clean_ordering_key(key: str | None) -> str | None:
    """Check an ordering key: a non-empty str of at most 200 printable characters.

    Raises:
        InvalidMessage: otherwise.
    """
    return _clean_key(key, "ordering_key", MAX_ORDERING_KEY)


def _clean_key(key: str | None, name: str, most: int) -> str | None:
    """``key`` (None stays None) if it is a str of 1 to ``most`` printable characters.

    Raises:
        InvalidMessage: otherwise, naming the argument ``name``.
    """
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > most or not key.isprintable():
        raise InvalidMessage(f"{name} must be 1 to {most} printable characters, not {shown(key)}", field=name)
    return key


def clean_delay(delay: float | timedelta | None) -> float:
    """A delay as seconds (number or ``timedelta``), 0 to 365 days.

    Raises:
        InvalidMessage: negative, not finite, too long, or not a number.
    """
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    # An int too large for a float (10**400) must not reach math.isfinite (OverflowError).
    if isinstance(delay, int) and not isinstance(delay, bool) and abs(delay) > 10**15:
        raise InvalidMessage(f"delay must be between 0 and {MAX_DELAY} seconds", field="delay")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay):
        raise InvalidMessage(f"delay must be seconds or a timedelta, not {shown(delay)}", field="delay")
    if not 0 <= delay <= MAX_DELAY:
        raise InvalidMessage(f"delay must be between 0 and {MAX_DELAY} seconds, not {delay}", field="delay")
    return float(delay)


def clean_priority(priority: str | None) -> str:
    """The django-rq queue name for a priority.

    Raises:
        InvalidMessage: not one of ``high``, ``default``, ``low``.
    """
    if priority is not None and priority not in PRIORITIES:
        raise InvalidMessage(f"priority must be one of {PRIORITIES}, not {shown(priority)}", field="priority")
    return outbox_settings.queue_name(priority)


def message_partition(destination: str, key: str | None, partition: int | None = None) -> int | None:
    """The partition of a new message of ``destination`` with ``key``: its ordering key,
    else its idempotency key (None: the deployment has one partition, and ids name none;
    see :func:`build_message`)."""
    partitions = outbox_settings.partitions
    if partitions == 1:
        return None
    if key is not None:
        return partition_for(destination, key, partitions)
    return random_partition(partitions) if partition is None else partition


# not frozen: on every send(), a frozen dataclass's __init__ (ten fields) costs about 0.6 µs
# more (0.76 against 0.18, measured); nothing changes one after it is made
@dataclass(slots=True)
class SendArguments:
    """The arguments of ``send()`` that make its message, as the caller gave them (not
    yet validated: :func:`build_message` does that), in ``send()``'s order; see
    :func:`outbox.send` for each. ``send_many`` items are dicts of these names.

    ``destination`` may be a :class:`~outbox.destinations.Destination` already looked up
    and checked by the caller (``outbox.publish``, for an endpoint): no lookup, and its
    transport's ``check_message`` is the caller's to apply.
    """

    destination: str | Destination
    body: Any
    content_type: str | None = None
    headers: Mapping[str, str] | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    max_retries: int | None = None
    retry: Mapping[str, Any] | Sequence[float] | None = None
    delay: float | timedelta | None = None
    priority: str | None = None


def build_message(given: SendArguments, now: float | None = None, partition: int | None = None) -> Message:
    """Validate ``send()`` arguments and build the message, without writing it.

    With more than one partition (``OUTBOX["PARTITIONS"]``), the message's id names its
    partition: the one its destination and ordering key (else idempotency key) map to
    (:func:`~outbox.store.keys.partition_for`), else ``partition`` (``send_many`` gives
    the messages of a call without a key one partition, so they are written together),
    else one at random. ``now``: the message's creation time (None: the time now).

    Raises:
        InvalidMessage: any argument is invalid (see :func:`send`).
    """
    destination = given.destination
    resolved = destination if isinstance(destination, Destination) else None
    dest = resolved or get_destination(clean_destination(destination))
    data, ctype = encode_body(given.body, given.content_type)
    max_retries = given.max_retries
    if max_retries is None:
        max_retries = dest.max_retries
    else:
        try:
            validate_max_retries(max_retries, "max_retries")
        except ValueError as exc:
            raise InvalidMessage(str(exc), field="max_retries") from exc
    try:
        policy = RetryPolicy.from_value(given.retry, default=dest.retry_policy)
    except ValueError as exc:
        raise InvalidMessage(f"retry: {exc}", field="retry") from exc
    headers = clean_headers(given.headers)
    if resolved is None:
        get_transport(dest.name).check_message(data, ctype, headers)
    now = time.time() if now is None else now
    send_time = now + clean_delay(given.delay)
    idempotency_key = clean_idempotency_key(given.idempotency_key)
    ordering_key = clean_ordering_key(given.ordering_key)
    return Message(
        id=new_message_id(now, message_partition(dest.name, ordering_key or idempotency_key, partition)),
        destination=dest.name,
        body=data,
        content_type=ctype,
        headers=headers,
        created_at=now,
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
        status=Status.PENDING.value,
        retry_count=0,
        max_retries=max_retries,
        retry_policy=policy.to_dict(),
        send_time=send_time,
        next_attempt_at=send_time,
        queue=clean_priority(given.priority),
        updated_at=now,
    )
