"""Helpers of the console's tests (and the bulk commands'): messages made with
``outbox.send_many`` and moved between statuses with the repository's compare-and-set
transitions (or a real worker), never with mocks; users; the console's URLs and pages.
The fixtures that use them (``superuser``, ``superuser_client``, ``viewer_client``) are in
tests/conftest.py.
"""

from __future__ import annotations

import re
import time
from html import unescape

from django.contrib.auth.models import Permission
from django.urls import reverse

import outbox
from outbox.records import Message, Status
from outbox.store import Change
from tests.support.messages import settle_due, with_destinations


def make(repo, n: int, status: str = "pending", destination: str = "mem", **send) -> list[Message]:
    """Send ``n`` messages and move them from ``pending`` to ``status`` (one CAS call).

    Terminal statuses are scored "now" plus a microsecond per message, as a delivery
    would be; ``failed`` messages get a last error; ``sending`` a lease.
    """
    messages = outbox.send_many([{"destination": destination, "body": {"n": i}, **send} for i in range(n)])
    if status == Status.PENDING.value:
        return messages
    now = time.time()
    fields: dict[str, str] = {}
    if status == Status.FAILED.value:
        fields = {"last_error": "HTTP 500 from receiver", "last_status_code": "500", "retry_count": "3"}
    elif status == Status.SENDING.value:
        fields = {"lease": "test-lease"}
    elif status == Status.RETRYING.value:
        fields = {"last_error": "HTTP 503", "retry_count": "1"}
    changes = [
        Change(
            id=m.id, from_statuses=(Status.PENDING.value,), to=status, score=now + i * 1e-6, set=dict(fields)
        )
        for i, m in enumerate(messages)
    ]
    results = repo.transition(changes, now)
    assert all(r.applied for r in results)
    return messages


def deliver(receiver, worker, code: int, n: int, **send) -> list[Message]:
    """Send ``n`` messages to 'hook' that the receiver answers with ``code`` (``send``:
    more arguments of each message); run workers until none is due within a second."""
    receiver.respond(code)
    sent = outbox.send_many(
        [{"destination": "hook", "body": {"code": code, "i": i}, **send} for i in range(n)]
    )
    settle_due(worker, sent)
    return sent


#: The error of the dead letters :func:`blocked_key` makes.
BLOCKING_ERROR = "SMTP 550 5.1.1 mailbox unavailable"


def blocked_key(worker, key: str, behind: int = 2, destination: str = "mem") -> list[Message]:
    """Send ``1 + behind`` messages of ordering ``key`` to ``destination`` (a locmem
    destination that fails every delivery permanently, for the call only) and run a real
    worker: the head becomes a dead letter that blocks the key (policy "block"), the
    others wait behind it. Returns the messages in the order sent (the head first)."""
    failing = {"TRANSPORT": "locmem", "OPTIONS": {"fail_with": BLOCKING_ERROR, "permanent": True}}
    with with_destinations(**{destination: failing}):
        sent = [outbox.send(destination, {"key": key, "n": i}, ordering_key=key) for i in range(1 + behind)]
        worker(simple=True)
    got = [outbox.get(m.id).status for m in sent]
    assert got == ["failed"] + ["waiting"] * behind, got
    return sent


def statuses(messages) -> set[str]:
    """The current status of each of ``messages``."""
    return {outbox.get(m.id).status for m in messages}


def ids(messages) -> set[str]:
    return {m.id for m in messages}


def staff(django_user_model, username: str, *codenames: str):
    """A staff user holding these ``outbox`` permissions (and no others)."""
    user = django_user_model.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
    )
    return user


def endpoint_form(app, url: str = "https://93.184.215.14/hook", **over: str) -> dict:
    """The admin's endpoint add (or change) form, as a browser posts it, for ``app``."""
    data = {
        "application": app.pk,
        "url": url,
        "uid": "",
        "description": "",
        "filter_types": "[]",
        "channels": "[]",
        "rate_limit": "",
        "headers": "{}",
        "metadata": "{}",
    }
    data.update(over)
    return data


def u(name: str, *args: str) -> str:
    """``reverse("admin:outbox_<name>")``."""
    return reverse(f"admin:outbox_{name}", args=args)


def text_of(response) -> str:
    return response.content.decode()


def element_text(html: str, element_id: str) -> str:
    """The text inside the element with this id (no nested tags expected)."""
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*>([^<]*)<', html)
    assert match, f"no element #{element_id}"
    return match.group(1).strip()


def listed_ids(html: str) -> list[str]:
    """Message ids in the list's rows, in order."""
    return re.findall(r'<tr data-message-id="([^"]+)"', html)


def post(client, data: dict, confirm: bool = False):
    """POST the action form (and, with ``confirm``, the confirmation)."""
    return client.post(u("message_action"), {**data, **({"post": "yes"} if confirm else {})})


def messages_of(response) -> list[str]:
    """The texts of the messages shown to the user (without the batch link)."""
    return [re.sub(r" <a [^>]*>.*</a>$", "", str(m)) for m in response.wsgi_request._messages]


def batch_links(response) -> list[str]:
    """The batch links ("Show the N messages requeued") of the messages shown to the user."""
    return [
        unescape(h) for m in response.wsgi_request._messages for h in re.findall(r'href="([^"]+)"', str(m))
    ]
