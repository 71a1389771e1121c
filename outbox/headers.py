"""Header and content-type rules, in one place: ``send()`` (:mod:`outbox.sending.validation`),
the transports' options and the system checks all use these functions.

What is refused, and why:

* names that are not an RFC 9110 §5.1 ``token`` (matched whole: ``re.fullmatch``, so a
  trailing newline cannot slip past a ``$``);
* framing and hop-by-hop headers (RFC 9110 §7.6.1, RFC 9112 §6 and §9.6):
  ``Transfer-Encoding``, ``Content-Length``, ``Connection``, ``Keep-Alive``, ``Upgrade``,
  ``TE``, ``Trailer``, ``Host`` and every ``Proxy-*``: the HTTP client writes them. A
  message that sets ``Transfer-Encoding: chunked`` next to the client's
  ``Content-Length`` is the setup of request smuggling (RFC 9112 §6.1 forbids both);
* the ``webhook-*`` headers of Standard Webhooks, which the webhook transport writes,
  and the outbox's own ordering headers (:data:`ORDERING_HEADERS`);
* values that hold a control character (CR, LF, NUL, DEL, C1... HTAB is allowed
  inside), or begin or end with whitespace: RFC 9110 §5.5 ``field-value`` has no
  surrounding whitespace, and h11 (httpx) refuses such values at delivery time, so they
  could only be retried until dead;
* for HTTP (the webhook transport, :func:`check_ascii`), values that are not ASCII.
  Email headers may be any Unicode text: Django encodes them (RFC 2047).

Error messages name the header and the problem, never its value (values may be secrets).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from outbox.exceptions import InvalidMessage

#: RFC 9110 §5.6.2 token: the characters of a field name.
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: RFC 9110 §5.5 field-value, ASCII only: visible characters, with SP/HTAB only between them.
FIELD_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20\x09]*[\x21-\x7e])*)?")
#: The same with any non-ASCII character but C1 controls and the Unicode line and
#: paragraph separators allowed (email headers are
#: RFC 2047-encoded by Django; HTTP transports add :func:`check_ascii`).
FIELD_VALUE_TEXT = re.compile(
    r"(?:[^\x00-\x20\x7f-\x9f\u2028\u2029](?:[\x20\x09]*[^\x00-\x20\x7f-\x9f\u2028\u2029])*)?"
)
#: Framing and hop-by-hop headers the HTTP client owns (lower case); ``proxy-*`` too.
HOP_BY_HOP = frozenset(
    {"transfer-encoding", "content-length", "connection", "keep-alive", "upgrade", "te", "trailer", "host"}
)
#: Headers the webhook transport writes itself (Standard Webhooks).
WEBHOOK_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})
#: The outbox's own headers of an ordered message (``send(..., ordering_key=...)``), beside
#: the Standard Webhooks ones: its key, its sequence number in the key, and the sequence
#: of the message of its key delivered before it (absent when none was: the key is new,
#: or its state expired). Cancelled and skipped messages leave gaps in the sequence, so
#: a receiver compares "previous" with the last sequence it processed, not seq - 1.
#: Protocol version 2 adds the key's epoch: an opaque token, the same for every message
#: of one life of the key's state, new when the state restarts at 1 (it expired
#: ``ORDERING_KEY_TTL`` after the key emptied): a receiver keeps (epoch, last sequence
#: processed) per key (docs/concepts.md, "What a receiver keeps"). Messages that joined
#: their key before epochs existed carry neither the epoch nor the version (version 1).
ORDERING_KEY_HEADER = "Outbox-Ordering-Key"
ORDERING_SEQUENCE_HEADER = "Outbox-Ordering-Sequence"
ORDERING_PREVIOUS_HEADER = "Outbox-Ordering-Previous"
ORDERING_EPOCH_HEADER = "Outbox-Ordering-Epoch"
ORDERING_VERSION_HEADER = "Outbox-Ordering-Version"
#: The version of the ordering protocol the outbox speaks (sent with the epoch). It
#: changes only when an older receiver would misread the headers.
ORDERING_VERSION = 2
ORDERING_HEADERS = frozenset(
    h.lower()
    for h in (
        ORDERING_KEY_HEADER,
        ORDERING_SEQUENCE_HEADER,
        ORDERING_PREVIOUS_HEADER,
        ORDERING_EPOCH_HEADER,
        ORDERING_VERSION_HEADER,
    )
)
#: Characters an ordering key keeps as they are in its header: printable ASCII but "%"
#: and the space (percent-encoded, RFC 3986 §2.1, as UTF-8 like every other character).
_KEY_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c != "%")
MAX_HEADERS = 100
MAX_HEADER_BYTES = 8192
MAX_CONTENT_TYPE = 255

# RFC 9110 §8.3.1: media-type = type "/" subtype parameters;
# parameters = *( OWS ";" OWS [ parameter ] ); parameter = token "=" ( token / quoted-string ).
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[\x09\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x09\x20-\x7e])*"'
_OWS = r"[ \t]*"
CONTENT_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:{_OWS};{_OWS}(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*")


def _label(where: str, name: str) -> str:
    """``header 'X-A'`` for send(), ``OPTIONS['headers']['X-A']`` for a destination."""
    return f"header {name!r}" if where == "header" else f"{where}[{name!r}]"


def reserved(name: str) -> bool:
    """True for a header the HTTP client or the webhook transport writes itself."""
    lower = name.lower()
    return (
        lower in HOP_BY_HOP
        or lower in WEBHOOK_HEADERS
        or lower in ORDERING_HEADERS
        or lower.startswith("proxy-")
    )


def ordering_headers(
    ordering_key: str | None, seq: int | None, prev: int | None, epoch: str | None = None
) -> dict[str, str]:
    """The ordering headers of a message (:data:`ORDERING_HEADERS`; none without a key):
    the key percent-encoded where it is not printable ASCII (``%``, the space and
    non-ASCII characters as UTF-8, RFC 3986 §2.1: ``urllib.parse.unquote`` gives it back),
    the sequence and the previous sequence as decimal integers, and with an epoch, the
    epoch and the protocol version (:data:`ORDERING_VERSION`)."""
    if not ordering_key:
        return {}
    headers = {ORDERING_KEY_HEADER: quote(ordering_key, safe=_KEY_SAFE)}
    if seq is not None:
        headers[ORDERING_SEQUENCE_HEADER] = str(seq)
    if prev is not None:
        headers[ORDERING_PREVIOUS_HEADER] = str(prev)
    if epoch:
        headers[ORDERING_EPOCH_HEADER] = epoch
        headers[ORDERING_VERSION_HEADER] = str(ORDERING_VERSION)
    return headers


def check_name(name: Any, where: str = "header") -> str:
    """Check one header name.

    Args:
        name: the name to check.
        where: how errors refer to the header collection (e.g. ``"OPTIONS['headers']"``).

    Returns:
        ``name``.

    Raises:
        InvalidMessage: not a str, not an RFC 9110 token, or a reserved header.
    """
    if not isinstance(name, str) or not TOKEN.fullmatch(name):
        shown = repr(name) if isinstance(name, str) and len(name) <= 60 else f"of type {type(name).__name__}"
        if isinstance(name, str) and len(name) > 60:
            shown = f"{name[:40]!r}..."
        raise InvalidMessage(
            f"{where} name {shown} is not a valid HTTP field name (RFC 9110 §5.1 token)", field="headers"
        )
    if reserved(name):
        raise InvalidMessage(
            f"{_label(where, name)} is set by the HTTP client or the outbox and cannot be given "
            "(framing and hop-by-hop headers, Proxy-*, webhook-*, Outbox-Ordering-*)",
            field="headers",
        )
    return name


def value_problem(value: str, ascii_only: bool = False) -> str | None:
    """What is wrong with a header value, without quoting it, or None when it is fine."""
    if (FIELD_VALUE if ascii_only else FIELD_VALUE_TEXT).fullmatch(value):
        return None
    if ascii_only and not value.isascii():
        return "must be ASCII text (an HTTP field value): percent-encode it, or put it in the body"
    if value != value.strip(" \t"):
        return "must not begin or end with whitespace (RFC 9110 §5.5)"
    for index, char in enumerate(value):
        if char != "\t" and (ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F or char in "\u2028\u2029"):
            return f"must not contain the control character {char!r} (at position {index})"
    return "is not a valid HTTP field value"  # pragma: no cover - every case is named above


def check_value(name: str, value: Any, where: str = "header", ascii_only: bool = False) -> str:
    """Check one header value (RFC 9110 §5.5; ASCII only when ``ascii_only``).

    Raises:
        InvalidMessage: not a str, a control character, surrounding whitespace, or
            (``ascii_only``) a character outside ASCII.
    """
    if not isinstance(value, str):
        raise InvalidMessage(
            f"{_label(where, name)} must have a str value, not {type(value).__name__}", field="headers"
        )
    problem = value_problem(value, ascii_only)
    if problem:
        raise InvalidMessage(f"{_label(where, name)} {problem}", field="headers")
    return value


def clean_headers(
    headers: Mapping[str, str] | None, where: str = "header", ascii_only: bool = False
) -> dict[str, str]:
    """Check a mapping of extra headers; every rule of the module docstring.

    Args:
        headers: name -> value, or None.
        where: how errors refer to the collection (``"header"`` for ``send()``,
            ``"OPTIONS['headers']"`` for a destination).
        ascii_only: refuse non-ASCII values too (HTTP).

    Returns:
        A new dict of the same headers.

    Raises:
        InvalidMessage: not a mapping, a bad name or value, a name given twice
            (case-insensitively), or over 100 headers / 8 KiB in all.
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        label = "headers" if where == "header" else where
        raise InvalidMessage(
            f"{label} must be a dict of str to str, not {type(headers).__name__}", field="headers"
        )
    if len(headers) > MAX_HEADERS:
        raise InvalidMessage(f"at most {MAX_HEADERS} headers, not {len(headers)}", field="headers")
    cleaned: dict[str, str] = {}
    seen: set[str] = set()
    size = 0
    for name, value in headers.items():
        check_name(name, where)
        check_value(name, value, where, ascii_only)
        if name.lower() in seen:
            raise InvalidMessage(
                f"{_label(where, name)} is given twice (names are case-insensitive)", field="headers"
            )
        seen.add(name.lower())
        size += len(name) + len(value.encode("utf-8", "surrogatepass"))
        cleaned[name] = value
    if size > MAX_HEADER_BYTES:
        raise InvalidMessage(f"headers total {size} bytes, over {MAX_HEADER_BYTES}", field="headers")
    return cleaned


def check_ascii(headers: Mapping[str, str], where: str = "header") -> None:
    """Refuse header values that are not ASCII (HTTP carries header values as ASCII text;
    h11 refuses others at delivery time).

    Raises:
        InvalidMessage: a value with a character outside ASCII.
    """
    for name, value in headers.items():
        if not value.isascii():
            raise InvalidMessage(
                f"{_label(where, name)} {value_problem(value, ascii_only=True)}", field="headers"
            )


def clean_content_type(content_type: Any) -> str:
    """Check a MIME type as given to ``send(content_type=...)``.

    Parsed per RFC 9110 §8.3.1 (``type/subtype`` then ``; name=value`` parameters, values
    a token or a quoted string), ASCII only, no control characters (HTAB allowed inside a
    quoted string), no surrounding whitespace, at most 255 characters.

    Raises:
        InvalidMessage: anything else.
    """
    if (
        not isinstance(content_type, str)
        or len(content_type) > MAX_CONTENT_TYPE
        or not CONTENT_TYPE.fullmatch(content_type)
    ):
        shown = repr(content_type)[:80] if isinstance(content_type, str) else type(content_type).__name__
        raise InvalidMessage(
            f"content_type must be an ASCII MIME type like 'application/json; charset=utf-8' "
            f"(RFC 9110 §8.3.1), not {shown}",
            field="content_type",
        )
    return content_type
