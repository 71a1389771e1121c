"""The bulk management commands ``outbox_requeue`` and ``outbox_purge`` against the real test Redis."""

from __future__ import annotations

import io
import sys
import time

import pytest
from django.core.management import CommandError, call_command

import outbox
from tests.support.console import make, statuses

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


def run(name: str, *args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_requeue_dry_run_counts_and_changes_nothing(repo):
    make(repo, 7, "failed", destination="hook")
    make(repo, 2, "failed", destination="mem")
    out, _ = run("outbox_requeue", "--destination", "hook", "--dry-run")
    assert "7 message(s) match: status failed, destination hook." in out
    assert "Dry run: nothing changed." in out
    assert repo.counts()["failed"] == 9


def test_requeue_acts_with_yes_and_shows_progress(repo):
    hook_failed = make(repo, 7, "failed", destination="hook")
    mem_failed = make(repo, 2, "failed", destination="mem")
    out, err = run("outbox_requeue", "--destination", "hook", "--yes")
    assert "7 requeued." in out
    assert "\rrequeue [##############################] 7/7: 7 requeued, 0 skipped" in err
    assert statuses(hook_failed) == {"pending"}
    assert statuses(mem_failed) == {"failed"}
    assert {outbox.get(m.id).retry_count for m in hook_failed} == {0}


def test_requeue_several_statuses_and_a_queue(repo):
    failed_high = make(repo, 2, "failed", priority="high")
    cancelled_high = make(repo, 3, "cancelled", priority="high")
    failed_default = make(repo, 4, "failed")
    args = ("--status", "failed", "--status", "cancelled", "--queue", "outbox_high")
    out, _ = run("outbox_requeue", *args, "--dry-run")
    assert "5 message(s) match: status failed or cancelled, queue outbox_high." in out
    out, _ = run("outbox_requeue", *args, "--no-input")
    assert "5 requeued." in out
    assert statuses(failed_high + cancelled_high) == {"pending"}
    assert statuses(failed_default) == {"failed"}


def test_requeue_time_ranges(repo):
    old = make(repo, 2, "failed")
    time.sleep(0.05)
    cut = repr(time.time())
    time.sleep(0.05)  # created_at is read from the id, to the millisecond
    new = make(repo, 3, "failed")
    out, _ = run("outbox_requeue", "--created-before", cut, "--yes")
    assert "2 requeued." in out
    assert statuses(old) == {"pending"} and statuses(new) == {"failed"}
    out, _ = run("outbox_requeue", "--updated-after", cut, "--updated-before", "2999-01-01", "--yes")
    assert "3 requeued." in out
    out, _ = run("outbox_requeue", "--created-after", "1h", "--dry-run")
    assert "0 message(s) match" in out


def test_requeue_refuses_without_a_terminal_or_yes(repo, monkeypatch):
    make(repo, 2, "failed")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(CommandError, match="pass --yes"):
        run("outbox_requeue")
    assert repo.counts()["failed"] == 2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("answer, acted", [("y\n", True), ("n\n", False)])
def test_requeue_asks_on_a_terminal(repo, monkeypatch, answer, acted):
    make(repo, 2, "failed")
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    if acted:
        out, _ = run("outbox_requeue")
        assert "2 requeued." in out
    else:
        with pytest.raises(CommandError, match="Cancelled"):
            run("outbox_requeue")
    assert repo.counts()["failed"] == (0 if acted else 2)


def test_bad_time_is_a_command_error(repo):
    with pytest.raises(CommandError, match="not a time"):
        run("outbox_requeue", "--created-after", "last tuesday")


def test_purge_defaults_to_finished_messages(repo):
    make(repo, 3, "succeeded")
    make(repo, 2, "failed")
    make(repo, 1, "cancelled")
    pending = make(repo, 4)
    sending = make(repo, 1, "sending")
    out, _ = run("outbox_purge", "--dry-run")
    assert "6 message(s) match: status succeeded or failed or cancelled." in out
    out, err = run("outbox_purge", "--yes")
    assert "6 deleted." in out
    assert "6/6: 6 deleted, 0 skipped" in err
    assert repo.count() == 5
    assert statuses(pending) == {"pending"} and statuses(sending) == {"sending"}


def test_purge_old_succeeded_only(repo):
    old = make(repo, 3, "succeeded")
    time.sleep(0.05)
    cut = repr(time.time())
    recent = make(repo, 2, "succeeded")
    out, _ = run("outbox_purge", "--status", "succeeded", "--updated-before", cut, "--yes")
    assert "3 deleted." in out
    assert all(m is None for m in repo.get_many([m.id for m in old]))
    assert statuses(recent) == {"succeeded"}


def test_nothing_to_do(repo):
    out, _ = run("outbox_purge", "--yes")
    assert "0 message(s) match" in out and "Nothing to do." in out
