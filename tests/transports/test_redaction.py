"""Secrets never leave in clear (issue 6, item 2): the redaction function, the system
checks, InvalidMessage texts and the admin's detail page."""

from __future__ import annotations

import base64

import pytest

import outbox
from outbox.checks import check_outbox_settings
from outbox.redaction import REDACTED, is_sensitive_header, redact, redact_message_text, secrets_for
from tests.support import hook_settings, with_destinations
from tests.support.console import u

SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Proxy-Authorization",
        "X-Authentication",
        "X-Access-Key",
        "X-Auth",
        "X-Session-Id",
        "X-Private-Key",
        "X-Api-Key",
        "Cookie",
        "X-Token",
        "Client-Secret",
        "X-Password",
        "X-Signature",
        "X-Credentials",
    ],
)
def test_sensitive_header_names(name):
    assert is_sensitive_header(name)


@pytest.mark.parametrize("name", ["Content-Type", "X-Request-Id", "Accept", "X-Order"])
def test_ordinary_header_names(name):
    assert not is_sensitive_header(name)


def test_given_secrets_and_their_escaped_forms_are_removed():
    text = "LocalProtocolError: Illegal header value b'Bearer MSG-SECRET ' and 'it\\'s-a-secret'"
    out = redact(text, secrets=["Bearer MSG-SECRET ", "it's-a-secret"])
    assert "MSG-SECRET" not in out and "a-secret" not in out and out.count(REDACTED) == 2


def test_sensitive_header_values_are_removed():
    out = redact("got X-Session-Id=abcd1234zz back", headers={"X-Session-Id": "abcd1234zz", "X-Order": "42"})
    assert "abcd1234zz" not in out


@pytest.mark.parametrize(
    "echoed",
    [
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
        '{"authorization": "Basic dXNlcjpwYXNzd29yZA=="}',
        "cookie: sessionid=s3cr3tcookievalue",
        "X-Api-Key: sk_live_1234567890",
        "api_key=sk_live_1234567890&x=1",
        "client_secret: topsecretvalue1",
        "Bearer abcdefghijklmnop",
    ],
)
def test_authorization_style_values_in_echoed_text_are_removed(echoed):
    out = redact(f"HTTP 400 Bad Request: {echoed}")
    for secret in (
        "eyJhbGciOiJIUzI1NiJ9",
        "dXNlcjpwYXNzd29yZA",
        "s3cr3tcookievalue",
        "sk_live_1234567890",
        "topsecretvalue1",
        "abcdefghijklmnop",
    ):
        assert secret not in out
    assert out.startswith("HTTP 400 Bad Request: ")


@pytest.mark.parametrize(
    "text",
    [
        "SMTPAuthenticationError: (535, b'5.7.8 Username and Password not accepted')",
        "timed out (ReadTimeout) after 5s",
        "HTTP 503 Service Unavailable: try later",
        "Basic authentication failed",
    ],
)
def test_ordinary_error_texts_are_left_alone(text):
    assert redact(text) == text


def test_secrets_for_a_message_and_its_destination():
    found = secrets_for(
        {"Authorization": "Bearer m", "X-Order": "1"},
        {"secret": [SECRET], "headers": {"X-Api-Key": "dest-key"}, "url": "https://u:p%40ss@example.com/"},
    )
    assert {"Bearer m", SECRET, SECRET[len("whsec_") :], "dest-key", "p%40ss", "p@ss"} <= set(found)
    assert "1" not in found
    assert secrets_for(None, None) == [] and secrets_for({"a": "b"}, "not a dict") == []  # type: ignore[arg-type]


def test_redact_message_text_uses_the_destination_settings():
    with hook_settings("http://127.0.0.1:9/", OPTIONS={"headers": {"X-Api-Key": "DEST-SECRET-1"}}):
        message = outbox.Message(
            id="m", destination="hook", body=b"", content_type="a/b", headers={"X-Auth": "MSG-S-2"}
        )
        out = redact_message_text("echo DEST-SECRET-1 and MSG-S-2", message)
    assert "DEST-SECRET-1" not in out and "MSG-S-2" not in out


# -- checks and InvalidMessage never print secret values -------------------------------------


@pytest.mark.parametrize(
    "options,secret",
    [
        ({"url": "http://x/", "secret": "whsec_!!!NOT-BASE64-SECRETVALUE"}, "NOT-BASE64-SECRETVALUE"),
        ({"url": "http://x/", "secret": "whsec_c2hvcnQtc2VjcmV0"}, "c2hvcnQtc2VjcmV0"),
        ({"url": "http://x/", "secret": ["whsec_c2hvcnQtc2VjcmV0", 5]}, "c2hvcnQtc2VjcmV0"),
        ({"url": "http://user:hunter2pass@exa mple.com/"}, "hunter2pass"),
        ({"url": "http://x/", "headers": {"Authorization": "Bearer HDR-SECRET "}}, "HDR-SECRET"),
        ({"url": "http://x/", "headers": {"X-Api-Key": "KEY\nSECRET"}}, "SECRET"),
    ],
)
def test_e002_never_prints_a_secret(options, secret):
    with with_destinations("webhook", orders={"OPTIONS": options}):
        errors = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert len(errors) == 1
    assert secret not in errors[0].msg and secret not in (errors[0].hint or "")


def test_invalid_message_never_prints_a_header_value(redis):
    for value in ("Bearer MSG-SECRET ", "MSG-SECRET\n", "MSG-SECRET\x00"):
        with pytest.raises(outbox.InvalidMessage) as info:
            outbox.send("mem", "x", headers={"X-Auth": value})
        assert "MSG-SECRET" not in str(info.value)


# -- the admin detail page -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_detail_page_masks_sensitive_headers_and_redacts_errors(superuser_client, repo):
    headers = {
        "X-Authentication": "V-AUTHN-1",
        "X-Access-Key": "V-ACCESS-2",
        "X-Auth": "V-AUTH-3",
        "X-Session-Id": "V-SESSION-4",
        "X-Private-Key": "V-PRIVATE-5",
        "X-Order": "visible-42",
    }
    m = outbox.send("mem", {"a": 1}, headers=headers)
    repo.connection.hset(
        repo.keys.resend(m.id),
        "last_error",
        "HTTP 400: echoed X-Session-Id: V-SESSION-4 Authorization: Bearer zzzzzzzzzz",
    )
    html = superuser_client.get(u("message_detail", m.id)).content.decode()
    for value in ("V-AUTHN-1", "V-ACCESS-2", "V-AUTH-3", "V-SESSION-4", "V-PRIVATE-5", "zzzzzzzzzz"):
        assert value not in html, value
    assert "visible-42" in html
