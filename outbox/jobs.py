"""The RQ job functions. Workers import this module by the dotted name ``outbox.jobs.deliver``."""

from __future__ import annotations

from collections.abc import Sequence


def deliver(message_ids: Sequence[str]) -> dict[str, object]:
    """Deliver a batch of messages (see :func:`outbox.delivery.deliver_batch`).

    Args:
        message_ids: ids to claim and deliver; ids not due or already taken are skipped.

    Returns:
        ``{"claimed": n, "skipped": n, "outcomes": {status: n}}``, kept by RQ as the job result.
    """
    from .delivery import deliver_batch

    return deliver_batch(message_ids).as_dict()
