"""The bulk management commands (``outbox_requeue``, ``outbox_purge``): one base class
with the console's filters, a dry-run count, a confirmation prompt and a progress bar.

Options (all optional)::

    --status S            a status to act on; repeat for several (default: per command)
    --destination D       only messages to this destination
    --queue Q             only messages on this django-rq queue
    --created-after T     --created-before T     --updated-after T     --updated-before T
                          T: 2025-11-21T10:30, 2025-11-21, 7d / 12h / 30m ago, or epoch seconds
    --status-code N       only messages whose last attempt had HTTP status N (e.g. 503)
    --error-class C       only messages whose last failure was of class C (timeout, http...)
    --dry-run             print how many messages match, change nothing
    --yes, --no-input     do not ask for confirmation

Messages that match only after the command started (created later, or finished
later) are left alone; messages that change meanwhile are skipped and counted. The
ids acted on are kept as a batch for 24 hours (:mod:`outbox.operations.batches`); the command
prints its token, and the console lists it at ``messages/?batch=<token>``.

Errors are one line (a ``CommandError``): Redis unreachable (with what to check), or a
``--destination`` that is unknown (``outbox_requeue``: not in ``OUTBOX["DESTINATIONS"]``,
as ``send()`` says; ``outbox_purge``: neither configured nor ever used, so messages of a
destination removed from the settings can still be purged).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from outbox.destinations.config import get_destination
from outbox.exceptions import UnknownDestination
from outbox.operations.actions import ActionResult
from outbox.operations.batches import TTL as BATCH_TTL
from outbox.operations.batches import recorder_for
from outbox.operations.operation import Operation, Selection, execute
from outbox.store import get_repository
from outbox.store.client.connection import redis_location
from outbox.store.reads.queries import Count, MessageFilter, TimeRange, count_matching
from outbox.store.repository import MessageRepository
from outbox.times import parse_time

TIME_OPTIONS = ("created_after", "created_before", "updated_after", "updated_before")


def _time(value: str) -> float:
    try:
        return parse_time(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _status_code(value: str) -> int:
    if not value.isdigit() or not 100 <= int(value) <= 599:
        raise argparse.ArgumentTypeError(f"{value!r} is not an HTTP status code (100-599)")
    return int(value)


class Progress:
    """A one-line text progress bar rewritten in place on a stream (``\\r``)."""

    WIDTH = 30

    def __init__(self, stream: Any, op: Operation, total: Count) -> None:
        self.stream = stream
        self.op = op
        self.total = total
        self.done = ActionResult()
        self.base = ActionResult()

    def __call__(self, acted: int, skipped: int) -> None:
        self.done = ActionResult(self.base.acted + acted, self.base.skipped + skipped)
        n = self.done.acted + self.done.skipped
        whole = max(self.total.n, n, 1)
        filled = int(self.WIDTH * n / whole)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        about = "" if self.total.exact else "≥"
        self.stream.write(
            f"\r{self.op.name} [{bar}] {n:,}/{about}{self.total.n:,}: {self.done.acted:,} {self.op.past}, "
            f"{self.done.skipped:,} skipped",
            ending="",
        )
        self.stream.flush()

    def next_part(self) -> None:
        """Start counting the next status on top of what is done."""
        self.base = ActionResult(self.done.acted, self.done.skipped)


class BulkCommand(BaseCommand):
    """Base of a bulk command; subclasses set ``operation`` and ``default_statuses``."""

    operation: Operation
    default_statuses: tuple[str, ...]

    def operation_for(self, options: dict[str, Any]) -> Operation:
        """The operation to run (a command may offer another with an option)."""
        return self.operation

    def statuses_of(self) -> tuple[str, ...]:
        """Every status ``--status`` accepts."""
        return self.operation.statuses

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--status",
            action="append",
            choices=self.statuses_of(),
            help=f"status to act on; repeat for several (default: {', '.join(self.default_statuses)})",
        )
        parser.add_argument("--destination", help="only messages to this destination")
        parser.add_argument("--queue", help="only messages on this django-rq queue")
        for name in TIME_OPTIONS:
            parser.add_argument(
                "--" + name.replace("_", "-"),
                type=_time,
                metavar="TIME",
                help="2025-11-21T10:30, 2025-11-21, 7d/12h/30m ago, or epoch seconds",
            )
        parser.add_argument(
            "--status-code",
            type=_status_code,
            metavar="N",
            help="only messages whose last attempt had this HTTP status (e.g. 503)",
        )
        parser.add_argument(
            "--error-class",
            metavar="CLASS",
            help="only messages whose last failure was of this class (http, timeout, ConnectError...)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print how many messages match; change nothing"
        )
        parser.add_argument(
            "--yes",
            "-y",
            "--no-input",
            "--noinput",
            action="store_false",
            dest="interactive",
            help="do not ask for confirmation",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self.run(**options)
        except RedisError as exc:
            hint = f"is the Redis server of {redis_location()} running and reachable from this process?"
            raise CommandError(
                f"cannot reach Redis ({type(exc).__name__}: {str(exc)[:200]}); nothing changed. {hint}"
            ) from None

    def check_destination(self, repo: MessageRepository, name: str) -> None:
        """Refuse an unknown ``--destination`` (see the module docstring).

        Raises:
            CommandError: it is unknown.
        """
        try:
            get_destination(name)
            return
        except UnknownDestination as exc:
            if self.operation.name == "requeue" or name not in repo.destinations():
                raise CommandError(str(exc)) from None
        except ImproperlyConfigured as exc:
            if self.operation.name == "requeue":
                raise CommandError(f"destination {name!r} cannot be used: {exc}") from None

    def default_statuses_for(self, op: Operation) -> tuple[str, ...]:
        return self.default_statuses

    def run(self, **options: Any) -> None:
        """The command's work (:meth:`handle` turns Redis errors into one line)."""
        op = self.operation_for(options)
        repo = get_repository()
        if options["destination"]:
            self.check_destination(repo, options["destination"])
        statuses = list(dict.fromkeys(options["status"] or self.default_statuses_for(op)))
        wrong = [s for s in statuses if s not in op.statuses]
        if wrong:
            raise CommandError(
                f"{op.label} acts on {', '.join(op.statuses)} messages, not {', '.join(wrong)}."
            )
        flt = MessageFilter(
            destination=options["destination"] or None,
            queue=options["queue"] or None,
            created=TimeRange(options["created_after"], options["created_before"]),
            updated=TimeRange(options["updated_after"], options["updated_before"]),
            status_code=options.get("status_code"),
            error_class=options.get("error_class") or None,
        )
        as_of = time.time()
        # What Selection(filter=flt.with_status(s), as_of=as_of).count(repo, op) sums over
        # the statuses (each one of op.statuses, checked above).
        total = count_matching(repo, Selection(filter=flt, as_of=as_of).filter_for(op), statuses)
        what = self.describe(statuses, options)
        about = "" if total.exact else "at least "
        self.stdout.write(f"{about}{total.n:,} message(s) match: {what}.")
        if options["dry_run"]:
            self.stdout.write("Dry run: nothing changed.")
            return
        if total.exact and total.n == 0:
            self.stdout.write("Nothing to do.")
            return
        if options["interactive"] and not self.confirm(f"{op.label} {about}{total.n:,} message(s)? [y/N] "):
            raise CommandError("Cancelled: nothing changed.")
        progress = Progress(self.stderr, op, total)
        result = ActionResult()
        recorder = recorder_for(repo, op)
        for status in statuses:
            selection = Selection(filter=flt.with_status(status), as_of=as_of)
            result.add(execute(repo, op, selection, progress, applied=recorder))
            progress.next_part()
        self.stderr.write("")
        line = f"{result.acted:,} {op.past}"
        if result.skipped:
            line += f", {result.skipped:,} skipped (in another status or changed meanwhile)"
        self.stdout.write(line + ".")
        if recorder is not None and result.acted:
            self.stdout.write(
                f"Batch {recorder.token}: the messages acted on, kept for {BATCH_TTL // 3600} hours "
                f"(console: messages/?batch={recorder.token})."
            )

    def describe(self, statuses: list[str], options: dict[str, Any]) -> str:
        parts = [f"status {' or '.join(statuses)}"]
        for name in ("destination", "queue", "status_code", "error_class", *TIME_OPTIONS):
            if options.get(name) is not None:
                value = options[name]
                if name in TIME_OPTIONS:
                    value = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
                parts.append(f"{name.replace('_', ' ')} {value}")
        return ", ".join(parts)

    def confirm(self, question: str) -> bool:
        """Ask on the terminal; False when there is none (use ``--yes`` in scripts)."""
        if not sys.stdin or not sys.stdin.isatty():
            raise CommandError("Not a terminal: pass --yes (or --no-input) to act without confirmation.")
        return input(question).strip().lower() in ("y", "yes")
