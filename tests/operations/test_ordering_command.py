"""``manage.py outbox_ordering`` (issue 23): list the blocked ordering keys, release one by
requeueing or cancelling its head. Real Redis, real workers (a locmem destination that
fails on purpose), the command run with ``call_command``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import outbox
from tests.support.console import BLOCKING_ERROR, blocked_key

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("outbox_ordering", *args, stdout=out)
    return out.getvalue()


def test_blocked_lists_each_key_tab_separated_longest_blocked_first(worker):
    k1 = blocked_key(worker, "k1", behind=2)
    k2 = blocked_key(worker, "order 42 é", behind=0)
    h1 = blocked_key(worker, "h1", behind=1, destination="poison")
    lines = run("blocked").splitlines()
    assert lines[0].split("\t") == ["destination", "key", "head", "retries", "since", "waiting", "error"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [(r[0], r[1], r[2], r[3], r[5], r[6]) for r in rows] == [
        ("mem", "k1", k1[0].id, "0/3", "2", BLOCKING_ERROR),
        ("mem", "order 42 é", k2[0].id, "0/3", "0", BLOCKING_ERROR),
        ("poison", "h1", h1[0].id, "0/3", "1", BLOCKING_ERROR),
    ]
    assert all(r[4].endswith("Z") and len(r[4]) == len("2026-01-02T03:04:05.678Z") for r in rows)
    only = run("blocked", "--destination", "poison").splitlines()
    assert [line.split("\t")[1] for line in only[1:]] == ["h1"]


def test_blocked_with_none_says_so(repo):
    out = StringIO()
    err = StringIO()
    call_command("outbox_ordering", "blocked", stdout=out, stderr=err)
    assert out.getvalue().splitlines() == ["destination\tkey\thead\tretries\tsince\twaiting\terror"]
    assert "no blocked ordering key" in err.getvalue()


def test_release_requeue_and_cancel(worker):
    k1 = blocked_key(worker, "k1", behind=2)
    k2 = blocked_key(worker, "k2", behind=1)
    out = run("release", "mem", "k1", "--requeue")
    assert out.strip() == (
        f"mem: ordering key 'k1' released: its dead letter {k1[0].id} requeued; "
        "2 message(s) waiting behind it follow in order"
    )
    out = run("release", "mem", "k2", "--cancel")
    assert out.strip() == (
        f"mem: ordering key 'k2' released: its dead letter {k2[0].id} cancelled; "
        "the next of the 1 message(s) waiting behind it is due now"
    )
    assert outbox.blocked_keys("mem") == []
    worker(simple=True)  # mem delivers again
    assert [outbox.get(m.id).status for m in k1] == ["succeeded"] * 3
    assert [outbox.get(m.id).status for m in k2] == ["cancelled", "succeeded"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("release", "mem", "k1"), "one of the arguments --requeue --cancel is required"),
        (("release", "mem", "k1", "--requeue", "--cancel"), "not allowed with argument"),
        (("release", "mem", "free", "--requeue"), "ordering key 'free' of destination 'mem' is not blocked"),
        (("release", "nope", "k1", "--requeue"), "unknown destination 'nope'"),
        (("release", "mem", "bad\x00key", "--cancel"), "ordering_key must be 1 to 200 printable characters"),
        (("blocked", "--destination", "nope"), "unknown destination 'nope'"),
        (("release", "mem"), "the following arguments are required: key"),
    ],
)
def test_errors_are_command_errors_with_clear_text(worker, args, error):
    blocked_key(worker, "k1", behind=1)
    outbox.send("mem", {"n": 0}, ordering_key="free")
    with pytest.raises(CommandError, match=error):
        call_command("outbox_ordering", *args, stdout=StringIO())
    assert [b.key for b in outbox.blocked_keys("mem")] == ["k1"]  # nothing changed
