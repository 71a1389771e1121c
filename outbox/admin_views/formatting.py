"""Presenting message content safely: masked headers, pretty bodies, short texts, durations.

Everything returned here is plain text; templates escape it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import overload

from outbox.redaction import is_sensitive_header

MASK = "••••••••"
#: Bytes of a body shown on the detail page; larger bodies are cut (download for all).
BODY_PREVIEW_BYTES = 64 * 1024


def mask_headers(headers: Mapping[str, str]) -> list[tuple[str, str, bool]]:
    """``(name, shown value, masked?)`` per header, sorted by name; the values of
    sensitive headers (:func:`outbox.redaction.is_sensitive_header`: auth, token, secret,
    key, session, password, cookie, signature, credential, private) are replaced by a
    mask that keeps only their length."""
    out = []
    for name in sorted(headers, key=str.lower):
        value = str(headers[name])
        if is_sensitive_header(name):
            out.append((name, f"{MASK} ({len(value)} characters hidden)", True))
        else:
            out.append((name, value, False))
    return out


@dataclass
class BodyPreview:
    """A body as shown on the detail page.

    Attributes:
        text: the text to show (pretty-printed JSON when it parses).
        is_json: True if ``text`` is pretty-printed JSON.
        truncated: True if the body was cut at ``BODY_PREVIEW_BYTES``.
        size: the body's size in bytes.
        binary: True if the body is not valid UTF-8 (shown with replacement characters).
    """

    text: str
    is_json: bool
    truncated: bool
    size: int
    binary: bool


def preview_body(body: bytes, content_type: str, limit: int = BODY_PREVIEW_BYTES) -> BodyPreview:
    """The body as text for display: JSON pretty-printed (when whole), cut at ``limit`` bytes."""
    size = len(body)
    truncated = size > limit
    try:
        body.decode("utf-8")
        binary = False
    except UnicodeDecodeError:
        binary = True
    # A cut through a multi-byte character at the end is dropped, not replaced.
    text = body[:limit].decode("utf-8", errors="replace" if binary else "ignore")
    looks_json = "json" in content_type.lower() or text.lstrip()[:1] in ("{", "[")
    if looks_json and not truncated and not binary:
        try:
            text = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
            return BodyPreview(text, True, False, size, False)
        except ValueError:
            pass
    return BodyPreview(text, False, truncated, size, binary)


def shorten(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@overload
def moment(epoch: float) -> datetime: ...
@overload
def moment(epoch: None) -> None: ...
def moment(epoch: float | None) -> datetime | None:
    """An aware UTC datetime from epoch seconds (None stays None); templates localize it."""
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)


def duration(seconds: float) -> str:
    """A short human duration: ``45s``, ``3m 12s``, ``2h 5m``, ``3d 4h``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {s}s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {m}m"
    days, h = divmod(hours, 24)
    return f"{days}d {h}h"


def safe_content_type(content_type: str) -> str:
    """A content type fit for a response header (else ``application/octet-stream``)."""
    if not content_type or any(c in content_type for c in "\r\n\0") or "/" not in content_type:
        return "application/octet-stream"
    return content_type
