"""OpenTelemetry tracing: a span around ``send()``, one per delivery attempt, and the
W3C trace context carried with each message to its receiver.

Active when ``opentelemetry-api`` is installed (``pip install "django-redis-outbox[otel]"``)
and ``OUTBOX["TRACING"]`` is True (the default). The API alone records nothing: spans
are exported once the project configures an SDK (``opentelemetry-sdk``, or
``opentelemetry-instrument``). OpenTelemetry is imported when the app is loaded
(:func:`preload`, from ``AppConfig.ready``) with ``TRACING`` on, not by ``import
outbox``; without the package every function is a no-op.

Spans follow OpenTelemetry's semantic conventions for messaging spans
(https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/):

* ``send <destination>`` (kind PRODUCER, ``messaging.operation.type = "send"``) around
  ``send()`` and ``send_many()`` (and their async twins ``asend()``, ``asend_many()``,
  the same span; ``publish()`` and ``apublish()`` through them): validation is done, the span covers the write (to
  Redis, or to the capture table inside a transaction). Its context is the *creation
  context* of the messages: it is written into each message's headers as W3C Trace
  Context ``traceparent``/``tracestate`` (https://www.w3.org/TR/trace-context/), unless
  the caller gave a ``traceparent`` header of its own, which is kept and linked to
  instead. A batch is one span with ``messaging.batch.message_count`` (no per-message
  "create" spans, so ``send_many`` of thousands stays one span).
* ``deliver <destination>`` (kind CONSUMER, ``messaging.operation.type = "process"``)
  around each delivery attempt in the worker: a child of the creation context read back
  from the message's headers, with a link to it as the conventions ask, so a message's
  send and all its attempts are one trace. A failed attempt has status ERROR and
  ``error.type`` (:attr:`~outbox.exceptions.DeliveryError.error_class`).
* The webhook transport sends the attempt's context (``traceparent``, ``tracestate``
  and whatever else the global propagator writes) in place of the stored one, so the
  receiver's own spans become children of the attempt. Other transports see the stored
  creation context in ``message.headers`` (the email transport sends it as a header).

Attributes: ``messaging.system = "django-redis-outbox"``, ``messaging.destination.name``,
``messaging.message.id`` (the outbox id, also the ``webhook-id``), ``messaging.operation.name``
(``send``/``deliver``); on attempts also ``outbox.queue``, ``outbox.retry_count``,
``http.response.status_code`` and ``error.type``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from outbox.conf import outbox_settings
from outbox.version import __version__

if TYPE_CHECKING:
    from outbox.records import Message, Outcome

SYSTEM = "django-redis-outbox"
#: Header names of W3C Trace Context (lower case), stored with each message.
TRACE_HEADERS = ("traceparent", "tracestate")
#: Most links a send span gets to creation contexts given by callers (the SDK's default limit).
MAX_LINKS = 128

_api: Any = None  # the imported OpenTelemetry modules, False when not installed
_provider: Any = None  # a TracerProvider set by set_tracer_provider(), else the global one
_tracer: Any = None


class _OTel:
    def __init__(self) -> None:
        from opentelemetry import propagate, trace  # optional: the otel extra
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,  # optional: the otel extra
        )
        from opentelemetry.trace.status import Status, StatusCode  # optional: the otel extra

        self.noop_providers = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self.trace = trace
        self.propagate = propagate
        self.tracecontext = TraceContextTextMapPropagator()
        self.Status, self.StatusCode = Status, StatusCode


def _otel() -> _OTel | None:
    """The OpenTelemetry API when installed, ``OUTBOX["TRACING"]`` is on and a tracer
    provider is configured, else None.

    Without an SDK the API's tracer makes only invalid spans and propagates nothing, so
    skipping the spans then changes nothing but the cost (about 25 µs per ``send()``).
    """
    global _api
    if not outbox_settings.TRACING:
        return None
    if _api is None:
        try:
            _api = _OTel()
        except ImportError:
            _api = False
    if not _api or (_provider is None and isinstance(_api.trace.get_tracer_provider(), _api.noop_providers)):
        return None
    api: _OTel = _api
    return api


def preload() -> None:
    """Import the OpenTelemetry API now (``AppConfig.ready``) when ``OUTBOX["TRACING"]``
    is on: done by the first send instead, the import (its propagators compile regular
    expressions: about 7 ms on a slow machine) ran inside that send, on the event loop
    for an ``asend``."""
    _otel()


def enabled() -> bool:
    """True when spans are made (the API is installed, ``OUTBOX["TRACING"]`` is on and a
    tracer provider is set)."""
    return _otel() is not None


def set_tracer_provider(provider: Any = None) -> None:
    """Make the outbox's spans with ``provider`` (an OpenTelemetry ``TracerProvider``)
    instead of the global one, as instrumentations' ``tracer_provider=`` arguments do;
    None goes back to the global provider. Mostly for tests."""
    global _provider, _tracer
    _provider, _tracer = provider, None


def tracer() -> Any:
    """The outbox's tracer (instrumentation scope ``outbox``, the package version).

    Raises:
        ImportError: opentelemetry-api is not installed.
    """
    global _tracer
    if _tracer is None:
        from opentelemetry import trace  # optional: the otel extra

        _tracer = trace.get_tracer("outbox", __version__, tracer_provider=_provider)
    return _tracer


def _lowered(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def creation_context(headers: dict[str, str]) -> Any:
    """The OpenTelemetry ``Context`` written into a message's headers at send time
    (W3C Trace Context, names compared case-insensitively); an empty context when none
    is there or OpenTelemetry is off."""
    api = _otel()
    if api is None:
        return None
    return api.tracecontext.extract(_lowered(headers))


# -- send -------------------------------------------------------------------------------
def traced_send(
    submit: Callable[[list[Message], str, bool | None], list[Message]],
) -> Callable[..., list[Message]]:
    """Decorate ``api._submit(messages, using, atomic=None)`` with the ``send`` span (see
    the module docstring)."""

    @functools.wraps(submit)
    def wrapper(messages: list[Message], using: str, atomic: bool | None = None) -> list[Message]:
        api = _otel()
        if api is None or not messages:
            return submit(messages, using, atomic)
        with _send_span(api, messages):
            return submit(messages, using, atomic)

    return wrapper


def atraced_send(
    submit: Callable[[list[Message], str], Awaitable[list[Message]]],
) -> Callable[[list[Message], str], Awaitable[list[Message]]]:
    """Decorate ``api._asubmit(messages, using)`` (``asend``, ``asend_many``,
    ``apublish``) with the same ``send`` span as :func:`traced_send`: its name,
    attributes, links and the context written into the headers; the span is the
    current one of the task while the write is awaited (contextvars). Without spans
    the wrapper returns ``submit``'s awaitable as it is: no coroutine layer around it
    (an object for the collector per call and, in asyncio's debug mode, a frame of every
    stack extracted below it)."""

    @functools.wraps(submit)
    def wrapper(messages: list[Message], using: str) -> Awaitable[list[Message]]:
        api = _otel()
        if api is None or not messages:
            return submit(messages, using)
        return _atraced(api, submit, messages, using)

    return wrapper


async def _atraced(
    api: _OTel,
    submit: Callable[[list[Message], str], Awaitable[list[Message]]],
    messages: list[Message],
    using: str,
) -> list[Message]:
    with _send_span(api, messages):
        return await submit(messages, using)


@contextlib.contextmanager
def _send_span(api: _OTel, messages: list[Message]) -> Iterator[None]:
    """The ``send`` span of ``messages``, current inside the block, its context written
    into their headers (a ``traceparent`` given by the caller kept, and linked to)."""
    destinations = {m.destination for m in messages}
    destination = next(iter(destinations)) if len(destinations) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    if len(messages) == 1:
        attributes["messaging.message.id"] = messages[0].id
    else:
        attributes["messaging.batch.message_count"] = len(messages)
    links: list[Any] = []
    for m in messages:  # a creation context the caller put in the headers is kept, and linked to
        if "traceparent" in _lowered(m.headers) and len(links) < MAX_LINKS:
            given = api.trace.get_current_span(creation_context(m.headers)).get_span_context()
            if given.is_valid:
                links.append(api.trace.Link(given))
    name = f"send {destination}" if destination is not None else "send"
    with tracer().start_as_current_span(
        name, kind=api.trace.SpanKind.PRODUCER, attributes=attributes, links=links
    ):
        carrier: dict[str, str] = {}
        api.tracecontext.inject(carrier)
        if carrier:
            for m in messages:
                if "traceparent" not in _lowered(m.headers):
                    m.headers.update(carrier)
        yield


# -- attempts ---------------------------------------------------------------------------
def traced_attempt(attempt: Callable[[Message], Outcome]) -> Callable[[Message], Outcome]:
    """Decorate ``delivery.attempt(message)`` with the ``deliver`` span (see the module docstring)."""

    @functools.wraps(attempt)
    def wrapper(message: Message) -> Outcome:
        api = _otel()
        if api is None:
            return attempt(message)
        return _attempt(api, attempt, message)

    return wrapper


def _attempt(api: _OTel, attempt: Callable[[Message], Outcome], message: Message) -> Outcome:
    parent = creation_context(message.headers)
    created = api.trace.get_current_span(parent).get_span_context()
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "deliver",
        "messaging.destination.name": message.destination,
        "messaging.message.id": message.id,
        "outbox.queue": message.queue,
        "outbox.retry_count": message.retry_count,
    }
    with tracer().start_as_current_span(
        f"deliver {message.destination}",
        context=parent,
        kind=api.trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=[api.trace.Link(created)] if created.is_valid else [],
    ) as span:
        outcome = attempt(message)
        if outcome.status_code is not None:
            span.set_attribute("http.response.status_code", outcome.status_code)
        if not outcome.ok:
            span.set_attribute("error.type", outcome.error_class or "error")
            span.set_attribute("outbox.permanent", outcome.permanent)
            span.set_status(api.Status(api.StatusCode.ERROR, outcome.error[:300]))
        return outcome


# -- propagation to receivers -----------------------------------------------------------
def inject_headers(headers: dict[str, str]) -> None:
    """Write the current context into outgoing request ``headers`` with the global
    propagator (W3C ``traceparent``/``tracestate`` by default, as ``OTEL_PROPAGATORS``
    says), replacing the headers of the same names (compared case-insensitively), such
    as the creation context stored with the message. Does nothing without a current
    span (or with OpenTelemetry off), so the stored context then goes out unchanged."""
    api = _otel()
    if api is None:
        return
    carrier: dict[str, str] = {}
    api.propagate.inject(carrier)
    if not carrier:
        return
    # W3C names too, when the propagator writes another format (B3...): no stale traceparent goes along
    replaced = {k.lower() for k in carrier} | set(TRACE_HEADERS)
    for name in [k for k in headers if k.lower() in replaced]:
        del headers[name]
    headers.update(carrier)


__all__ = [
    "SYSTEM",
    "atraced_send",
    "creation_context",
    "enabled",
    "inject_headers",
    "set_tracer_provider",
    "traced_attempt",
    "traced_send",
    "tracer",
]
