"""``python manage.py outbox_recover``: run one recovery sweep now (see :mod:`outbox.delivery.recovery`),
then wake every queue that has due messages and no waiting job."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from outbox.delivery.recovery import recover, wake_due


class Command(BaseCommand):
    help = (
        "Take back messages from lost workers, delete finished messages past OUTBOX['RETENTION'], "
        "and wake queues whose due messages have no waiting job."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = recover()
        woken = wake_due()
        self.stdout.write(
            f"recovered: {report.lost} from lost workers ({report.quarantined} lost beside other attempts, "
            f"quarantined; {report.lost_alone} lost while attempted alone), "
            f"{report.purged} deleted past their retention "
            f"({report.purge_backlog} left past retention), woke {len(woken)} queue(s)"
            + (f": {', '.join(woken)}" if woken else "")
        )
