"""Redaction: one function for every text that leaves a transport (delivery errors,
response excerpts, log lines, Pub/Sub events, the admin pages).

A delivery error can carry secrets: h11 quotes a header value it refuses
(``Illegal header value b'Bearer ...'``), and a receiver's error page may echo the
request it got, ``Authorization`` header included. :func:`redact` removes

* every secret given (a destination's webhook ``secret``, an endpoint's secrets, every value of a sensitive
  header of the message and of the destination, credentials in the destination URL),
  also in the escaped forms Python's ``repr`` of str and bytes gives them, and the long
  words of a multi-word value (the token of ``Bearer <token>``);
* values that look like credentials whatever they are: ``Authorization:``/``Cookie:``
  lines, ``Bearer``/``Basic`` tokens, and ``name: value`` / ``name=value`` pairs whose
  name is a sensitive word (``api_key=...``, ``"X-Session-Id": "..."``).

A header name is sensitive (:func:`is_sensitive_header`) when it contains one of the
usual families: ``auth``, ``token``, ``secret``, ``key``, ``session``, ``passw``/``pwd``,
``cookie``, ``signature``, ``credential``, ``private``. The admin masks these values.

Example::

    from outbox.redaction import redact, secrets_for
    text = redact(str(exc), secrets=secrets_for(message.headers, destination_options))
    # or, for a message in a worker:
    text = redact_message_text(str(exc), message)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from outbox.conf import outbox_settings

#: What replaces a secret.
REDACTED = "[REDACTED]"
#: Header (or option) names whose values are secrets: case-insensitive substrings.
SENSITIVE_NAME = re.compile(
    r"auth|token|secret|key|session|passw|pwd|cookie|signature|credential|private", re.I
)
#: Secrets shorter than this are not searched for (they would match ordinary text).
MIN_SECRET_LENGTH = 4
#: Words of a multi-word secret value at least this long are redacted on their own.
MIN_WORD_LENGTH = 8

_KEYWORDS = (
    r"token|secret|password|passwd|pwd|api[-_]?key|apikey|key|session|sessionid|auth|authentication|"
    r"credentials?|signature|private[-_]?key|access[-_]?key"
)
_SEPARATOR = r"""\s*["']?\s*[:=]\s*["']?"""
#: ``Authorization: ...`` / ``Cookie: ...``: everything to the end of the line or quote.
_WHOLE_VALUE = re.compile(rf"(?i)\b((?:proxy-)?authorization|(?:set-)?cookie)({_SEPARATOR})([^\r\n\"']+)")
#: ``Bearer <token>``, ``Basic <base64>`` anywhere.
_SCHEME = re.compile(r"(?i)\b(bearer|basic|digest)(\s+)([A-Za-z0-9._~+/=-]{8,})")
#: ``<sensitive-name>: value`` / ``=value``, the name made of ``-``/``_`` separated words
#: one of which is a sensitive keyword (so ``SMTPAuthenticationError: ...`` is left alone).
_NAMED = re.compile(
    rf"(?i)(?<![\w-])((?:[a-z0-9]+[-_])*(?:{_KEYWORDS})(?:[-_][a-z0-9]+)*)({_SEPARATOR})([^\s\"'&,;<>]+)"
)


def is_sensitive_header(name: str) -> bool:
    """True for a header (or option) name whose value should never be shown."""
    return bool(SENSITIVE_NAME.search(name))


def _variants(secret: str) -> set[str]:
    """The forms a secret takes in error texts: as is, escaped by ``repr`` (str and
    bytes), and its long words (the token of ``Bearer <token>``)."""
    found = {secret, secret.strip()}
    found.add(repr(secret)[1:-1])
    found.add(secret.replace("\\", "\\\\").replace("'", "\\'"))  # as a repr quoting with ' escapes it
    found.add(repr(secret.encode("utf-8", "backslashreplace"))[2:-1])
    words = secret.split()
    if len(words) > 1:
        found.update(w for w in words if len(w) >= MIN_WORD_LENGTH)
    return {v for v in found if len(v) >= MIN_SECRET_LENGTH}


def secrets_for(
    message_headers: Mapping[str, Any] | None, destination_options: Mapping[str, Any] | None
) -> list[str]:
    """The secret strings of one message and its destination.

    Args:
        message_headers: the message's extra headers (name -> value).
        destination_options: the destination's ``OPTIONS`` (may be None or malformed:
            anything unexpected is skipped, never raised).

    Returns:
        The values of the sensitive headers of both, the ``secret`` option (each key
        while rotating, with and without its ``whsec_`` prefix), every other str option
        under a sensitive name, and the password of a ``user:password@`` URL.
    """
    found: list[str] = []

    def headers(mapping: Any) -> None:
        if isinstance(mapping, Mapping):
            found.extend(
                str(v) for k, v in mapping.items() if isinstance(k, str) and is_sensitive_header(k) and v
            )

    headers(message_headers)
    options = destination_options if isinstance(destination_options, Mapping) else {}
    headers(options.get("headers"))
    for name, value in options.items():
        if not isinstance(name, str) or name == "headers" or not is_sensitive_header(name):
            continue
        for item in [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []:
            if isinstance(item, str) and item:
                found.append(item)
                if item.startswith("whsec_"):
                    found.append(item[len("whsec_") :])
    url = options.get("url")
    if isinstance(url, str):
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            found += [password, unquote(password)]
    return found


def redact(text: str, *, secrets: Iterable[str] = (), headers: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret replaced by ``[REDACTED]``.

    Args:
        text: an error message, a response excerpt, a log line...
        secrets: strings to remove wherever they appear (and their escaped forms);
            those under 4 characters are ignored.
        headers: headers whose sensitive values are secrets too (name -> value).

    Returns:
        The redacted text (``text`` itself when nothing matched). Never raises.
    """
    if not text:
        return text
    values: set[str] = set()
    for secret in secrets:
        if isinstance(secret, str):
            values |= _variants(secret)
    if headers:
        for name, value in headers.items():
            if isinstance(name, str) and isinstance(value, str) and is_sensitive_header(name):
                values |= _variants(value)
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    text = _WHOLE_VALUE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _SCHEME.sub(_scheme, text)
    return _NAMED.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


def _scheme(match: re.Match[str]) -> str:
    scheme, space, token = match.groups()
    # "Basic authentication" is prose; a Basic credential is base64 (digits, +, /, =).
    if scheme.lower() == "basic" and not re.search(r"[0-9+/=]", token):
        return match.group(0)
    return scheme + space + REDACTED


#: Functions ``name -> options`` consulted for a destination not in the settings: an
#: endpoint registered at runtime, whose secrets live in the database
#: (:mod:`outbox.destinations.config` registers its cache's copies, so that every text
#: redacted with a worker's destination knows the endpoint's secrets).
_option_sources: list[Callable[[str], Mapping[str, Any]]] = []


def register_options_source(source: Callable[[str], Mapping[str, Any]]) -> None:
    """Have :func:`destination_options` ask ``source(name)`` for destinations not in the
    settings (it must not raise, nor read a database: return ``{}`` when it does not know)."""
    if source not in _option_sources:
        _option_sources.append(source)


def destination_options(name: str) -> Mapping[str, Any]:
    """The ``OPTIONS`` of a configured destination, or of an endpoint registered at
    runtime as a registered source knows it (its secrets, URL, headers), or ``{}``
    (never raises)."""

    try:
        config = outbox_settings.DESTINATIONS.get(name)
        options = config.get("OPTIONS") if isinstance(config, Mapping) else None
        if options is None:
            for source in _option_sources:
                options = source(name) or None
                if options:
                    break
    except Exception:  # malformed settings: redact what the patterns catch
        return {}
    return options if isinstance(options, Mapping) else {}


def redact_message_text(text: str, message: Any) -> str:
    """:func:`redact` with the secrets of ``message`` (a :class:`~outbox.records.Message`)
    and of its destination's settings; what the worker applies to an unexpected
    exception's text before it is recorded, published and logged."""
    return redact(
        text,
        secrets=secrets_for(
            getattr(message, "headers", None), destination_options(getattr(message, "destination", ""))
        ),
    )
