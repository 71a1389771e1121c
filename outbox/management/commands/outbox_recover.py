"""``python manage.py outbox_recover``: run one recovery sweep now (see :mod:`outbox.delivery.recovery`),
then wake every queue that has due messages and no waiting job. ``--repair-indexes``
first takes out of every index the entries whose message's record disagrees
(:func:`outbox.delivery.recovery.repair_indexes`)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from outbox.delivery.recovery import recover, repair_indexes, wake_due


class Command(BaseCommand):
    help = (
        "Take back messages from lost workers, delete finished messages past OUTBOX['RETENTION'], "
        "and wake queues whose due messages have no waiting job."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--repair-indexes",
            action="store_true",
            help="First check every index entry against its message's record and take out those that "
            "disagree (a message gone, or of another status): counts that lie. Reads every index.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["repair_indexes"]:
            repaired = repair_indexes()
            total = sum(repaired.values())
            self.stdout.write(
                f"repaired: {total} index entr{'y' if total == 1 else 'ies'} whose record disagreed"
                + (f" ({', '.join(f'{kind} {n}' for kind, n in sorted(repaired.items()))})" if total else "")
            )
        report = recover()
        woken = wake_due()
        self.stdout.write(
            f"recovered: {report.lost} from lost workers ({report.quarantined} lost beside other attempts, "
            f"quarantined; {report.lost_alone} lost while attempted alone), "
            f"{report.purged} deleted past their retention "
            f"({report.purge_backlog} left past retention), woke {len(woken)} queue(s)"
            + (f": {', '.join(woken)}" if woken else "")
        )
