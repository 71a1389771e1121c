"""``python manage.py outbox_ordering {blocked,release}``: ordered delivery's blocked keys.

A key is blocked when the message at its head became a dead letter under the
``ORDERING`` policy ``"block"`` (the default): its later messages stay ``waiting`` until
the head is requeued (delivered again first, then the rest in order) or cancelled (the
next message becomes the head). See :mod:`outbox.operations.ordering`.

Examples::

    python manage.py outbox_ordering blocked                        # every destination
    python manage.py outbox_ordering blocked --destination orders
    python manage.py outbox_ordering release orders order-42 --requeue
    python manage.py outbox_ordering release orders order-42 --cancel

``blocked`` prints one tab-separated line per blocked key, the longest blocked first
within each destination, after a header line: ``destination``, ``key``, ``head`` (the
dead letter's id), ``retries`` (retry count/max retries), ``since`` (when the key was
blocked, UTC ISO 8601), ``waiting`` (messages behind the head), ``error`` (the dead
letter's last error on one line, secrets redacted). With none, only the header, and
"no blocked ordering key" on stderr. An ordering key holds printable characters only, so
it never holds a tab or a line break.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.destinations.health import known_destinations
from outbox.exceptions import InvalidMessage, MessageNotFound
from outbox.operations.ordering import BlockedKey, blocked_keys, release_key
from outbox.redaction import destination_options, redact, secrets_for
from outbox.sending.validation import clean_ordering_key
from outbox.store import get_repository

#: The columns of ``blocked``.
COLUMNS = ("destination", "key", "head", "retries", "since", "waiting", "error")


def _iso(epoch: float) -> str:
    """``2026-01-02T03:04:05.678Z``."""
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def blocked_line(b: BlockedKey) -> str:
    """One blocked key as a tab-separated line of :data:`COLUMNS`."""
    head = b.head
    error = ""
    if head is not None:
        secrets = secrets_for(head.headers, destination_options(b.destination))
        error = " ".join(redact(head.last_error or "", secrets=secrets).split())
    fields = (
        b.destination,
        b.key,
        head.id if head else "-",
        f"{head.retry_count}/{head.max_retries}" if head else "-",
        _iso(b.since),
        str(b.waiting),
        error or "-",
    )
    return "\t".join(fields)


class Command(BaseCommand):
    help = (
        "List the blocked ordering keys (blocked), or release one by requeueing or cancelling "
        "the dead letter at its head (release DESTINATION KEY --requeue|--cancel)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)  # CommandParsers: errors raise
        blocked = actions.add_parser("blocked", help="list the blocked ordering keys, tab-separated")
        blocked.add_argument("--destination", help="only this destination's (default: every destination)")
        release = actions.add_parser("release", help="requeue or cancel the dead letter at a key's head")
        release.add_argument("destination", help="the destination")
        release.add_argument("key", help="the ordering key, exactly (quote it when it has spaces)")
        how = release.add_mutually_exclusive_group(required=True)
        how.add_argument(
            "--requeue",
            action="store_const",
            dest="how",
            const="requeue",
            help="deliver it again first (a fresh retry budget), then the key's other messages in order",
        )
        how.add_argument(
            "--cancel",
            action="store_const",
            dest="how",
            const="cancel",
            help="cancel it: the next message of the key becomes the head",
        )

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "blocked":
            self.blocked(options.get("destination"))
        else:
            self.release(options["destination"], options["key"], options["how"])

    def _check_known(self, name: str) -> None:
        known = known_destinations()
        if name not in known:
            raise CommandError(
                f"unknown destination {name!r} (configured or used: {', '.join(known) or 'none'})"
            )

    def blocked(self, destination: str | None) -> None:
        if destination is not None:
            self._check_known(destination)
        names = [destination] if destination is not None else known_destinations()
        self.stdout.write("\t".join(COLUMNS))
        found = 0
        for name in names:
            for b in blocked_keys(name, limit=None):
                self.stdout.write(blocked_line(b))
                found += 1
        if not found:
            self.stderr.write("no blocked ordering key" + (f" of {destination!r}" if destination else ""))

    def release(self, destination: str, key: str, how: str) -> None:
        self._check_known(destination)
        try:
            clean_ordering_key(key)
        except InvalidMessage as exc:
            raise CommandError(str(exc)) from exc
        _, length = get_repository().key_head(destination, key)
        try:
            head = release_key(destination, key, how)
        except MessageNotFound as exc:
            raise CommandError(
                f"{exc}: its head is not a dead letter (see 'outbox_ordering blocked'); nothing was changed"
            ) from exc
        waiting = max(0, length - 1)
        if how == "requeue":
            done = f"requeued; {waiting} message(s) waiting behind it follow in order"
        else:
            done = f"cancelled; the next of the {waiting} message(s) waiting behind it is due now"
        self.stdout.write(f"{destination}: ordering key {key!r} released: its dead letter {head} {done}")
