"""Worker warnings and options (issue 9): a plain rqworker says that nobody runs the
housekeeping; outbox_worker's heartbeat silences it; --sentry-dsn."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command

import outbox


def _plain_rq_burst():
    from django_rq import get_queue
    from rq import SimpleWorker

    from outbox.conf import outbox_settings

    queues = [get_queue(name) for name in outbox_settings.queue_names]
    SimpleWorker(queues, connection=queues[0].connection).work(burst=True)


@pytest.fixture
def fresh_check(monkeypatch):
    import outbox.jobs

    monkeypatch.setattr(outbox.jobs, "_housekeeping_checked", 0)


def test_a_plain_rqworker_warns_that_no_housekeeping_runs(hook, fresh_check, caplog):
    m = outbox.send("hook", {"n": 1})
    with caplog.at_level(logging.WARNING, logger="outbox"):
        _plain_rq_burst()
    assert outbox.get(m.id).status == "succeeded"  # it delivers ...
    assert "no outbox_worker is running its housekeeping" in caplog.text  # ... and says what it skips


def test_no_warning_while_an_outbox_worker_runs_its_housekeeping(hook, fresh_check, caplog, worker):
    from outbox.delivery.worker import housekeeping_seen

    assert housekeeping_seen() is None
    worker()  # an outbox worker's housekeeping pass beats
    assert housekeeping_seen()
    outbox.send("hook", {"n": 2})
    with caplog.at_level(logging.WARNING, logger="outbox"):
        _plain_rq_burst()
    assert "no outbox_worker is running" not in caplog.text


def test_sentry_dsn_without_sentry_sdk_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sentry(name, *args, **kwargs):
        if name.startswith("sentry_sdk"):
            raise ImportError("No module named 'sentry_sdk'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sentry)
    with pytest.raises(CommandError, match="pip install sentry-sdk"):
        call_command("outbox_worker", "--burst", "--sentry-dsn", "https://key@example.invalid/1")
