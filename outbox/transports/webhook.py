"""HTTP webhooks, signed per the Standard Webhooks specification.

Each delivery is an HTTP POST of the message body with::

    Content-Type:       the message's content type
    webhook-id:         the message id (stable across retries, so receivers can deduplicate)
    webhook-timestamp:  epoch seconds of this attempt
    webhook-signature:  v1,<base64 HMAC-SHA256 of "id.timestamp.body"> (when a secret is set)

signed with the ``standardwebhooks`` package (https://www.standardwebhooks.com/).
Receivers verify with ``standardwebhooks.Webhook(secret).verify(body, headers)``.

Options:

* ``url`` (str, required): ``http://`` or ``https://`` address.
* ``secret`` (str, or a list of str while rotating keys): ``whsec_`` + base64 of a key of
  at least 24 bytes, as Standard Webhooks defines (the bare base64 is accepted too).
  With a list, each request carries one signature per secret, space-separated, so
  receivers holding either key verify it. No signature without a secret; an empty
  string is refused rather than taken as "unsigned".
* ``timeout`` (seconds, default 10): read/write/pool timeout; ``connect_timeout`` (default 5).
* ``headers`` (dict): fixed extra headers for every request; a message's own headers
  override them (names compare case-insensitively). ``Content-Type`` cannot be set
  this way: it is the message's content type. Header values must be ASCII (a message
  with a non-ASCII header value is refused by ``send()``).
* ``retry_statuses`` (list of int): the 4xx statuses that are retried; the list replaces
  the default 408, 409, 425, 429. Every other 4xx fails at once (permanent);
  5xx, 3xx and network errors or timeouts are retried.
* ``verify`` (bool, or the path of a CA bundle file; default True): check TLS certificates.

Connections are reused across deliveries in one worker process (an ``httpx.Client`` pool;
a forked child opens its own). A ``Retry-After`` header on a failed response (seconds or
an HTTP date, RFC 9110 §10.2.3) sets the least wait before the next attempt. At most
:data:`MAX_RESPONSE_BYTES` of a response body are read, so an endless or huge response
cannot hold a worker.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import ssl
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured
from standardwebhooks import Webhook

from .. import __version__
from ..exceptions import DeliveryError, InvalidMessage
from ..records import Message
from ..validation import clean_headers
from .base import DeliveryResult, Transport

DEFAULT_RETRY_STATUSES = (408, 409, 425, 429)
RESPONSE_EXCERPT = 200  # characters of a failed response body kept in the error
MAX_RESPONSE_BYTES = 64 * 1024  # bytes of a response body read at most
MIN_SECRET_BYTES = 24  # Standard Webhooks: keys of 24 to 64 bytes
SECRET_PREFIX = "whsec_"
_DELAY_SECONDS = re.compile(r"[0-9]+")  # RFC 9110 delay-seconds = 1*DIGIT (ASCII only)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value (RFC 9110 §10.2.3).

    Args:
        value: the header value: delay-seconds (ASCII digits) or an HTTP date
            (IMF-fixdate, or the obsolete RFC 850 and asctime forms, taken as GMT).
        now: epoch seconds that a date is measured from (the clock when None).

    Returns:
        Seconds (>= 0; a date in the past gives 0.0), or None when the value is absent
        or not a valid delay. Never raises.
    """
    if not value:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(0.0, seconds)


def _signers(secret: Any, where: str) -> list[Webhook]:
    """Standard Webhooks signers for the ``secret`` option (one per key while rotating).

    Raises:
        ImproperlyConfigured: not a str (or list of str) of ``whsec_`` + base64 of 24+ bytes.
    """
    secrets = [secret] if isinstance(secret, str) else secret
    if not isinstance(secrets, (list, tuple)) or not secrets:
        raise ImproperlyConfigured(
            f"{where}: OPTIONS['secret'] must be a 'whsec_<base64>' str or a list of them, not {secret!r}"
        )
    signers = []
    for item in secrets:
        if not isinstance(item, str) or not item:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['secret'] must be a non-empty 'whsec_<base64>' str, not {item!r} "
                "(leave the option out to send unsigned webhooks)"
            )
        encoded = item[len(SECRET_PREFIX) :] if item.startswith(SECRET_PREFIX) else item
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['secret'] is not 'whsec_' + base64 ({exc}); generate one with "
                "'whsec_' + base64.b64encode(os.urandom(32)).decode()"
            ) from exc
        if len(key) < MIN_SECRET_BYTES:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['secret'] decodes to {len(key)} bytes; Standard Webhooks keys have "
                f"{MIN_SECRET_BYTES} to 64 (generate one with 'whsec_' + base64.b64encode(os.urandom(32)).decode())"
            )
        signers.append(Webhook(key))
    return signers


class WebhookTransport(Transport):
    """POSTs messages to ``OPTIONS["url"]`` (see the module docstring).

    Raises:
        ImproperlyConfigured: from ``__init__``, for any invalid option.
    """

    options = ("url", "secret", "timeout", "connect_timeout", "headers", "retry_statuses", "verify")

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)
        where = f"destination {destination!r}"
        url = options.get("url")
        if not _http_url(url):
            raise ImproperlyConfigured(f"{where}: OPTIONS['url'] must be an http:// or https:// URL, not {url!r}")
        self.url: str = url  # type: ignore[assignment]
        secret = options.get("secret")
        self.signers = [] if secret is None else _signers(secret, where)
        self.timeout = _positive(options.get("timeout", 10), f"{where}: OPTIONS['timeout']")
        self.connect_timeout = _positive(options.get("connect_timeout", 5), f"{where}: OPTIONS['connect_timeout']")
        try:
            self.headers = clean_headers(options.get("headers"))
        except InvalidMessage as exc:
            raise ImproperlyConfigured(f"{where}: OPTIONS['headers']: {exc}") from exc
        try:
            _check_http_headers(self.headers, "OPTIONS['headers']")
        except InvalidMessage as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
        statuses = options.get("retry_statuses", DEFAULT_RETRY_STATUSES)
        if not isinstance(statuses, (list, tuple, set, frozenset)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 400 <= s < 500 for s in statuses
        ):
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['retry_statuses'] must be a list of 4xx status codes, not {statuses!r}"
            )
        self.retry_statuses = frozenset(statuses)
        self.verify = _verify(options.get("verify", True), f"{where}: OPTIONS['verify']")
        self._client: httpx.Client | None = None
        self._pid = 0
        self._client_lock = threading.Lock()

    def longest_attempt(self) -> float:
        """``connect_timeout`` + 2 × ``timeout`` seconds: connecting, waiting for the
        response's headers, then reading up to :data:`MAX_RESPONSE_BYTES` of its body
        (each bounded by its timeout; the request itself is small and written at once)."""
        return self.connect_timeout + 2 * self.timeout

    @property
    def signer(self) -> Webhook | None:
        """The signer of the first (current) secret, or None without a secret."""
        return self.signers[0] if self.signers else None

    @property
    def client(self) -> httpx.Client:
        """This process's connection pool, created on first use.

        A child process forked after the pool was opened (RQ's work horse) gets a pool of
        its own: a socket shared with the parent would interleave both processes' bytes.
        The inherited pool is left unclosed (closing it would touch the parent's sockets).
        """
        if self._client is not None and self._pid == os.getpid():
            return self._client
        with self._client_lock:  # attempts run on a thread pool: build one pool, not one per thread
            if self._client is not None and self._pid == os.getpid():
                return self._client
            self._client = httpx.Client(
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                verify=self.verify,
                follow_redirects=False,
                headers={"User-Agent": f"django-redis-outbox/{__version__}"},
            )
            self._pid = os.getpid()
            return self._client

    def check_message(self, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        """Refuse, at ``send()`` time, what this destination could never send.

        Raises:
            InvalidMessage: a ``Content-Type`` header (use ``content_type=``), a header
                value that is not ASCII (HTTP cannot carry it as text), or a body that is
                not UTF-8 while the destination signs (Standard Webhooks signs text).
        """
        _check_http_headers(headers)
        if self.signers:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidMessage(
                    f"destination {self.destination!r} signs its webhooks, and Standard Webhooks signs text: "
                    "the body must be UTF-8",
                    field="body",
                ) from exc

    def request_headers(self, message: Message, timestamp: int) -> dict[str, str]:
        """The headers of one attempt, signature included.

        Args:
            message: the message being delivered.
            timestamp: epoch seconds of the attempt (``webhook-timestamp``).

        Returns:
            Header name -> value: the destination's headers, overridden by the message's
            (case-insensitively), then ``Content-Type`` and the ``webhook-*`` headers.
        """
        overridden = {k.lower() for k in message.headers}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in overridden}
        headers.update(message.headers)
        headers["Content-Type"] = message.content_type
        headers["webhook-id"] = message.id
        headers["webhook-timestamp"] = str(timestamp)
        if self.signers:
            when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
            text = message.body.decode("utf-8")
            headers["webhook-signature"] = " ".join(s.sign(message.id, when, text) for s in self.signers)
        return headers

    def deliver(self, message: Message) -> DeliveryResult:
        """POST the message.

        Returns:
            A :class:`DeliveryResult` with the 2xx status code.

        Raises:
            DeliveryError: a non-2xx response (``status_code`` set; ``permanent`` for a 4xx
                not in ``retry_statuses``; ``retry_after`` from ``Retry-After``), or a
                network error or timeout (retryable, no status code).
        """
        headers = self.request_headers(message, int(time.time()))
        try:
            with self.client.stream("POST", self.url, content=message.body, headers=headers) as response:
                code = response.status_code
                excerpt = _read_some(response, self.timeout)
        except httpx.TimeoutException as exc:
            raise DeliveryError(f"timed out ({type(exc).__name__}) after {self.timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
        if 200 <= code < 300:
            return DeliveryResult(status_code=code)
        text = excerpt.decode(response.encoding or "utf-8", errors="replace")[:RESPONSE_EXCERPT].strip()
        raise DeliveryError(
            f"HTTP {code} {response.reason_phrase}" + (f": {text}" if text else ""),
            status_code=code,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            permanent=400 <= code < 500 and code not in self.retry_statuses,
        )

    def close(self) -> None:
        """Close this process's connection pool (a later delivery opens a new one)."""
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None


def _read_some(response: httpx.Response, timeout: float) -> bytes:
    """Up to :data:`MAX_RESPONSE_BYTES` of a streamed response body, within ``timeout`` seconds.

    The body is drained when it is small, so the connection can be reused; a larger or
    slower one is cut off (the connection is then closed). A failure while reading is
    ignored: the status line has already said what happened.

    Returns:
        The first bytes of the body (at most :data:`RESPONSE_EXCERPT` * 4 kept).
    """
    kept = b""
    size = 0
    deadline = time.monotonic() + timeout
    try:
        for chunk in response.iter_bytes():
            if len(kept) < RESPONSE_EXCERPT * 4:
                kept += chunk[: RESPONSE_EXCERPT * 4 - len(kept)]
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES or time.monotonic() > deadline:
                break
    except httpx.HTTPError:
        pass
    return kept


def _http_url(url: Any) -> bool:
    """True for an absolute ``http``/``https`` URL with a host and a valid port, if any."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ImproperlyConfigured(f"{where} must be a positive number of seconds, not {value!r}")
    return float(value)


def _verify(value: Any, where: str) -> bool | ssl.SSLContext:
    """The ``verify`` option as httpx takes it: a bool, or an SSL context over a CA bundle file."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, os.PathLike)) and str(value):
        try:
            return ssl.create_default_context(cafile=os.fspath(value))
        except (OSError, ssl.SSLError) as exc:
            raise ImproperlyConfigured(f"{where}: cannot load the CA bundle {value!r}: {exc}") from exc
    raise ImproperlyConfigured(f"{where} must be True, False or the path of a CA bundle file, not {value!r}")


__all__ = ["DEFAULT_RETRY_STATUSES", "WebhookTransport", "parse_retry_after"]


def _check_http_headers(headers: dict[str, str], where: str = "") -> None:
    """Refuse headers a webhook request cannot carry as given (destination or message headers;
    ``where`` names the setting in errors about a destination's headers).

    Raises:
        InvalidMessage: a ``Content-Type`` header (it is the message's content type: use
            ``content_type=``), or a value that is not ASCII (httpx sends header values as
            ASCII text).
    """
    if any(k.lower() == "content-type" for k in headers):
        raise InvalidMessage(
            (f"{where}: " if where else "") + "a webhook's Content-Type is the message's content type: "
            "pass content_type=... instead of a 'Content-Type' header",
            field="headers",
        )
    for name, value in headers.items():
        if not value.isascii():
            label = f"{where}[{name!r}]" if where else f"header {name!r}"
            raise InvalidMessage(
                f"{label} must be ASCII text (an HTTP header value), not {value!r}; "
                "percent-encode it, or put it in the body",
                field="headers",
            )
