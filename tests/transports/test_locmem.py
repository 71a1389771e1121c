"""The locmem transport (for projects' own tests) and choosing transports by alias or path."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

import outbox
from outbox.transports import ALIASES, DeliveryResult, Transport, locmem, transport_class
from outbox.transports.locmem import LocmemTransport
from tests.support import assert_index_invariant, with_destinations


@pytest.fixture(autouse=True)
def empty_outbox():
    locmem.outbox.clear()
    yield
    locmem.outbox.clear()


def test_delivered_messages_are_appended_in_order(worker, repo):
    first = outbox.send("mem", {"n": 1})
    second = outbox.send("mem", "two", headers={"X-N": "2"})
    worker(simple=True)
    assert [m.id for m in locmem.outbox] == [first.id, second.id]
    assert locmem.outbox[0].json() == {"n": 1}
    assert (locmem.outbox[1].text, locmem.outbox[1].headers) == ("two", {"X-N": "2"})
    assert {outbox.get(m.id).status for m in (first, second)} == {"succeeded"}
    assert_index_invariant(repo)


def test_fail_with_is_retried_until_a_dead_letter(worker, repo):
    with with_destinations(
        down={
            "TRANSPORT": "locmem",
            "OPTIONS": {"fail_with": "receiver down"},
            "RETRY": [0],
            "MAX_RETRIES": 2,
        }
    ):
        m = outbox.send("down", "x")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, got.last_error) == ("failed", 2, "receiver down")
    assert [a.error for a in outbox.attempts(m.id)] == ["receiver down"] * 3
    assert locmem.outbox == []
    assert_index_invariant(repo)


def test_fail_with_permanent_fails_at_once(worker):
    options = {"fail_with": "no such account", "permanent": True}
    with with_destinations(gone={"TRANSPORT": "locmem", "OPTIONS": options, "RETRY": [0], "MAX_RETRIES": 5}):
        m = outbox.send("gone", "x")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, got.last_error) == ("failed", 0, "no such account")
    assert locmem.outbox == []


@pytest.mark.parametrize(
    "options,match",
    [
        ({"fail_with": 500}, "OPTIONS\\['fail_with'\\] must be a str"),
        ({"fail_with": "x", "permanent": "yes"}, "OPTIONS\\['permanent'\\] must be a bool"),
        (
            {"fail": "x"},
            "unknown option\\(s\\) for LocmemTransport: fail \\(accepted: fail_with, permanent\\)",
        ),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        LocmemTransport("mem", **options)


# -- transport_class: aliases and dotted paths -----------------------------------------------------


class Upper(Transport):
    """A project's own transport: a plug-in by dotted path."""

    options = ("suffix",)
    seen: list[str] = []

    def __init__(self, destination, **options):
        super().__init__(destination, **options)
        self.suffix = options.get("suffix", "")

    def deliver(self, message):
        Upper.seen.append(message.text.upper() + self.suffix)
        return DeliveryResult(detail="ok")


class NotATransport:
    pass


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases_name_transport_classes(alias):
    cls = transport_class(alias)
    assert issubclass(cls, Transport) and cls.__module__ == f"outbox.transports.{alias}"


def test_a_dotted_path_transport_delivers(worker):
    Upper.seen.clear()
    entry = {"TRANSPORT": f"{__name__}.Upper", "OPTIONS": {"suffix": "!"}, "RETRY": [0]}
    with with_destinations(shout=entry):
        m = outbox.send("shout", "hello")
        worker(simple=True)
    assert outbox.get(m.id).status == "succeeded" and Upper.seen == ["HELLO!"]


@pytest.mark.parametrize(
    "path,match",
    [
        ("smtp", "neither an alias \\(webhook, email, callable, locmem\\) nor an importable class"),
        ("no.such.Transport", "nor an importable class"),
        (f"{__name__}.NotATransport", "is not a subclass of outbox.transports.Transport"),
        ("outbox.transports.webhook.parse_retry_after", "is not a subclass"),
    ],
)
def test_bad_transport_names(path, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        transport_class(path)


def test_base_transport_refuses_options_and_has_no_deliver():
    with pytest.raises(
        ImproperlyConfigured, match="unknown option\\(s\\) for Transport: x \\(accepted: none\\)"
    ):
        Transport("d", x=1)
    message = outbox.Message(id="msg_1", destination="d", body=b"", content_type="text/plain")
    with pytest.raises(NotImplementedError):
        Transport("d").deliver(message)
    assert Transport("d").check_message(b"", "text/plain", {}) is None
