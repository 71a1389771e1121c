"""HTTP webhooks, signed per the Standard Webhooks specification.

Each delivery is an HTTP POST of the message body with::

    Content-Type:       the message's content type
    webhook-id:         the message id (stable across retries, so receivers can deduplicate)
    webhook-timestamp:  epoch seconds of this attempt
    webhook-signature:  v1,<base64 HMAC-SHA256 of "id.timestamp.body"> (when a secret is set)
    Outbox-Ordering-Key, Outbox-Ordering-Sequence, Outbox-Ordering-Previous,
    Outbox-Ordering-Epoch, Outbox-Ordering-Version:
                        an ordered message's key, sequence, the sequence delivered
                        before it, its key's epoch and the protocol version (2)
                        (:func:`outbox.headers.ordering_headers`)
    traceparent:        the attempt's W3C trace context, with OpenTelemetry on (outbox.tracing)

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
* ``deadline`` (seconds, default ``connect_timeout + 2 * timeout``): the hard limit of one
  attempt, covering name resolution's connect, TLS, sending, the response's headers and
  reading its body: every socket operation gets at most the time left (see
  :mod:`outbox.transports.ssrf`), so a receiver that drips bytes cannot hold a worker past it.
  System check ``outbox.W003`` compares it with half of ``VISIBILITY_TIMEOUT``.
* ``headers`` (dict): fixed extra headers for every request; a message's own headers
  override them (names compare case-insensitively). ``Content-Type`` cannot be set
  this way: it is the message's content type. Names and values follow
  :mod:`outbox.headers` (no framing or hop-by-hop headers, ASCII values without
  surrounding whitespace), checked at startup (``outbox.E002``) and by ``send()``.
* ``allow_private_networks`` (bool, default False): with ``OUTBOX["BLOCK_PRIVATE_NETWORKS"]``
  on (the default), connections to loopback, private, link-local (cloud metadata) and
  other non-public addresses are refused after name resolution, as a permanent failure;
  True lets this destination reach them (a receiver on your own network).
* ``trust_env`` (bool, default False): send through the proxy the environment names
  (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``, minus ``NO_PROXY``; http(s) proxies
  only). Off, so a variable set for something else cannot route signed webhooks through
  a proxy. Through a proxy, the proxy (which you chose) connects to the receiver, so the
  private-network check does not apply; the deadline still does.
* ``retry_statuses`` (list of int): the 4xx statuses that are retried; the list replaces
  the default 408, 409, 425, 429. Every other 4xx fails at once (permanent);
  5xx, 3xx and network errors or timeouts are retried.
* ``verify`` (bool, or the path of a CA bundle file; default True): check TLS certificates.

Connections are reused across deliveries in one worker process (an ``httpx.Client`` pool;
a forked child opens its own). A ``Retry-After`` header on a failed response (seconds or
an HTTP date, RFC 9110 §10.2.3) sets the least wait before the next attempt. At most
:data:`MAX_RESPONSE_BYTES` of a response body are read, and a compressed body is
decompressed only up to the excerpt kept, so an endless, huge or gzip-bomb response
cannot hold a worker or its memory. Error texts (and the response excerpt in them) go
through :func:`outbox.redaction.redact` with the message's and destination's secrets.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import math
import os
import re
import ssl
import threading
import time
import zlib
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured
from standardwebhooks import Webhook

from outbox import headers as header_rules
from outbox import tracing
from outbox.conf import outbox_settings
from outbox.exceptions import DeliveryError, InvalidMessage, PermanentDeliveryError
from outbox.records import Message
from outbox.redaction import redact, secrets_for
from outbox.transports.base import DeliveryResult, Transport
from outbox.transports.ssrf import GuardedTransport, PrivateAddressRefused, environment_proxy
from outbox.version import __version__

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
    # Errors describe the value, never quote it: it is a secret (and checks print errors).
    secrets = [secret] if isinstance(secret, str) else secret
    if not isinstance(secrets, (list, tuple)) or not secrets:
        raise ImproperlyConfigured(
            f"{where}: OPTIONS['secret'] must be a 'whsec_<base64>' str or a non-empty list of them, "
            f"not a {type(secret).__name__}"
        )
    signers = []
    for item in secrets:
        if not isinstance(item, str) or not item:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['secret'] must be a non-empty 'whsec_<base64>' str, not "
                f"{'an empty str' if item == '' else 'a ' + type(item).__name__} "
                "(leave the option out to send unsigned webhooks)"
            )
        encoded = item[len(SECRET_PREFIX) :] if item.startswith(SECRET_PREFIX) else item
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['secret'] is not 'whsec_' + base64 (it has characters base64 does not use); "
                "generate one with 'whsec_' + base64.b64encode(os.urandom(32)).decode()"
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

    #: How to allow a refused address, said in a ``blocked_address`` failure's error.
    allow_private_hint = "set the destination's OPTIONS['allow_private_networks'] = True to allow it"
    options: tuple[str, ...] = (
        "url",
        "secret",
        "timeout",
        "connect_timeout",
        "deadline",
        "headers",
        "retry_statuses",
        "verify",
        "allow_private_networks",
        "trust_env",
    )

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)
        where = f"destination {destination!r}"
        #: The secrets of this destination, removed from every error text (see redaction).
        self.secrets = secrets_for(None, options)
        url = options.get("url")
        if not _http_url(url):
            shown = (
                redact(repr(url)[:200], secrets=self.secrets) if isinstance(url, str) else type(url).__name__
            )
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['url'] must be an http:// or https:// URL without spaces or control "
                f"characters, not {shown}"
            )
        self.url: str = url  # type: ignore[assignment]
        self.host = url_host(url)  # type: ignore[arg-type]
        secret = options.get("secret")
        self.signers = [] if secret is None else _signers(secret, where)
        self.timeout = _positive(options.get("timeout", 10), f"{where}: OPTIONS['timeout']")
        self.connect_timeout = _positive(
            options.get("connect_timeout", 5), f"{where}: OPTIONS['connect_timeout']"
        )
        self.deadline = _positive(
            options.get("deadline", self.connect_timeout + 2 * self.timeout), f"{where}: OPTIONS['deadline']"
        )
        try:
            self.headers = header_rules.clean_headers(
                options.get("headers"), "OPTIONS['headers']", ascii_only=True
            )
            _check_http_headers(self.headers, "OPTIONS['headers']")
        except InvalidMessage as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
        self.allow_private_networks = _flag(
            options.get("allow_private_networks", False), f"{where}: OPTIONS['allow_private_networks']"
        )
        self.trust_env = _flag(options.get("trust_env", False), f"{where}: OPTIONS['trust_env']")
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
        self._transport: GuardedTransport | None = None
        self._pid = 0
        self._client_lock = threading.Lock()

    def longest_attempt(self) -> float:
        """The ``deadline`` option in seconds (default ``connect_timeout + 2 * timeout``):
        enforced on every socket operation of an attempt (:mod:`outbox.transports.ssrf`)."""
        return self.deadline

    @property
    def block_private_networks(self) -> bool:
        """True when connections to non-public addresses are refused for this destination."""
        return bool(outbox_settings.BLOCK_PRIVATE_NETWORKS) and not self.allow_private_networks

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
            proxy = environment_proxy(self.url) if self.trust_env else None
            try:
                self._transport = GuardedTransport(
                    verify=self.verify, block_private=self.block_private_networks, proxy=proxy
                )
            except ValueError as exc:  # a SOCKS proxy in the environment
                raise DeliveryError(f"cannot use the environment's proxy: {exc}", permanent=True) from exc
            self._client = httpx.Client(
                transport=self._transport,
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                verify=self.verify,
                trust_env=False,  # proxies from the environment: see trust_env above
                follow_redirects=False,
                # The response is only read for an error excerpt: ask for it uncompressed.
                headers={"User-Agent": f"django-redis-outbox/{__version__}", "Accept-Encoding": "identity"},
            )
            self._pid = os.getpid()
            return self._client

    def check_message(self, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        """Refuse, at ``send()`` time, what this destination could never send.

        Raises:
            InvalidMessage: a ``Content-Type`` header (use ``content_type=``), or a body
                that is not UTF-8 while the destination signs (Standard Webhooks signs
                text), or a header value that is not ASCII (the other header rules of
                :mod:`outbox.headers` are checked by ``send()`` for every transport).
        """
        _check_http_headers(headers)
        header_rules.check_ascii(headers)
        if self.signers:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidMessage(
                    f"destination {self.destination!r} signs its webhooks, and Standard Webhooks signs text: "
                    "the body must be UTF-8",
                    field="body",
                ) from exc

    def webhook_id(self, message: Message) -> str:
        """The ``webhook-id`` of ``message``'s requests (signed with the body): its id,
        the same on every retry (receivers deduplicate by it)."""
        return message.id

    def request_headers(self, message: Message, timestamp: int) -> dict[str, str]:
        """The headers of one attempt, signature included.

        Args:
            message: the message being delivered.
            timestamp: epoch seconds of the attempt (``webhook-timestamp``).

        Returns:
            Header name -> value: the destination's headers, overridden by the message's
            (case-insensitively), then ``Content-Type``, the ``webhook-*`` headers and the
            current trace context (:func:`outbox.tracing.inject_headers`).
            Framing and hop-by-hop headers (:func:`outbox.headers.reserved`) of a message
            stored before ``send()`` refused them are dropped: the client writes those.
        """
        own = {k: v for k, v in message.headers.items() if not header_rules.reserved(k)}
        overridden = {k.lower() for k in own}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in overridden}
        headers.update(own)
        headers["Content-Type"] = message.content_type
        webhook_id = self.webhook_id(message)
        headers["webhook-id"] = webhook_id
        headers["webhook-timestamp"] = str(timestamp)
        headers.update(
            header_rules.ordering_headers(
                message.ordering_key, message.order_seq, message.order_prev, message.order_epoch
            )
        )
        if self.signers:
            when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
            text = message.body.decode("utf-8")
            headers["webhook-signature"] = " ".join(s.sign(webhook_id, when, text) for s in self.signers)
        tracing.inject_headers(headers)  # the attempt's trace context replaces the stored one
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
        secrets = [*self.secrets, *secrets_for(message.headers, None)]
        started = time.monotonic()
        client = self.client
        try:
            with (
                self._transport.deadline(self.deadline),  # type: ignore[union-attr]
                client.stream("POST", self.url, content=message.body, headers=headers) as response,
            ):
                code = response.status_code
                excerpt = _read_some(response)
        except PrivateAddressRefused as exc:
            raise PermanentDeliveryError(
                redact(f"{exc}; {self.allow_private_hint}{self._to}", secrets=secrets),
                error_class="blocked_address",
            ) from exc
        except httpx.TimeoutException as exc:
            elapsed = time.monotonic() - started
            limit = (
                f"the {self.deadline:g}s deadline"
                if elapsed >= self.deadline - 0.05
                else f"{self.timeout:g}s"
            )
            raise DeliveryError(
                f"timed out ({type(exc).__name__}) after {limit}{self._to}", error_class="timeout"
            ) from exc
        except httpx.HTTPError as exc:
            raise DeliveryError(redact(f"{type(exc).__name__}: {exc}{self._to}", secrets=secrets)) from exc
        if 200 <= code < 300:
            return DeliveryResult(status_code=code)
        text = excerpt.decode(_charset(response), errors="replace")[:RESPONSE_EXCERPT].strip()
        raise DeliveryError(
            redact(
                f"HTTP {code} {response.reason_phrase}" + (f": {text}" if text else "") + self._to,
                secrets=secrets,
            ),
            status_code=code,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            permanent=400 <= code < 500 and code not in self.retry_statuses,
        )

    @property
    def _to(self) -> str:
        """The suffix naming the host in an error text."""
        return f" (host {self.host})"

    def close(self) -> None:
        """Close this process's connection pool (a later delivery opens a new one)."""
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None


def url_host(url: str) -> str:
    """The host of a URL as an operator names it: ``api.example.com``, with ``:port``
    when the URL gives one; never the user name or password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def _charset(response: httpx.Response) -> str:
    """The response's declared charset if Python knows it, else UTF-8."""

    try:
        return codecs.lookup(response.charset_encoding or "utf-8").name
    except LookupError:
        return "utf-8"


def _read_some(response: httpx.Response) -> bytes:
    """The first bytes of a streamed response body, bounded in time and memory.

    Reads raw (still encoded) bytes: at most :data:`MAX_RESPONSE_BYTES` of them. A
    ``gzip`` or ``deflate`` body is decompressed only up to the excerpt kept
    (``zlib``'s ``max_length``), so a small gzip bomb cannot expand in memory (httpx's
    own decoder expands each whole read). Other encodings are not decoded. A small body
    is drained so the connection can be reused; a larger one is cut off (the connection
    is then closed). Time is bounded by the attempt's deadline (:mod:`outbox.transports.ssrf`). A
    failure while reading is ignored: the status line has already said what happened.

    Returns:
        At most ``RESPONSE_EXCERPT * 4`` bytes of the (decoded) body.
    """
    want = RESPONSE_EXCERPT * 4
    encoding = response.headers.get("content-encoding", "").strip().lower()
    decoder = None
    if encoding in ("gzip", "x-gzip", "deflate"):
        decoder = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
    elif encoding not in ("", "identity"):
        return f"({encoding}-encoded body not shown)".encode()
    kept = b""
    size = 0
    try:
        for chunk in response.iter_raw():
            size += len(chunk)
            if len(kept) < want:
                if decoder is None:
                    kept += chunk[: want - len(kept)]
                else:
                    try:
                        kept += decoder.decompress(decoder.unconsumed_tail + chunk, want - len(kept))
                    except zlib.error:
                        decoder = None
                        kept += b"(body not decodable as " + encoding.encode() + b")"
            if size > MAX_RESPONSE_BYTES:
                break
    except httpx.HTTPError:
        pass
    return kept[:want]


def _http_url(url: Any) -> bool:
    """True for an absolute ``http``/``https`` URL with a host and a valid port, if any,
    and no whitespace or control character anywhere."""
    # Every whitespace character but " " is not printable (str.isprintable: Unicode's
    # "Other" and "Separator" categories, except the ASCII space): so this is "no
    # whitespace nor control character", in two passes in C, not one call per character.
    if not isinstance(url, str) or not url.isprintable() or " " in url:
        return False  # urlsplit would silently drop CR, LF and TAB (WHATWG), hiding them
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ImproperlyConfigured(f"{where} must be True or False, not {type(value).__name__}")
    return value


def _positive(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
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
    """Refuse a ``Content-Type`` header (destination or message headers; ``where`` names
    the setting in errors about a destination's headers). Every other rule is
    :mod:`outbox.headers`, applied before.

    Raises:
        InvalidMessage: a ``Content-Type`` header (it is the message's content type: use
            ``content_type=``).
    """
    if any(k.lower() == "content-type" for k in headers):
        raise InvalidMessage(
            (f"{where}: " if where else "") + "a webhook's Content-Type is the message's content type: "
            "pass content_type=... instead of a 'Content-Type' header",
            field="headers",
        )
