"""The RQ job functions. Workers import this module by the dotted name ``outbox.jobs.deliver``."""

from __future__ import annotations

from collections.abc import Sequence


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
    from .conf import outbox_settings
    from .delivery import run

    queues = [queue] if isinstance(queue, str) else outbox_settings.queue_names
    summaries = {name: run(name).as_dict() for name in queues}
    return dict(summaries) if len(queues) > 1 else summaries[queues[0]]
