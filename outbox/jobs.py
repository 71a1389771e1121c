"""The RQ job functions. Workers import this module by the dotted name ``outbox.jobs.deliver``."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from outbox.conf import outbox_settings
from outbox.delivery.loop import run
from outbox.delivery.worker import housekeeping_seen

logger = logging.getLogger("outbox")
_housekeeping_checked = 0  # pid of the process that checked (a forked work horse checks anew)


def warn_without_housekeeping() -> None:
    """Log a warning, once per process, when no ``outbox_worker`` runs the housekeeping
    (a plain ``rqworker`` on the outbox queues delivers, but does none of it)."""
    global _housekeeping_checked
    if _housekeeping_checked == os.getpid():
        return
    _housekeeping_checked = os.getpid()

    try:
        if housekeeping_seen():
            return
    except Exception:  # Redis trouble shows up in the delivery itself
        return
    logger.warning(
        "outbox: no outbox_worker is running its housekeeping: this worker delivers the wake-up "
        "jobs, but due retries and delayed messages wait for the next send, attempts lost with a "
        "crashed worker are not taken back, and messages captured in transactions are not relayed. "
        "Run `manage.py outbox_worker` (it accepts queue names, --burst, --max-jobs like rqworker)."
    )


def deliver(queue: str | Sequence[str]) -> dict[str, object]:
    """Wake-up job: claim and deliver the due messages of ``queue`` (see
    :func:`outbox.delivery.run`).

    Args:
        queue: the outbox queue name. A list of message ids (the argument of jobs
            enqueued by versions before 0.2) wakes every outbox queue instead.

    Returns:
        A summary (``{"claimed": n, "outcomes": {status: n}, ...}``); RQ keeps no result
        of delivery jobs (``result_ttl=0``).
    """

    warn_without_housekeeping()
    queues = [queue] if isinstance(queue, str) else outbox_settings.queue_names
    if len(queues) > 1:
        summaries: dict[str, object] = {name: run(name).as_dict() for name in queues}
        return summaries
    return run(queues[0]).as_dict()
