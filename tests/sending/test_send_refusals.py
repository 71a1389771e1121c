"""send() refuses what could never be delivered, or would be dangerous to deliver, with
InvalidMessage and nothing written (issue 6, items 1, 3, 4; issue 11, retry policies).

Includes property-based tests (hypothesis): any arguments either raise InvalidMessage
with nothing written, or round-trip exactly; a sample is delivered byte-exact with a
valid signature to a loopback receiver.
"""

from __future__ import annotations

import base64
import json
import math
import random
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook

import outbox
from outbox.checks import check_outbox_settings
from outbox.conf import MAX_RETRIES_LIMIT
from outbox.delivery.loop import run as deliver_queue
from outbox.headers import clean_content_type
from outbox.retry import RetryPolicy, retry_delay
from outbox.sending.validation import clean_destination
from tests.support import hook_settings, with_destinations

SECRET = "whsec_" + base64.b64encode(bytes(range(40, 72))).decode()
#: Bounded example counts keep these tests to a few seconds (see also tests/console/test_bad_input.py).
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def refused(redis, match: str | None = None, destination: str = "mem", **kwargs) -> outbox.InvalidMessage:
    """send() raises InvalidMessage (matching ``match``) and writes no key."""
    before = redis.dbsize()
    with pytest.raises(outbox.InvalidMessage, match=match) as info:
        outbox.send(destination, kwargs.pop("body", "hello"), **kwargs)
    assert redis.dbsize() == before
    return info.value


# -- item 1: framing and hop-by-hop headers ---------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Transfer-Encoding",
        "transfer-encoding",
        "Content-Length",
        "Connection",
        "Keep-Alive",
        "Upgrade",
        "TE",
        "Trailer",
        "Host",
        "Proxy-Authorization",
        "Proxy-Connection",
    ],
)
def test_framing_and_hop_by_hop_headers_are_refused(redis, name):
    with hook_settings("http://127.0.0.1:9/"):
        refused(redis, "set by the HTTP client", destination="hook", headers={name: "chunked"})


def test_transfer_encoding_in_a_destinations_headers_is_a_check_error():
    with hook_settings("http://127.0.0.1:9/", OPTIONS={"headers": {"Transfer-Encoding": "chunked"}}):
        errors = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert len(errors) == 1 and "Transfer-Encoding" in errors[0].msg


# -- item 3: accepted but undeliverable ------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain\n",
        "text/plain; charset=utf-8\n",
        "text/plain; charset=ü",
        "text/pl\rain",
        "application/json; a=b\r\nX-Injected: 1",
        'text/plain; name="a\x00b"',
        " text/plain",
        "text/plain ",
        "text",
        "a/b; c",
    ],
)
def test_content_types_that_cannot_be_sent_are_refused(redis, content_type):
    refused(redis, "content_type", content_type=content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "text/plain; charset=utf-8",
        'multipart/form-data; boundary="a b:c"',
        "a/b ; c=d;e=f",
    ],
)
def test_valid_content_types_are_kept(content_type):
    assert clean_content_type(content_type) == content_type


@pytest.mark.parametrize(
    "headers,match",
    [
        ({"X-A\n": "1"}, "not a valid HTTP field name"),
        ({"X-A ": "1"}, "not a valid HTTP field name"),
        ({"X-A": " leading"}, "whitespace"),
        ({"X-A": "trailing "}, "whitespace"),
        ({"X-A": "trailing\t"}, "whitespace"),
        ({"X-A": "a\x7fb"}, "control character"),
        ({"X-A": "a\x85b"}, "control character"),
        ({"Transfer-Encoding": "gzip, chunked"}, "set by the HTTP client"),
        ({"webhook-signature": "v1,x"}, "set by the HTTP client or the outbox"),
    ],
)
def test_header_names_and_values_h11_would_refuse_are_refused_at_send(redis, headers, match):
    refused(redis, match, headers=headers)


def test_non_ascii_header_values_are_refused_for_webhooks_only(redis):
    with hook_settings("http://127.0.0.1:9/"):
        refused(redis, "ASCII", destination="hook", headers={"X-Name": "Zoë"})
    assert outbox.send("mem", "x", headers={"X-Name": "Zoë"}).headers == {"X-Name": "Zoë"}


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/a\r\nX-Injected: 1",
        "http://example.com/a\nb",
        "http://exa mple.com/",
        "http://example.com/\t",
    ],
)
def test_destination_urls_with_control_characters_are_check_errors(url):
    with hook_settings(url):
        errors = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert len(errors) == 1 and "OPTIONS['url']" in errors[0].msg


def test_header_errors_never_quote_the_value(redis):
    error = refused(redis, headers={"Authorization": "Bearer MSG-SECRET "})
    assert "MSG-SECRET" not in str(error)


# -- item 4: only InvalidMessage -------------------------------------------------------------


def test_a_deeply_nested_body_is_invalid_not_a_recursion_error(redis):
    body: list = []
    for _ in range(100_000):
        body = [body]
    refused(redis, "nested too deeply", body=body)


@pytest.mark.parametrize("delay", [10**400, -(10**400), float("inf"), float("nan")])
def test_an_enormous_delay_is_invalid_not_an_overflow(redis, delay):
    refused(redis, "delay", delay=delay)


def test_clean_destination_refuses_a_non_str_name():
    with pytest.raises(outbox.UnknownDestination):
        clean_destination(["mem"])
    assert clean_destination("mem") == "mem"


def test_a_list_as_destination_is_invalid_not_a_type_error(redis):
    refused(redis, destination=["mem"])


# -- issue 11: retry policies ----------------------------------------------------------------


@pytest.mark.parametrize(
    "retry",
    [
        {"jitter": "bogus"},
        {"base": float("nan")},
        {"strategy": "exponential", "base": 5e-324, "factor": 1e308},
        {"factor": 1e308},
        {"factor": 0.5},
        {"base": 10**400},
        {"max_delay": -1},
        [1, float("inf")],
        [5e-324],
        list(range(1001)),
        {"strategy": "schedule", "delays": "5, 10"},
    ],
)
def test_bad_retry_policies_are_refused_at_send(redis, retry):
    refused(redis, "retry", retry=retry)


def test_a_retry_policy_validates_itself():
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter="bogus")
    with pytest.raises(ValueError, match="base"):
        RetryPolicy(base=math.nan)
    with pytest.raises(ValueError, match="factor"):
        RetryPolicy(base=1, factor=1e308)


def test_bad_retry_settings_are_check_errors(settings):
    bad = {"strategy": "exponential", "base": 5e-324, "factor": 1e308}
    settings.OUTBOX = {**settings.OUTBOX, "RETRY": bad}
    assert "outbox.E005" in {e.id for e in check_outbox_settings()}
    settings.OUTBOX = {
        **settings.OUTBOX,
        "RETRY": {},
        "DESTINATIONS": {"x": {"TRANSPORT": "locmem", "RETRY": bad}},
    }
    assert "outbox.E002" in {e.id for e in check_outbox_settings()}


delay_values = st.one_of(st.just(0), st.floats(min_value=0.001, max_value=30 * 24 * 3600))
policies = st.one_of(
    st.builds(
        RetryPolicy,
        strategy=st.just("exponential"),
        base=delay_values,
        factor=st.floats(min_value=1, max_value=100),
        max_delay=delay_values,
        jitter=st.sampled_from(["full", "equal", "none"]),
    ),
    st.builds(
        RetryPolicy,
        strategy=st.just("schedule"),
        delays=st.lists(delay_values, min_size=1, max_size=5).map(tuple),
    ),
)


@PROPERTY
@given(
    policy=policies,
    retry=st.integers(1, MAX_RETRIES_LIMIT),
    retry_after=st.none() | st.floats(allow_nan=True),
)
def test_retry_delay_never_raises_for_a_valid_policy(policy, retry, retry_after):
    delay = retry_delay(policy, retry, retry_after, random.Random(retry))
    assert math.isfinite(delay) and 0 <= delay <= 30 * 24 * 3600
    assert RetryPolicy.from_value(policy.to_dict()) == policy


# -- properties of send() -------------------------------------------------------------------

TOKEN = st.from_regex(r"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}\Z")
FIELD_VALUE = st.from_regex(r"\A(?:[\x21-\x7e](?:[ \t]{0,2}[\x21-\x7e]){0,30})?\Z")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.one_of(st.binary(max_size=200), st.text(max_size=200), json_values)
header_maps = st.one_of(
    st.none(),
    st.dictionaries(TOKEN, FIELD_VALUE, max_size=4),
    st.dictionaries(st.text(max_size=12), st.text(max_size=20), max_size=3),
    st.lists(st.text(max_size=5), max_size=2),
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(["application/json", "text/plain; charset=utf-8", "application/x-thing+json; v=1"]),
    st.text(max_size=40),
    st.from_regex(r"\A[a-z]{1,8}/[a-z.+-]{1,8}(; ?[a-z]{1,5}=[A-Za-z0-9-]{1,6})?\Z"),
)
retries = st.one_of(
    st.none(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3),
    st.dictionaries(
        st.sampled_from(["strategy", "base", "factor", "max_delay", "jitter", "delays", "bogus"]),
        st.one_of(st.floats(allow_nan=True), st.integers(-(10**20), 10**20), st.text(max_size=8)),
        max_size=4,
    ),
)
send_arguments = st.fixed_dictionaries(
    {},
    optional={
        "content_type": content_types,
        "headers": header_maps,
        "idempotency_key": st.none() | st.text(max_size=30) | st.integers(),
        "max_retries": st.none() | st.integers(-5, 2000) | st.floats(allow_nan=True),
        "retry": retries,
        "delay": st.none() | st.floats(allow_nan=True) | st.integers(-10, 10**500),
        "priority": st.none() | st.sampled_from(["high", "default", "low"]) | st.text(max_size=6),
    },
)


def _expected_body(body) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode()


@PROPERTY
@given(body=bodies, kwargs=send_arguments)
def test_send_either_refuses_and_writes_nothing_or_round_trips(redis, body, kwargs):
    redis.flushdb()
    try:
        message = outbox.send("mem", body, **kwargs)
    except outbox.InvalidMessage:
        assert redis.dbsize() == 0
        return
    except UnicodeEncodeError:  # a str body with lone surrogates must be InvalidMessage too
        pytest.fail("UnicodeEncodeError escaped send()")
    stored = outbox.get(message.id)
    assert stored.body == _expected_body(body)
    assert stored.content_type == message.content_type
    if kwargs.get("content_type"):
        assert stored.content_type == kwargs["content_type"]
    assert stored.headers == (kwargs.get("headers") or {})
    assert stored.idempotency_key == kwargs.get("idempotency_key")
    assert stored.status == "pending"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(st.text(max_size=300), json_values),
    headers=st.dictionaries(TOKEN, FIELD_VALUE, max_size=3),
)
def test_a_sample_is_delivered_byte_exact_with_a_valid_signature(redis, receiver, body, headers):
    redis.flushdb()
    receiver.requests.clear()
    with with_destinations(
        "webhook", signed={"OPTIONS": {"url": receiver.url, "secret": SECRET, "timeout": 5}}
    ):
        try:
            message = outbox.send("signed", body, headers=headers)
        except outbox.InvalidMessage:
            assert redis.dbsize() == 0
            return
        report = deliver_queue(message.queue)
    assert report.outcomes == {message.id: "succeeded"}
    (request,) = receiver.requests
    assert request.body == _expected_body(body)
    # Webhook.verify would also parse the body as JSON; check the signature alone.
    timestamp = datetime.fromtimestamp(int(request.headers["webhook-timestamp"]), tz=timezone.utc)
    expected = Webhook(SECRET).sign(message.id, timestamp, request.body.decode())
    assert request.headers["webhook-signature"] == expected
    for name, value in headers.items():
        assert request.headers[name.lower()] == value
