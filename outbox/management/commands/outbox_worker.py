"""``python manage.py outbox_worker``: an RQ worker for the outbox queues, with the
outbox's housekeeping (wake-ups for due retries and delays, the relay of captured
messages, the recovery sweep), riding out Redis outages.

This is the one command a deployment runs (as many processes as wanted)::

    python manage.py outbox_worker                    # high, default, low outbox queues
    python manage.py outbox_worker outbox_high        # only these queues
    python manage.py outbox_worker --burst            # deliver what is due, then exit

Jobs run in the worker process itself (RQ's ``SimpleWorker``) unless ``--fork`` is
given: a delivery job attempts many messages concurrently on a pool of
``OUTBOX["CONCURRENCY"]`` threads, and running in place keeps HTTP connections to
receivers open across jobs. See :mod:`outbox.delivery.worker`.
"""

from __future__ import annotations

import logging
from argparse import SUPPRESS as SUPPRESS_HELP
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.conf import outbox_settings
from outbox.delivery.worker import WorkerOptions, run_worker
from outbox.destinations.config import close_transports
from outbox.store.client.diagnostics import log_startup_findings


class Command(BaseCommand):
    help = "Run an RQ worker for the outbox queues, with wake-ups, the relay and the recovery sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "queues", nargs="*", help="queue names (default: the outbox's high, default and low queues)"
        )
        parser.add_argument("--burst", action="store_true", help="deliver what is due, then exit")
        parser.add_argument("--name", help="worker name (RQ's default otherwise)")
        parser.add_argument(
            "--recovery-interval",
            type=float,
            default=None,
            help="seconds between recovery sweeps (OUTBOX['RECOVERY_INTERVAL'])",
        )
        parser.add_argument(
            "--with-scheduler",
            action="store_true",
            help="also run RQ's scheduler (the outbox does not need it)",
        )
        parser.add_argument("--no-scheduler", action="store_true", help=SUPPRESS_HELP)
        parser.add_argument(
            "--fork",
            action="store_true",
            help="fork a work horse per job (RQ's Worker) instead of running jobs in place",
        )
        parser.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")
        parser.add_argument(
            "--sentry-dsn",
            default=None,
            help="report job exceptions to Sentry (needs sentry-sdk; its RQ integration is used)",
        )
        parser.add_argument("--sentry-debug", action="store_true", help="Sentry SDK debug output")
        parser.add_argument(
            "--quiet",
            action="store_true",
            help="print no line per outcome when the project configured no logging for 'outbox'",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sentry_dsn"]:
            init_sentry(options["sentry_dsn"], debug=options["sentry_debug"])
        verbosity = options["verbosity"]
        level = logging.DEBUG if verbosity > 1 else logging.INFO if verbosity == 1 else logging.WARNING
        outbox_logger = logging.getLogger("outbox")
        outbox_logger.setLevel(level)
        if not options["quiet"] and not outbox_logger.hasHandlers():
            # The project configured no logging for "outbox" (Django's default sends
            # nothing below WARNING anywhere): print one line per outcome to stderr.
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            outbox_logger.addHandler(handler)

        log_startup_findings(logging.getLogger("outbox"))  # eviction, persistence, shared alias
        try:
            run_worker(
                options["queues"] or outbox_settings.queue_names,
                WorkerOptions(
                    burst=options["burst"],
                    fork=options["fork"],
                    name=options["name"],
                    with_scheduler=options["with_scheduler"],
                    max_jobs=options["max_jobs"],
                    logging_level=logging.getLevelName(level),
                    recovery_interval=options["recovery_interval"],
                ),
            )
        finally:
            close_transports()


def init_sentry(dsn: str, *, debug: bool = False) -> None:
    """Initialise the Sentry SDK with its RQ integration (what ``rqworker --sentry-dsn``
    did in django-rq versions that had it; https://docs.sentry.io/platforms/python/integrations/rq/).

    Raises:
        CommandError: sentry-sdk is not installed.
    """
    try:
        import sentry_sdk  # optional: only with a Sentry DSN
        from sentry_sdk.integrations.rq import RqIntegration  # optional: only with a Sentry DSN
    except ImportError as exc:
        raise CommandError(f"--sentry-dsn needs the Sentry SDK: pip install sentry-sdk ({exc})") from exc
    sentry_sdk.init(dsn, integrations=[RqIntegration()], debug=debug)
