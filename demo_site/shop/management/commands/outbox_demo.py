"""``python manage.py outbox_demo``: send N orders through the flaky receiver and count the outcome.

A non-interactive check of the whole demo, for people, scripts and CI::

    python manage.py outbox_demo --messages 500 --failure-rate 0.3 --exit-when-settled

It starts what it is not told about:

* Redis: ``--redis-url``, else ``REDIS_URL``, else a private server on a free port
  (:class:`outbox.testing.RedisServer`), thrown away at the end;
* the flaky receiver: ``--receiver-url``, else this project's web server
  (``manage.py demo_serve``, i.e. runserver, on a free port) whose ``/receiver/orders`` fails
  ``--failure-rate`` of the requests with HTTP 500;
* ``--workers K`` worker processes (``manage.py outbox_worker``, with RQ's scheduler and the
  recovery sweep), unless ``--no-start-workers``.

Then it places N random orders (one transaction, ``outbox.send_many`` on commit), polls the
messages of this run until each is ``succeeded`` or ``failed`` (or ``--timeout`` seconds
pass), prints a status table and, last, the line::

    settled: N sent, S succeeded, F failed, L lost, D distinct ids accepted by the receiver

and stops what it started. Counts are of this run's message ids only, so they are exact
even on a shared Redis. Exit status: 0 when nothing is lost and every succeeded id was
accepted by the receiver; 1 otherwise; 2 when something could not be started.

Without ``--exit-when-settled``, what it started keeps running after the table (the shop,
the admin and the receiver at the printed address) until Ctrl-C.

With an external Redis and workers of its own, a run uses a fresh key prefix and its own
queues (``DEMO_OUTBOX_PREFIX``), deleted at the end unless ``--keep-data``, so other
workers on that Redis do not take its jobs. Logs of the started processes go to
``<DEMO_DATA_DIR>/logs/outbox_demo/``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.records import Message, Status
from outbox.testing import RedisServer, free_port

SETTLED = (Status.SUCCEEDED.value, Status.FAILED.value)
START_TIMEOUT = 30.0  # seconds to wait for the receiver or the workers to come up
STOP_TIMEOUT = 10.0  # seconds a started process gets to exit after SIGTERM, before SIGKILL
PROGRESS_EVERY = 2.0  # seconds between progress lines while waiting
CHUNK = 1000  # message ids per pipelined read


class StartError(Exception):
    """A process the demo needs could not be started (exit status 2)."""


@dataclass
class Child:
    """A process started by the demo, with its log file."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Children:
    """Processes started by the demo; :meth:`stop_all` ends them, newest first."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        """Start ``argv`` in its own session (so a terminal's Ctrl-C reaches only us),
        output to ``<log_dir>/<name>.log``.

        Raises:
            OSError: the program could not be started.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                list(argv),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM each child (newest first), wait up to ``timeout`` seconds in all, SIGKILL the rest."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.terminate()
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        self.children.clear()


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit, so ``finally`` blocks stop what was started."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def wait_for_receiver(url: str, timeout: float, child: Child | None = None) -> dict[str, Any]:
    """GET the receiver until it answers 200 with its totals (JSON). Returns them.

    Raises:
        StartError: no answer within ``timeout`` seconds, or its process exited.
    """
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        if child is not None and child.process.poll() is not None:
            raise StartError(f"the receiver exited with code {child.process.returncode}:\n{child.log_tail()}")
        try:
            response = httpx.get(url, timeout=2.0)
            if response.status_code == 200:
                return response.json()
            last_error = f"HTTP {response.status_code}"
        except (httpx.HTTPError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise StartError(f"the receiver at {url} did not answer within {timeout:.0f} s ({last_error})")


#: Ports the receiver is started on before the demo gives up: a free port is picked, then
#: bound by the receiver's process, and another process may take it in between.
RECEIVER_PORT_TRIES = 5


def start_receiver(
    manage: Sequence[str], env: dict[str, str], children: Children, port: int | None = None
) -> tuple[str, dict[str, Any]]:
    """Start ``manage.py demo_serve`` on ``port`` (default: a free one) and wait until it
    answers; when it exits because its port was taken meanwhile ("That port is already in
    use"), again on another free port, at most :data:`RECEIVER_PORT_TRIES` ports in all.
    Sets ``env["DEMO_RECEIVER_URL"]``. Returns the receiver's URL and its totals.

    Raises:
        StartError: it did not answer within ``START_TIMEOUT`` seconds, exited for another
            reason, or found every port taken.
        OSError: its process could not be started.
    """
    for attempt in range(1, RECEIVER_PORT_TRIES + 1):
        port = port if attempt == 1 and port is not None else free_port()
        receiver_url = f"http://127.0.0.1:{port}/receiver/orders"
        env["DEMO_RECEIVER_URL"] = receiver_url
        child = children.start("receiver", [*manage, "demo_serve", f"127.0.0.1:{port}", "--noreload"], env)
        try:
            return receiver_url, wait_for_receiver(receiver_url, START_TIMEOUT, child)
        except StartError:
            if child.process.poll() is None or "port is already in use" not in child.log_tail():
                raise
            children.children.remove(child)
            if attempt == RECEIVER_PORT_TRIES:
                raise
    raise AssertionError("unreachable")


def wait_for_workers(redis_url: str, names: Sequence[str], children: Children, timeout: float) -> None:
    """Wait until RQ lists every worker in ``names`` as registered.

    Raises:
        StartError: a worker process exited, or not all registered within ``timeout`` seconds.
    """
    from redis import Redis
    from rq import Worker

    connection = Redis.from_url(redis_url)
    registered: set[str] = set()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for child in children.dead():
                raise StartError(
                    f"{child.name} exited with code {child.process.returncode}:\n{child.log_tail()}"
                )
            registered = {w.name for w in Worker.all(connection=connection)}
            if set(names) <= registered:
                return
            time.sleep(0.2)
        raise StartError(
            f"workers {', '.join(sorted(set(names) - registered))} did not register within {timeout:.0f} s"
        )
    finally:
        connection.close()


def delete_run_data(redis_url: str, prefix: str, queues: Sequence[str]) -> int:
    """Delete a run's outbox keys (``<prefix>:*``) and its RQ queues' keys. Returns how many keys."""
    from redis import Redis

    connection = Redis.from_url(redis_url)
    try:
        deleted = 0
        patterns = [f"{prefix}:*"] + [f"rq:*:{q}" for q in queues]
        for pattern in patterns:
            batch = []
            for key in connection.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += connection.delete(*batch)
                    batch = []
            if batch:
                deleted += connection.delete(*batch)
        return deleted
    finally:
        connection.close()


def queue_names(prefix: str) -> list[str]:
    """The queue names demo settings give a key prefix (see ``demo_site/settings.py``)."""
    if prefix == "outbox":
        return ["outbox_high", "outbox", "outbox_low"]
    return [f"{prefix}_high", prefix, f"{prefix}_low"]


@dataclass
class Tally:
    """Where this run's messages are."""

    statuses: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)  # (status, retry_count) -> n, settled only
    errors: Counter = field(default_factory=Counter)  # last error of failed messages -> n
    succeeded: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    @property
    def settled(self) -> int:
        return len(self.succeeded) + len(self.failed)


def tally(ids: Sequence[str]) -> Tally:
    """Read this run's messages from the repository (pipelined, ``CHUNK`` ids per round trip)."""
    from outbox.store import get_repository

    repo = get_repository()
    result = Tally()
    for start in range(0, len(ids), CHUNK):
        messages: list[Message | None] = repo.get_many(list(ids[start : start + CHUNK]))
        for message in messages:
            if message is None:
                result.statuses["missing"] += 1
                continue
            result.statuses[message.status] += 1
            if message.status in SETTLED:
                result.retries[(message.status, message.retry_count)] += 1
            if message.status == Status.SUCCEEDED.value:
                result.succeeded.add(message.id)
            elif message.status == Status.FAILED.value:
                result.failed.add(message.id)
                result.errors[message.last_error[:70]] += 1
    return result


class Command(BaseCommand):
    help = (
        "Send N orders through the demo's flaky webhook receiver, wait until every message is "
        "succeeded or failed, print a status table and a 'settled:' line. Starts Redis, the receiver "
        "and workers unless told where they run. Exit status 1 if a message is lost."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--messages", "-n", type=int, default=100, help="orders to send (default 100)")
        parser.add_argument(
            "--failure-rate",
            type=float,
            default=None,
            help="fraction of requests the started receiver answers with HTTP 500 (default DEMO_FAILURE_RATE, 0.3)",
        )
        parser.add_argument(
            "--slow-rate",
            type=float,
            default=None,
            help="fraction it answers after 1-2 s (default DEMO_SLOW_RATE, 0.02)",
        )
        parser.add_argument("--workers", type=int, default=2, help="worker processes to start (default 2)")
        parser.add_argument(
            "--timeout", type=float, default=180.0, help="seconds to wait for all messages to settle (180)"
        )
        parser.add_argument("--poll", type=float, default=0.5, help="seconds between status polls (0.5)")
        parser.add_argument(
            "--exit-when-settled", action="store_true", help="exit after the table instead of staying up"
        )
        parser.add_argument(
            "--redis-url", default=None, help="use this Redis (default REDIS_URL, else a private server)"
        )
        parser.add_argument(
            "--receiver-url",
            default=None,
            help="a receiver that already runs, e.g. http://127.0.0.1:8000/receiver/orders",
        )
        parser.add_argument("--no-start-workers", action="store_true", help="use workers that already run")
        parser.add_argument(
            "--prefix",
            default=None,
            help="outbox key prefix of this run (default: see the command's docstring)",
        )
        parser.add_argument(
            "--keep-data", action="store_true", help="do not delete a fresh prefix's keys at the end"
        )

    # -- entry point ----------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        self.check_options(options)
        redis_url = options["redis_url"] or os.environ.get("REDIS_URL") or None
        drive_here = (
            options["no_start_workers"]
            and options["receiver_url"]
            and redis_url == settings.REDIS_URL
            and options["prefix"] in (None, settings.DEMO_OUTBOX_PREFIX)
        )
        with exit_on_sigterm():
            try:
                code = self.drive(options) if drive_here else self.supervise(options, redis_url)
            except KeyboardInterrupt:
                code = 130
        self.stdout.flush()
        if code:
            sys.exit(code)

    def check_options(self, options: dict[str, Any]) -> None:
        """Raises CommandError for out-of-range options."""
        if options["messages"] < 1:
            raise CommandError("--messages must be at least 1")
        for name in ("failure_rate", "slow_rate"):
            value = options[name]
            if value is not None and not 0 <= value <= 1:
                raise CommandError(f"--{name.replace('_', '-')} must be between 0 and 1")
        if options["workers"] < 1:
            raise CommandError("--workers must be at least 1")
        if options["timeout"] <= 0 or options["poll"] <= 0:
            raise CommandError("--timeout and --poll must be positive (seconds)")
        if options["no_start_workers"] and not options["receiver_url"]:
            raise CommandError(
                "--no-start-workers needs --receiver-url: the address the running workers deliver to "
                "(their DEMO_RECEIVER_URL)"
            )
        if options["receiver_url"] and (
            options["failure_rate"] is not None or options["slow_rate"] is not None
        ):
            self.stderr.write(
                "note: --failure-rate/--slow-rate apply only to a receiver this command starts; ignored"
            )

    def say(self, text: str = "", stream: TextIO | None = None) -> None:
        (stream or self.stdout).write(text)
        (stream or self.stdout).flush()

    # -- supervisor: start what is needed, run the driver in a child, stop everything ----
    def supervise(self, options: dict[str, Any], redis_url: str | None) -> int:
        """Start Redis, the receiver and workers as needed; run the driver; stop them. Returns the exit status."""
        children = Children(Path(settings.DEMO_DATA_DIR) / "logs" / "outbox_demo")
        server: RedisServer | None = None
        started: list[str] = []
        cleanup: tuple[str, str] | None = None
        try:
            if redis_url is None:
                try:
                    server = RedisServer().start()
                except RuntimeError as exc:
                    self.say(f"outbox_demo: could not start Redis: {exc}", self.stderr)
                    return 2
                redis_url = server.url
                started.append("redis")
                self.say(f"outbox_demo: started a private Redis at {redis_url} ({server.binary})")
            run = secrets.token_hex(3)
            if options["prefix"]:
                prefix = options["prefix"]
            elif server is not None or options["no_start_workers"]:
                prefix = settings.DEMO_OUTBOX_PREFIX
            else:
                prefix = f"outbox_demo_{run}"
                if not options["keep_data"]:
                    cleanup = (redis_url, prefix)
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "demo_site.settings",
                "REDIS_URL": redis_url,
                "DEMO_OUTBOX_PREFIX": prefix,
                "DEMO_DATA_DIR": str(settings.DEMO_DATA_DIR),
                "PYTHONUNBUFFERED": "1",
            }
            if options["failure_rate"] is not None:
                env["DEMO_FAILURE_RATE"] = repr(options["failure_rate"])
            if options["slow_rate"] is not None:
                env["DEMO_SLOW_RATE"] = repr(options["slow_rate"])
            try:
                receiver_url = self.start_processes(options, env, children, started, run, prefix)
            except (StartError, OSError) as exc:
                self.say(f"outbox_demo: could not start: {exc}", self.stderr)
                return 2
            code = self.run_driver(options, env, redis_url, receiver_url, prefix)
            if code in (0, 1) and not options["exit_when_settled"] and started:
                self.stay_up(receiver_url, children)
            return code
        finally:
            # Workers first (they may still write), then the receiver, then Redis.
            children.stop_all()
            if cleanup is not None:
                deleted = delete_run_data(cleanup[0], cleanup[1], queue_names(cleanup[1]))
                self.say(
                    f"outbox_demo: deleted {deleted} keys of this run (prefix {cleanup[1]!r})", self.stderr
                )
            if server is not None:
                server.stop()
            if started:
                self.say(f"outbox_demo: stopped {', '.join(reversed(started))}", self.stderr)

    def start_processes(
        self,
        options: dict[str, Any],
        env: dict[str, str],
        children: Children,
        started: list[str],
        run: str,
        prefix: str,
    ) -> str:
        """Migrate, start the receiver and workers unless given. Returns the receiver's URL.

        Raises:
            StartError: a process did not come up within ``START_TIMEOUT`` seconds.
            OSError: a process could not be started.
        """
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        for old_log in children.log_dir.glob("*.log"):  # the previous run's
            old_log.unlink(missing_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        receiver_url = options["receiver_url"]
        ours = receiver_url is None
        if ours:
            receiver_url, totals = start_receiver(manage, env, children)
            started.append("the receiver")
        else:
            env["DEMO_RECEIVER_URL"] = receiver_url
            totals = wait_for_receiver(receiver_url, START_TIMEOUT)
        if ours:
            self.say(
                f"outbox_demo: receiver at {receiver_url} (failure rate {totals['failure_rate']:.2f}, "
                f"slow rate {totals['slow_rate']:.2f}; the shop and /admin/ are served there too)"
            )
        if not options["no_start_workers"]:
            names = [f"demo-{run}-{i}" for i in range(1, options["workers"] + 1)]
            for name in names:
                children.start(name, [*manage, "outbox_worker", "--name", name], env)
            started.append(f"{len(names)} workers")
            wait_for_workers(env["REDIS_URL"], names, children, START_TIMEOUT)
            self.say(
                f"outbox_demo: {len(names)} workers on queues {', '.join(queue_names(prefix))} (key prefix {prefix!r})"
            )
        if children.children:
            self.say(f"outbox_demo: logs in {children.log_dir}")
        return receiver_url

    def run_driver(
        self, options: dict[str, Any], env: dict[str, str], redis_url: str, receiver_url: str, prefix: str
    ) -> int:
        """Run this command again, in a child whose settings point at the started processes."""
        driver = [
            sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "outbox_demo",
            "--messages", str(options["messages"]),
            "--timeout", str(options["timeout"]),
            "--poll", str(options["poll"]),
            "--redis-url", redis_url,
            "--receiver-url", receiver_url,
            "--prefix", prefix,
            "--no-start-workers",
            "--exit-when-settled",
        ]  # fmt: skip
        process = subprocess.Popen(driver, env=env)
        try:
            return process.wait(options["timeout"] + 120)
        except subprocess.TimeoutExpired:
            self.say("outbox_demo: the driver overran its timeout; killed", self.stderr)
            return 1
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def stay_up(self, receiver_url: str, children: Children) -> None:
        """Keep the started processes running until Ctrl-C, SIGTERM or one of them exits."""
        base = receiver_url.rsplit("/receiver/", 1)[0]
        self.say(
            f"\nStill running: the shop at {base}/ and the admin at {base}/admin/ "
            "(create a login with: python manage.py demo_admin). Ctrl-C to stop.",
            self.stderr,
        )
        try:
            while not children.dead():
                time.sleep(1.0)
            for child in children.dead():
                self.say(
                    f"outbox_demo: {child.name} exited with code {child.process.returncode}", self.stderr
                )
        except KeyboardInterrupt:
            pass

    # -- driver: place the orders and wait, in this process --------------------------
    def drive(self, options: dict[str, Any]) -> int:
        from demo_site.shop.orders import place_random_orders
        from demo_site.shop.receiver import ReceiverStore

        count = options["messages"]
        call_command("migrate", interactive=False, verbosity=0)
        try:
            receiver = wait_for_receiver(options["receiver_url"], START_TIMEOUT)
        except StartError as exc:
            self.say(f"outbox_demo: {exc}", self.stderr)
            return 2
        self.say(
            f"outbox_demo: {count} orders -> destination 'orders' -> {options['receiver_url']} "
            f"(receiver failure rate {receiver['failure_rate']:.2f}, slow rate {receiver['slow_rate']:.2f}); "
            f"retries: max {settings.OUTBOX['MAX_RETRIES']}, policy {settings.OUTBOX['RETRY']}"
        )
        t0 = time.monotonic()
        placed = place_random_orders(count)
        ids = list(dict.fromkeys(message.id for _order, message in placed))
        sent_seconds = time.monotonic() - t0
        self.say(f"outbox_demo: placed {count} orders and sent {len(ids)} messages in {sent_seconds:.2f} s")

        deadline = t0 + options["timeout"]
        next_progress = time.monotonic() + PROGRESS_EVERY
        while True:
            now = time.monotonic()
            current = tally(ids)
            if current.settled == len(ids) or now >= deadline:
                break
            if now >= next_progress:
                in_flight = ", ".join(
                    f"{current.statuses[s]} {s}" for s in ("pending", "sending", "retrying")
                )
                self.say(
                    f"  {now - t0:5.1f} s: {len(current.succeeded)} succeeded, {len(current.failed)} failed, {in_flight}"
                )
                next_progress = now + PROGRESS_EVERY
            time.sleep(options["poll"])
        elapsed = time.monotonic() - t0

        store = ReceiverStore.from_settings("orders")
        accepted = store.accepted_among(ids)
        per_run = store.counts_for(ids)
        not_accepted = current.succeeded - accepted
        accepted_but_failed = current.failed & accepted
        lost = len(ids) - current.settled

        self.print_table(current, len(ids), elapsed, per_run, accepted, not_accepted, accepted_but_failed)
        self.say(
            f"settled: {len(ids)} sent, {len(current.succeeded)} succeeded, {len(current.failed)} failed, "
            f"{lost} lost, {len(accepted)} distinct ids accepted by the receiver"
        )
        return 1 if lost or not_accepted else 0

    def print_table(
        self,
        current: Tally,
        sent: int,
        elapsed: float,
        per_run: dict[str, int],
        accepted: set[str],
        not_accepted: set[str],
        accepted_but_failed: set[str],
    ) -> None:
        lines = ["", f"{'status':<12}{'messages':>9}"]
        statuses = [s.value for s in Status] + sorted(set(current.statuses) - {s.value for s in Status})
        lines += [f"{status:<12}{current.statuses[status]:>9}" for status in statuses]
        lines += ["", f"{'retry_count':<12}{'succeeded':>10}{'failed':>8}"]
        for retries in sorted({r for _s, r in current.retries}):
            succeeded = current.retries[(Status.SUCCEEDED.value, retries)]
            failed = current.retries[(Status.FAILED.value, retries)]
            lines.append(f"{retries:<12}{succeeded:>10}{failed:>8}")
        for error, n in current.errors.most_common(3):
            lines.append(f"failed with last error {error!r}: {n}")
        lines += [
            "",
            f"receiver: {per_run['requests']} signed requests for this run's messages, {per_run['errors']} answered 500, "
            f"{per_run['slow']} slow, {per_run['duplicates']} duplicate deliveries, {len(accepted)} distinct ids accepted",
            f"succeeded but not accepted by the receiver: {len(not_accepted)}"
            + (f" (e.g. {sorted(not_accepted)[:3]})" if not_accepted else ""),
            f"failed although accepted (receiver answered 2xx, outcome lost): {len(accepted_but_failed)}",
            f"time: settled in {elapsed:.1f} s"
            if current.settled == sent
            else f"time: gave up after {elapsed:.1f} s",
            "",
        ]
        self.say("\n".join(lines))
