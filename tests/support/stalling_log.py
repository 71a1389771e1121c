"""A log formatter that stalls on RQ's "Listening on" line, for the worker process test
of a stop signal that arrives inside a ``logging`` call (tests/settings.py installs it on
RQ's worker logger when ``OUTBOX_TEST_STALL_FILE`` is set).

On that line (logged by RQ's ``dequeue_job_and_maintain_ttl``, with its own signal
handlers in place, just before it waits for a job) it touches the file ``OUTBOX_TEST_STALL_FILE`` names, then sleeps
:data:`STALL_SECONDS`: a signal sent meanwhile runs its Python handler inside the
handler's ``emit``, whose ``except Exception`` swallows what the signal handler raises
(RQ's ``StopRequested``), as it does by chance in a real worker."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

STALL_SECONDS = 3.0


class StallingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        path = os.environ.get("OUTBOX_TEST_STALL_FILE")
        listening = (
            record.funcName == "dequeue_job_and_maintain_ttl" and "Listening on" in record.getMessage()
        )
        if path and listening and not Path(path).exists():
            Path(path).touch()
            time.sleep(STALL_SECONDS)
        return super().format(record)
