"""``python manage.py outbox_recover``: run one recovery sweep now (see :mod:`outbox.recovery`)."""

from __future__ import annotations

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Take back messages from lost workers, re-enqueue due messages that have no live job, "
        "and delete finished messages past OUTBOX['RETENTION']."
    )

    def handle(self, *args, **options):
        from outbox.recovery import recover

        report = recover()
        self.stdout.write(
            f"recovered: {report.lost} from lost workers, {report.reenqueued} re-enqueued, "
            f"{report.purged} deleted past their retention"
        )
