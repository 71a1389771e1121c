"""OpenTelemetry spans of send() and of each delivery attempt, recorded by the SDK's
in-memory exporter, and the trace context a real receiver gets with each webhook."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

import outbox
from outbox import tracing
from tests.support import redis_down, settle


@pytest.fixture
def spans():
    """An SDK tracer provider for the outbox's spans during the test; yields the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    yield exporter
    tracing.set_tracer_provider(None)
    provider.shutdown()


def by_name(exporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def traceparent(span) -> str:
    ctx = span.get_span_context()
    return f"00-{format_trace_id(ctx.trace_id)}-{format_span_id(ctx.span_id)}-{int(ctx.trace_flags):02x}"


def test_send_and_attempts_are_one_trace_and_the_receiver_gets_the_attempts_context(spans, hook, worker):
    hook.respond(500, 200)
    m = outbox.send("hook", {"order": 1})
    (send,) = by_name(spans, "send")
    assert send.name == "send hook" and send.kind == SpanKind.PRODUCER
    assert dict(send.attributes) == {
        "messaging.system": "django-redis-outbox",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "hook",
        "messaging.message.id": m.id,
    }
    assert outbox.get(m.id).headers["traceparent"] == traceparent(send)  # the creation context, stored

    settle(worker, [m.id])
    attempts = sorted(by_name(spans, "deliver"), key=lambda s: s.start_time)
    assert [s.name for s in attempts] == ["deliver hook", "deliver hook"]
    for span in attempts:
        assert span.kind == SpanKind.CONSUMER
        assert span.parent.span_id == send.context.span_id  # a child of the send span ...
        assert span.context.trace_id == send.context.trace_id
        assert [link.context.span_id for link in span.links] == [send.context.span_id]  # ... and linked
        assert span.attributes["messaging.message.id"] == m.id
        assert span.attributes["messaging.operation.type"] == "process"
    failed, delivered = attempts
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["error.type"] == "http"
    assert failed.attributes["http.response.status_code"] == 500
    assert failed.attributes["outbox.retry_count"] == 0
    assert delivered.status.status_code == StatusCode.UNSET
    assert delivered.attributes["http.response.status_code"] == 200
    assert delivered.attributes["outbox.retry_count"] == 1
    # each request carries the context of its own attempt, not the stored one
    assert [r.headers["traceparent"] for r in hook.requests] == [traceparent(s) for s in attempts]


def test_send_inside_a_callers_span_is_its_child(spans, hook):
    with tracing.tracer().start_as_current_span("checkout") as outer:
        outbox.send("hook", "x")
    (send,) = by_name(spans, "send")
    assert send.parent.span_id == outer.get_span_context().span_id


def test_send_many_is_one_span_for_the_batch(spans, hook):
    messages = outbox.send_many([{"destination": "hook", "body": n} for n in range(3)])
    (send,) = by_name(spans, "send")
    assert send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    assert {outbox.get(m.id).headers["traceparent"] for m in messages} == {traceparent(send)}
    mixed = outbox.send_many([{"destination": "hook", "body": 1}, {"destination": "mem", "body": 2}])
    assert mixed and by_name(spans, "send")[-1].name == "send"  # no single destination to name


def test_a_traceparent_given_by_the_caller_is_kept_and_linked(spans, hook, worker):
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    m = outbox.send("hook", "x", headers={"TraceParent": given})
    (send,) = by_name(spans, "send")
    assert outbox.get(m.id).headers == {"TraceParent": given}
    assert [format_span_id(link.context.span_id) for link in send.links] == ["b7ad6b7169203331"]
    settle(worker, [m.id])
    (attempt,) = by_name(spans, "deliver")
    assert format_trace_id(attempt.context.trace_id) == "0af7651916cd43dd8448eb211c80319c"
    assert format_span_id(attempt.parent.span_id) == "b7ad6b7169203331"
    (request,) = hook.requests
    assert request.headers["traceparent"] == traceparent(attempt)  # one traceparent header, the attempt's


def test_off_by_setting(spans, hook, worker, settings):
    settings.OUTBOX = {**settings.OUTBOX, "TRACING": False}
    m = outbox.send("hook", "x")
    settle(worker, [m.id])
    assert spans.get_finished_spans() == ()
    assert outbox.get(m.id).headers == {}
    assert "traceparent" not in hook.requests[0].headers


def test_without_an_sdk_nothing_is_added(hook, worker):
    """The API alone (no provider configured: the global no-op one) writes no trace headers."""
    m = outbox.send("hook", "x")
    settle(worker, [m.id])
    assert outbox.get(m.id).headers == {}
    assert "traceparent" not in hook.requests[0].headers


GLOBAL_PROVIDER_SCRIPT = """
import django
django.setup()
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import outbox

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # what an application (or opentelemetry-instrument) does
m = outbox.send("mem", "x")
(span,) = exporter.get_finished_spans()
print(span.name, format(span.context.trace_id, "032x"), outbox.get(m.id).headers["traceparent"], sep="|")
"""


def test_the_global_tracer_provider_is_used_once_the_application_sets_one(redis):
    """In a fresh process (the global provider can be set once per process)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    name, trace_id, header = out.stdout.strip().split("|")
    assert name == "send mem" and header.split("-")[1] == trace_id


def test_a_send_that_fails_is_an_error_span(spans):
    with redis_down(), pytest.raises(outbox.OutboxUnavailable):
        outbox.send("hook", "x")
    (send,) = by_name(spans, "send")
    assert send.status.status_code == StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in send.events] == ["outbox.exceptions.OutboxUnavailable"]


SEEN_SPANS: list = []


def note_current_span(message) -> None:
    """A callable destination's function: notes the span current while it runs."""
    from opentelemetry import trace

    SEEN_SPANS.append(trace.get_current_span().get_span_context())


def test_a_callable_runs_inside_its_attempts_span(spans, worker):
    """The callable runs in a deadline thread: the attempt's context goes with it, so the
    project's own spans there are children of the attempt."""
    from tests.support import with_destinations

    SEEN_SPANS.clear()
    with with_destinations("callable", traced={"OPTIONS": {"path": f"{__name__}.note_current_span"}}):
        m = outbox.send("traced", "x")
        settle(worker, [m.id])
    (attempt,) = by_name(spans, "deliver")
    assert [c.span_id for c in SEEN_SPANS] == [attempt.context.span_id]


@pytest.mark.asyncio
async def test_asend_has_the_send_span_with_its_name_and_attributes(spans, hook):
    from outbox.store.client.aconnection import aclose

    m = await outbox.asend("hook", {"order": 1})
    (send,) = by_name(spans, "send")
    assert send.name == "send hook" and send.kind == SpanKind.PRODUCER
    assert dict(send.attributes) == {
        "messaging.system": "django-redis-outbox",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "hook",
        "messaging.message.id": m.id,
    }
    assert (await outbox.aget(m.id)).headers["traceparent"] == traceparent(send)
    with tracing.tracer().start_as_current_span("checkout") as outer:  # a caller's span, across awaits
        batch = await outbox.asend_many([{"destination": "hook", "body": n} for n in range(3)])
    many = by_name(spans, "send")[-1]
    assert many.parent.span_id == outer.get_span_context().span_id
    assert many.attributes["messaging.batch.message_count"] == 3
    assert {(await outbox.aget(b.id)).headers["traceparent"] for b in batch} == {traceparent(many)}
    await aclose()


def test_the_opentelemetry_api_is_imported_when_the_app_loads_not_in_the_first_send():
    """The import (propagators, their regular expressions) ran inside the first send: on
    the event loop, for an ``asend`` (issue 33's loop-blocking target)."""
    code = (
        "import sys, django; django.setup(); from outbox import tracing; "
        "print(tracing._api is not None and 'opentelemetry.propagate' in sys.modules)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
