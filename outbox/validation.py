"""Checks and conversions of ``send()`` arguments, done before anything is written.

Every function raises :class:`~outbox.exceptions.InvalidMessage` (a ``ValueError``)
with the argument's name in ``field``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from .conf import PRIORITIES, outbox_settings
from .exceptions import InvalidMessage, MessageTooLarge

# RFC 9110 §5.1 field-name = token; §5.5 field-value: no CR, LF or NUL.
HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
HEADER_VALUE_FORBIDDEN = re.compile(r"[\r\n\x00]")
CONTENT_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(\s*;.*)?$")
#: Headers the webhook transport writes itself (Standard Webhooks); a message may not set them.
RESERVED_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature", "content-length", "host"})
MAX_HEADERS = 100
MAX_HEADER_BYTES = 8192
MAX_IDEMPOTENCY_KEY = 255
MAX_DELAY = 365 * 24 * 3600  # seconds


def encode_body(body: Any, content_type: str | None) -> tuple[bytes, str]:
    """Encode a body for storage.

    bytes stay as they are (``application/octet-stream`` unless told); str is UTF-8
    (``text/plain; charset=utf-8``); anything else is JSON with Django's encoder
    (dates, decimals, UUIDs) as ``application/json``.

    Returns:
        (body bytes, content type).

    Raises:
        InvalidMessage: not JSON-serializable, a bad content type, or larger than
            ``MAX_BODY_BYTES`` (:class:`MessageTooLarge`).
    """
    if content_type is not None and (not isinstance(content_type, str) or not CONTENT_TYPE.match(content_type)):
        raise InvalidMessage(f"content_type must be a MIME type like 'application/json', not {content_type!r}", field="content_type")
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
            data = json.dumps(body, cls=DjangoJSONEncoder, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(f"body cannot be serialized as JSON: {exc}", field="body") from exc
        default_type = "application/json"
    limit = outbox_settings.MAX_BODY_BYTES
    if len(data) > limit:
        raise MessageTooLarge(len(data), limit)
    return data, content_type or default_type


def clean_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Check extra headers: RFC 9110 token names, str values without CR/LF/NUL.

    Raises:
        InvalidMessage: a bad name or value, a reserved name (``webhook-*``,
            ``Content-Length``, ``Host``), or over 100 headers / 8 KiB in all.
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a dict of str to str, not {type(headers).__name__}", field="headers")
    if len(headers) > MAX_HEADERS:
        raise InvalidMessage(f"at most {MAX_HEADERS} headers, not {len(headers)}", field="headers")
    cleaned: dict[str, str] = {}
    size = 0
    for name, value in headers.items():
        if not isinstance(name, str) or not HEADER_NAME.match(name):
            raise InvalidMessage(f"header name {name!r} is not a valid HTTP token (RFC 9110 §5.1)", field="headers")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidMessage(f"header {name!r} is set by the outbox and cannot be given", field="headers")
        if not isinstance(value, str):
            raise InvalidMessage(f"header {name!r} must have a str value, not {type(value).__name__}", field="headers")
        if HEADER_VALUE_FORBIDDEN.search(value):
            raise InvalidMessage(f"header {name!r} value contains CR, LF or NUL", field="headers")
        if name.lower() in {k.lower() for k in cleaned}:
            raise InvalidMessage(f"header {name!r} is given twice (names are case-insensitive)", field="headers")
        size += len(name) + len(value.encode())
        cleaned[name] = value
    if size > MAX_HEADER_BYTES:
        raise InvalidMessage(f"headers total {size} bytes, over {MAX_HEADER_BYTES}", field="headers")
    return cleaned


def clean_idempotency_key(key: str | None) -> str | None:
    """Check an idempotency key: a non-empty str of at most 255 printable characters.

    Raises:
        InvalidMessage: otherwise.
    """
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise InvalidMessage(
            f"idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters, not {key!r}", field="idempotency_key"
        )
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
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay):
        raise InvalidMessage(f"delay must be seconds or a timedelta, not {delay!r}", field="delay")
    if not 0 <= delay <= MAX_DELAY:
        raise InvalidMessage(f"delay must be between 0 and {MAX_DELAY} seconds, not {delay}", field="delay")
    return float(delay)


def clean_priority(priority: str | None) -> str:
    """The django-rq queue name for a priority.

    Raises:
        InvalidMessage: not one of ``high``, ``default``, ``low``.
    """
    if priority is not None and priority not in PRIORITIES:
        raise InvalidMessage(f"priority must be one of {PRIORITIES}, not {priority!r}", field="priority")
    return outbox_settings.queue_name(priority)
