"""``python manage.py outbox_recover``: run one recovery sweep now (see :mod:`outbox.delivery.recovery`),
then wake every queue that has due messages and no waiting job. ``--repair-indexes``
first takes out of every index the entries whose message's record disagrees
(:func:`outbox.delivery.recovery.repair_indexes`).

``--adopt-captured IDENTITY`` does only this instead: re-tag the captured rows of
deployment ``IDENTITY`` (stranded: no running relay has that identity any more) as this
deployment's, so its relay pushes them (:func:`outbox.sending.stranded.adopt`); with
``--dry-run``, count them and change nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outbox.delivery.recovery import recover, repair_indexes, wake_due
from outbox.sending import deployment, stranded
from outbox.sending.capture import relay_databases


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

        parser.add_argument(
            "--adopt-captured",
            metavar="IDENTITY",
            help="Instead, re-tag the messages captured in the database under deployment IDENTITY "
            "(the relay's warning names it) as this deployment's, so this deployment's relay pushes "
            "them into its Redis. Rows whose idempotency key this deployment has captured too are "
            "left and listed.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="with --adopt-captured: count, change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["adopt_captured"] is not None:
            self.adopt(options["adopt_captured"], dry_run=options["dry_run"])
            return
        if options["dry_run"]:
            raise CommandError("--dry-run goes with --adopt-captured")
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

    def adopt(self, identity: str, *, dry_run: bool) -> None:
        """Adopt ``identity``'s captured rows and say how many (see the module docstring).

        Raises:
            CommandError: ``identity`` is this deployment's own or empty (legacy rows).
        """
        own = deployment.current()
        try:
            report = stranded.adopt(identity, relay_databases(), dry_run=dry_run)
        except ValueError as exc:
            if identity == deployment.LEGACY:
                raise CommandError(
                    "refusing --adopt-captured '': that is the identity of legacy rows, which every "
                    "relay pushes already; give the identity the relay's warning names"
                ) from exc
            raise CommandError(
                f"refusing --adopt-captured {identity!r}: that is this deployment's own identity, "
                "whose rows its relay pushes already; give another deployment's identity, as the "
                "relay's warning names it"
            ) from exc
        per_database = ", ".join(f"{alias} {n}" for alias, n in report.adopted.items())
        self.stdout.write(
            f"{'would adopt' if dry_run else 'adopted'} {report.total} captured message(s) of deployment "
            f"{identity!r} into this deployment {own!r} ({per_database})"
            + (
                "; this deployment's relay pushes them at its next pass"
                if report.total and not dry_run
                else ""
            )
        )
        if report.left:
            self.stdout.write(
                f"{len(report.left)} left under {identity!r}: this deployment has captured a message "
                f"of the same destination and idempotency key (both kept): {', '.join(report.left)}"
            )
