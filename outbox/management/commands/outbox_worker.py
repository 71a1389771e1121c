"""``python manage.py outbox_worker``: an RQ worker for the outbox queues, with RQ's
scheduler (for delayed first attempts and retries) and the recovery sweep.

This is the one command a deployment runs (as many processes as wanted)::

    python manage.py outbox_worker            # high, default, low outbox queues
    python manage.py outbox_worker --burst    # process what is due, then exit

Jobs run in the worker process itself (RQ's ``SimpleWorker``) unless ``--fork`` is
given: delivery jobs are short, and running them in place keeps HTTP connections to
receivers open across jobs and avoids RQ's fork per job (measured here: ~1 s of
fork-worker overhead per burst and ~50 ms per job). ``--max-jobs`` recycles a process.
"""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand

from outbox.conf import outbox_settings


class Command(BaseCommand):
    help = "Run an RQ worker for the outbox queues, with the scheduler and the recovery sweep."

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", help="queue names (default: the outbox's high, default and low queues)")
        parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
        parser.add_argument("--name", help="worker name (RQ's default otherwise)")
        parser.add_argument(
            "--recovery-interval", type=float, default=None, help="seconds between recovery sweeps (OUTBOX['RECOVERY_INTERVAL'])"
        )
        parser.add_argument("--no-scheduler", action="store_true", help="do not run RQ's scheduler in this worker")
        parser.add_argument("--fork", action="store_true", help="fork a work horse per job (RQ's Worker) instead of running jobs in place")
        parser.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")

    def handle(self, *args, **options):
        import django_rq
        from rq.worker import SimpleWorker

        from outbox.delivery import close_transports
        from outbox.recovery import RecoveryLoop, recover

        verbosity = options["verbosity"]
        level = logging.DEBUG if verbosity > 1 else logging.INFO if verbosity == 1 else logging.WARNING
        logging.getLogger("outbox").setLevel(level)
        queues = options["queues"] or outbox_settings.queue_names
        kwargs = {"name": options["name"]} if options["name"] else {}
        if not options["fork"]:
            kwargs["worker_class"] = SimpleWorker
        worker = django_rq.get_worker(*queues, **kwargs)
        loop = None
        if options["burst"]:
            recover()
        else:
            loop = RecoveryLoop(options["recovery_interval"])
            loop.start()
        try:
            worker.work(
                burst=options["burst"],
                with_scheduler=not options["no_scheduler"],
                logging_level=logging.getLevelName(level),
                max_jobs=options["max_jobs"],
            )
        finally:
            if loop is not None:
                loop.stop()
            close_transports()
