"""The fault suite's machinery: a private Redis to break, a receiver to break, supervised workers,
and the count at the end.

A scenario (``tests/faults/scenarios.py``) runs inside :func:`environment`, which

1. starts a private Redis (:class:`outbox.testing.RedisServer`, options per scenario: AOF,
   ``maxmemory``/policy) on a fixed port, so it can be stopped and started again;
2. starts the receiver process (:mod:`tests.faults.receiver`) on two loopback ports;
3. exports ``FAULTS_*`` variables (:mod:`tests.faults.settings`) and sets Django up in this
   process (once per process: the CLI runs each scenario in a process of its own);
4. migrates the scenario's database when it needs one;

and yields a :class:`Run` with a :class:`Supervisor` for ``manage.py outbox_worker``
subprocesses. Every process it starts is ended at the end (``finally`` and ``atexit``),
whatever happens. Nothing listens or connects outside 127.0.0.1.

Only the outbox's public surface is used: ``outbox.send``/``send_many``/``get``/``requeue``,
the ``outbox_worker`` command, ``outbox.conf.outbox_settings`` and
``outbox.store.client.connection.get_repository().counts()``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from outbox.testing import ClusterServer, RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / ".faults"
SETTLED = ("succeeded", "failed", "cancelled")
#: Unsettled statuses: "waiting" is a message behind its ordering key's head (issue 23).
ACTIVE = ("pending", "sending", "retrying", "waiting")

_children: list[subprocess.Popen] = []  # every process started, for the atexit sweep
_process_groups: set[int] = set()


def _kill_everything() -> None:
    """SIGKILL every process group and process this module started (atexit, last resort)."""
    for pgid in list(_process_groups):
        kill_group(pgid)
    for child in _children:
        if child.poll() is None:
            child.kill()


atexit.register(_kill_everything)


def spawn(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group, id = its pid), output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=env or os.environ.copy(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _children.append(process)
    _process_groups.add(process.pid)
    return process


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to a process group. Returns False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


# -- the receiver ------------------------------------------------------------------------


class ReceiverProcess:
    """The receiver (:mod:`tests.faults.receiver`) in a process of its own, and its control port.

    Raises:
        RuntimeError: from :meth:`start`, when it does not answer within 15 s.
    """

    def __init__(self, secret: str, log_dir: Path, log_name: str = "receiver.log") -> None:
        self.port = free_port()
        self.control_port = free_port()
        self.secret = secret
        self.log_path = log_dir / log_name
        self.process: subprocess.Popen | None = None
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.control_port}", timeout=10.0, trust_env=False
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> ReceiverProcess:
        argv = [sys.executable, "-m", "tests.faults.receiver", "--port", str(self.port)]
        argv += ["--control-port", str(self.control_port), "--secret", self.secret]
        self.process = spawn(argv, self.log_path)
        if not wait_until(self._answers, 15.0, 0.05):
            raise RuntimeError(f"the receiver did not start; see {self.log_path}")
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the receiver exited ({self.process.returncode}); see {self.log_path}")
        try:
            return self.client.get("/state").status_code == 200
        except httpx.HTTPError:
            return False

    def set_mode(self, **mode: Any) -> None:
        """Change its failure mode: ``down``, ``fail_rate``, ``reset_rate``, ``refuse_marked``,
        ``slow``, ``drip``, ``drip_bytes``."""
        self.client.post("/mode", json=mode).raise_for_status()

    def set_secrets(self, secrets: dict[str, str]) -> None:
        """Give each path (``/acme/ep-1``) its endpoint's own secret: requests to it are
        verified with that secret alone and counted by ``Outbox-Delivery-Id``."""
        self.client.post("/secrets", json=secrets).raise_for_status()

    def state(self) -> dict[str, Any]:
        return self.client.get("/state").json()

    def log(self) -> list[list[Any]]:
        """Every signed request so far, in order of arrival (:mod:`tests.faults.receiver`)."""
        return self.client.get("/log", timeout=60.0).json()

    def stop(self) -> None:
        self.client.close()
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                kill_group(self.process.pid)
                self.process.wait()


# -- the workers -------------------------------------------------------------------------


@dataclass
class WorkerExit:
    slot: int
    pid: int
    returncode: int
    at: float  # time.monotonic()
    killed_by_us: bool


class Supervisor:
    """Keeps ``count`` ``manage.py outbox_worker`` processes running, as a process manager would.

    Each worker runs in its own process group. When one exits (crashed, or killed by
    :meth:`kill_one`), the supervisor records it and, after ``restart_delay`` seconds,
    starts another in its slot (unless ``restart`` is False). With ``end_group`` it first
    SIGKILLs the dead worker's whole process group (systemd's ``KillMode=control-group``);
    without, children the worker left (RQ's scheduler process, a fork-mode work horse) run
    on until :meth:`stop`.

    Args:
        count: worker processes.
        env: their environment.
        log_dir: where ``worker-<slot>.log`` files go.
        args: more ``outbox_worker`` arguments (``--fork``, queue names, ...).
        recovery_interval: ``--recovery-interval`` seconds.
        restart: start a new worker when one exits.
        restart_delay: seconds between an exit and the restart.
        end_group: SIGKILL a dead worker's process group.
    """

    def __init__(
        self,
        count: int,
        env: dict[str, str],
        log_dir: Path,
        *,
        args: Sequence[str] = (),
        recovery_interval: float = 2.0,
        restart: bool = True,
        restart_delay: float = 1.0,
        end_group: bool = True,
    ) -> None:
        self.count = count
        self.env = env
        self.log_dir = log_dir
        self.args = list(args)
        self.recovery_interval = recovery_interval
        self.restart = restart
        self.restart_delay = restart_delay
        self.end_group = end_group
        self.slots: list[subprocess.Popen | None] = [None] * count
        self.spawned: list[subprocess.Popen] = []
        self.exits: list[WorkerExit] = []
        self.kills = 0
        self.starts = 0
        self._killed: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def argv(self) -> list[str]:
        return [
            sys.executable, str(ROOT / "manage.py"), "outbox_worker",
            "--recovery-interval", str(self.recovery_interval), *self.args,
        ]  # fmt: skip

    def _spawn(self, slot: int) -> None:
        self.slots[slot] = spawn(self.argv(), self.log_dir / f"worker-{slot}.log", self.env)
        self.spawned.append(self.slots[slot])
        self.starts += 1

    def start(self) -> Supervisor:
        with self._lock:
            for slot in range(self.count):
                self._spawn(slot)
        self._thread.start()
        return self

    def _watch(self) -> None:
        restart_at: dict[int, float] = {}
        while not self._stop.wait(0.05):
            with self._lock:
                now = time.monotonic()
                for slot, process in enumerate(self.slots):
                    if process is not None and process.poll() is not None:
                        killed = process.pid in self._killed
                        self.exits.append(WorkerExit(slot, process.pid, process.returncode, now, killed))
                        if self.end_group:
                            kill_group(process.pid)
                        self.slots[slot] = None
                        if self.restart:
                            restart_at[slot] = now + self.restart_delay
                    if self.slots[slot] is None and slot in restart_at and now >= restart_at[slot]:
                        del restart_at[slot]
                        self._spawn(slot)

    def alive(self) -> list[subprocess.Popen]:
        with self._lock:
            return [p for p in self.slots if p is not None and p.poll() is None]

    def kill_one(self, rng: random.Random, sig: int = signal.SIGKILL, group: bool = True) -> int | None:
        """Kill a random live worker (its whole process group when ``group``). Returns its pid."""
        with self._lock:
            live = [p for p in self.slots if p is not None and p.poll() is None]
            if not live:
                return None
            victim = rng.choice(live)
            self._killed.add(victim.pid)
            if group:
                kill_group(victim.pid, sig)
            else:
                victim.send_signal(sig)
            self.kills += 1
            return victim.pid

    def crashes(self) -> list[WorkerExit]:
        """Exits the supervisor did not cause."""
        return [e for e in self.exits if not e.killed_by_us]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every worker group (warm shutdown), SIGKILL what is left after ``timeout`` s,
        and SIGKILL every process group ever started (orphaned children included)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            live = [p for p in self.slots if p is not None and p.poll() is None]
            for process in live:
                kill_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for process in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(0.1, deadline - time.monotonic()))
            for process in self.spawned:
                kill_group(process.pid)
                if process.poll() is None:
                    process.kill()
                process.wait()


# -- the run -----------------------------------------------------------------------------


@dataclass
class Check:
    """One expectation of a scenario: ``ok`` or not, with what was measured."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class Result:
    """What a scenario measured (one row of the table).

    Attributes:
        scenario: its name.
        sent: messages acknowledged to the caller (``send()`` returned; inside a transaction,
            the transaction committed).
        succeeded, failed: acknowledged messages in those statuses at the end.
        lost: acknowledged messages with no record in Redis, or never settled.
        duplicates: messages accepted by the receiver (or the callable) more than once.
        not_received: succeeded messages the receiver never accepted.
        settle_s: seconds from the first send until every message settled (None: never).
        recover_s: seconds from the end of the last fault until every message settled.
        checks: the scenario's own expectations.
        notes: other measurements (exceptions by type, worker exits, ...).
        lost_expected: the scenario breaks the configuration on purpose (eviction), so
            losses are what it demonstrates, not a failure.
        skipped: why the scenario did not run, when it did not.
    """

    scenario: str
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    duplicates: int = 0
    not_received: int = 0
    settle_s: float | None = None
    recover_s: float | None = None
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lost_expected: bool = False
    skipped: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        return (
            (self.lost == 0 or self.lost_expected)
            and self.not_received == 0
            and all(c.ok for c in self.checks)
        )

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        data = {k: v for k, v in data.items() if k != "ok"}
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        return cls(**data)


@dataclass
class Run:
    """A scenario's running parts; see :func:`environment`."""

    name: str
    redis: RedisServer
    receiver: ReceiverProcess | None
    env: dict[str, str]
    log_dir: Path
    callable_log: Path
    supervisors: list[Supervisor] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    cluster: ClusterServer | None = None
    last_fault_end: float | None = None
    more_receivers: list[ReceiverProcess] = field(default_factory=list)

    def add_receiver(self) -> ReceiverProcess:
        """Start one more receiver process (``receiver-<n>.log``), stopped at the end of the
        run and counted by :meth:`delivered`, for scenarios with several receiving systems."""
        secret = self.receiver.secret if self.receiver is not None else _secret()
        name = f"receiver-{len(self.more_receivers) + 2}.log"
        receiver = ReceiverProcess(secret, self.log_dir, name).start()
        self.more_receivers.append(receiver)
        return receiver

    def receivers(self) -> list[ReceiverProcess]:
        """Every receiver process of the run, the first one first."""
        return ([self.receiver] if self.receiver is not None else []) + self.more_receivers

    def workers(self, count: int, **options: Any) -> Supervisor:
        """Start ``count`` supervised workers (options: see :class:`Supervisor`)."""
        options.setdefault("recovery_interval", float(self.env["FAULTS_RECOVERY_INTERVAL"]))
        supervisor = Supervisor(count, self.env, self.log_dir, **options).start()
        self.supervisors.append(supervisor)
        return supervisor

    def fault_ended(self) -> None:
        """Mark now as the end of the last fault (for the time to recover)."""
        self.last_fault_end = time.monotonic()

    def delivered(self) -> Counter[str]:
        """How many times each message id was accepted by the receiver or the callable."""
        counts: Counter[str] = Counter()
        for receiver in self.receivers():
            counts.update(receiver.state()["accepted"])
        from .targets import read_log

        counts.update(message_id for message_id, poison in read_log(str(self.callable_log)) if not poison)
        return counts


def _secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def _django_setup() -> None:
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.faults.settings"
    django.setup()


@contextmanager
def environment(
    name: str,
    *,
    settings: dict[str, Any] | None = None,
    redis_options: dict[str, Any] | None = None,
    receiver: bool = True,
    database: bool = False,
    pg_dsn: str | None = None,
    cluster: dict[str, Any] | None = None,
) -> Iterator[Run]:
    """Start Redis and the receiver, configure and set up Django, yield a :class:`Run`; stop all.

    Args:
        name: the scenario (names its log directory ``.faults/<name>/``).
        settings: ``FAULTS_*`` values without the prefix, e.g. ``{"VISIBILITY_TIMEOUT": 4}``.
        redis_options: :class:`RedisServer` keyword arguments (AOF, maxmemory, ...).
        receiver: start the receiver.
        database: migrate the database (SQLite file, or PostgreSQL with ``pg_dsn``).
        pg_dsn: use this PostgreSQL, in a schema of its own, dropped at the end.
        cluster: :class:`~outbox.testing.ClusterServer` keyword arguments: start that
            cluster and put the outbox's data on it (``FAULTS_CLUSTER_NODES``), RQ's queues
            staying on the private Redis; ``run.cluster`` is the cluster.

    Django is set up once per process, so call this once per process.
    """
    log_dir = DATA_DIR / name
    log_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("worker-*.log", "receiver*.log", "callable.log", "db.sqlite3*"):
        for old in log_dir.glob(pattern):
            old.unlink()
    shutil.rmtree(log_dir / "redis", ignore_errors=True)
    redis = RedisServer(data_dir=log_dir / "redis", **(redis_options or {}))
    receiver_process: ReceiverProcess | None = None
    cluster_server: ClusterServer | None = None
    run: Run | None = None
    schema = f"faults_{os.getpid()}"
    try:
        redis.start()
        if cluster is not None:
            cluster_server = ClusterServer(**cluster).start()
        secret = _secret()
        if receiver:
            receiver_process = ReceiverProcess(secret, log_dir).start()
        env = {
            "FAULTS_REDIS_URL": redis.url,
            "FAULTS_SECRET": secret,
            "FAULTS_RECEIVER_URL": receiver_process.url if receiver_process else "http://127.0.0.1:9/hook",
            "FAULTS_DB": str(log_dir / "db.sqlite3"),
            "FAULTS_CALLABLE_LOG": str(log_dir / "callable.log"),
            "FAULTS_VISIBILITY_TIMEOUT": "10",
            "FAULTS_RECOVERY_INTERVAL": "2",
            "FAULTS_LATE_AFTER": "2",
        }
        if pg_dsn:
            _pg_execute(pg_dsn, f"CREATE SCHEMA {schema}")
            env["FAULTS_PG_DSN"] = pg_dsn
            env["FAULTS_PG_SCHEMA"] = schema
        if cluster_server is not None:
            env["FAULTS_CLUSTER_NODES"] = ",".join(cluster_server.urls)
        env.update({f"FAULTS_{k}": str(v) for k, v in (settings or {}).items()})
        os.environ.update(env)
        for key in ("NO_PROXY", "no_proxy"):
            os.environ[key] = "127.0.0.1,localhost"
        worker_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.faults.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        _django_setup()
        if database:
            from django.core.management import call_command

            call_command("migrate", verbosity=0, interactive=False)
        run = Run(
            name,
            redis,
            receiver_process,
            worker_env,
            log_dir,
            log_dir / "callable.log",
            cluster=cluster_server,
        )
        yield run
    finally:
        if run is not None:
            for supervisor in run.supervisors:
                supervisor.stop()
            for more in run.more_receivers:
                more.stop()
        if receiver_process is not None:
            receiver_process.stop()
        redis.stop()
        if cluster_server is not None:
            cluster_server.stop()
        if pg_dsn:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:
                pass
            _pg_execute(pg_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        _kill_everything()


def _pg_execute(dsn: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql)


def postgres_unavailable(dsn: str) -> str:
    """Why PostgreSQL at ``dsn`` cannot be used ("" when it can)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {dsn} is not reachable: {type(exc).__name__}: {str(exc).strip()[:120]}"
    return ""


# -- sending and counting ----------------------------------------------------------------


def paced(count: int, rate: float, deadline: float | None = None) -> Iterator[int]:
    """Yield 0 .. count-1, the i-th at ``start + i / rate`` seconds (catching up when late)."""
    start = time.monotonic()
    for i in range(count):
        if deadline is not None and time.monotonic() > deadline:
            return
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield i


def counts() -> dict[str, int]:
    """Message count per status, from the repository's indexes (O(1) each)."""
    from outbox.store import get_repository

    return get_repository().counts()


def wait_settled(expected: int, timeout: float, poll: float = 0.25) -> float | None:
    """Wait until no message is pending, sending or retrying and at least ``expected`` are settled.

    Redis errors (an outage) are ridden out. Returns ``time.monotonic()`` when settled,
    None when ``timeout`` seconds passed first. A Redis that lost messages settles with
    fewer than ``expected``: that is noticed when nothing is active any more and the count
    has not moved for 3 s.
    """
    from redis.exceptions import RedisError

    deadline = time.monotonic() + timeout
    last_total, still_since = None, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now_counts = counts()
        except RedisError:
            time.sleep(poll)
            continue
        active = sum(now_counts[s] for s in ACTIVE)
        settled = sum(now_counts[s] for s in SETTLED)
        if active == 0 and settled >= expected:
            return time.monotonic()
        total = active + settled
        if total != last_total:
            last_total, still_since = total, time.monotonic()
        elif active == 0 and time.monotonic() - still_since > 3:
            return time.monotonic()
        time.sleep(poll)
    return None


def statuses(ids: Iterable[str]) -> dict[str, str]:
    """Each id's status via ``outbox.get`` (``"missing"`` when Redis has no such message)."""
    import outbox

    out = {}
    for message_id in ids:
        try:
            out[message_id] = outbox.get(message_id).status
        except outbox.MessageNotFound:
            out[message_id] = "missing"
    return out


def describe(message_id: str) -> str:
    """One line about a message that did not settle: its status, retries, due time, last error."""
    import outbox

    m = outbox.get(message_id)
    due = f"due {m.next_attempt_at - time.time():+.0f} s" if m.next_attempt_at else "no due time"
    return (
        f"unsettled {m.id}: {m.status}, retry {m.retry_count}/{m.max_retries}, {due}, "
        f"{len(outbox.attempts(m.id))} attempts, last error {m.last_error!r:.80}"
    )


def tally(
    run: Run,
    result: Result,
    acked: Sequence[str],
    *,
    first_send: float,
    settled_at: float | None,
    must_receive: Callable[[str], bool] = lambda message_id: True,
) -> dict[str, str]:
    """Fill the table's columns of ``result`` from the acknowledged ids. Returns id -> status.

    Args:
        run: the run (its receiver and callable log count deliveries).
        result: filled in place.
        acked: the acknowledged message ids (duplicates in it are counted once).
        first_send: ``time.monotonic()`` of the first send.
        settled_at: what :func:`wait_settled` returned.
        must_receive: which succeeded ids must have been received (all by default).
    """
    unique = list(dict.fromkeys(acked))
    found = statuses(unique)
    delivered = run.delivered()
    by_status = Counter(found.values())
    result.sent = len(unique)
    result.succeeded = by_status["succeeded"]
    result.failed = by_status["failed"]
    result.lost = sum(1 for s in found.values() if s == "missing" or s in ACTIVE)
    result.duplicates = sum(1 for i in unique if delivered[i] > 1)
    result.not_received = sum(
        1 for i, s in found.items() if s == "succeeded" and must_receive(i) and not delivered[i]
    )
    if settled_at is not None:
        result.settle_s = round(settled_at - first_send, 1)
        if run.last_fault_end is not None:
            result.recover_s = round(max(0.0, settled_at - run.last_fault_end), 1)
    missing = by_status["missing"]
    unsettled = {s: by_status[s] for s in ACTIVE if by_status[s]}
    if missing or unsettled:
        result.notes.append(f"lost: {missing} missing from Redis, never settled: {unsettled or 0}")
        result.notes += [describe(i) for i, s in found.items() if s in ACTIVE][:3]
    extra = sum(delivered.values()) - sum(min(1, delivered[i]) for i in unique)
    if extra:
        result.notes.append(f"deliveries beyond the first: {extra}")
    return found


def worker_notes(result: Result, supervisor: Supervisor) -> None:
    crashes = supervisor.crashes()
    result.notes.append(
        f"workers: {supervisor.starts} started, {supervisor.kills} killed by the harness, "
        f"{len(crashes)} exited by themselves"
        + (f" (exit codes {dict(Counter(e.returncode for e in crashes))})" if crashes else "")
    )


# -- the table ---------------------------------------------------------------------------

COLUMNS = (
    "scenario",
    "sent",
    "succeeded",
    "failed",
    "lost",
    "duplicates",
    "settle s",
    "recover s",
    "verdict",
)


def _row(r: Result) -> list[str]:
    if r.skipped:
        return [r.scenario, "", "", "", "", "", "", "", "SKIPPED"]
    failed_checks = [c.name for c in r.checks if not c.ok]
    verdict = "ok" if r.ok else "FAIL" + (f" ({', '.join(failed_checks)})" if failed_checks else "")
    lost = f"{r.lost}" + (" (expected)" if r.lost_expected and r.lost else "")
    if r.not_received:
        verdict += f" [{r.not_received} succeeded not received]"
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    return [
        r.scenario,
        str(r.sent),
        str(r.succeeded),
        str(r.failed),
        lost,
        str(r.duplicates),
        fmt(r.settle_s),
        fmt(r.recover_s),
        verdict,
    ]


def table(results: Sequence[Result]) -> str:
    """The results as a Markdown table, then each scenario's checks and notes."""
    rows = [list(COLUMNS)] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    details = []
    for r in results:
        details.append(
            f"\n{r.scenario} ({r.elapsed_s:.0f} s)" + (f": skipped: {r.skipped}" if r.skipped else "")
        )
        details += [
            f"  [{'ok' if c.ok else 'FAIL'}] {c.name}" + (f": {c.detail}" if c.detail else "")
            for c in r.checks
        ]
        details += [f"  - {note}" for note in r.notes]
    return "\n".join(lines) + "\n" + "\n".join(details) + "\n"


def json_dump(result: Result, path: Path) -> None:
    path.write_text(json.dumps(result.to_dict(), indent=1))


def in_flight_duplicates(
    run: Run, ids: list[str], kills: list[float], visibility_timeout: float
) -> tuple[int, list[str]]:
    """(duplicated messages, those not explained by a crash): a message may be delivered
    again only for an attempt in flight when a worker was SIGKILLed, which the recovery
    sweep records as ``lost``: each delivery beyond the first needs a ``lost`` attempt
    that started before a kill (``kills``: epoch seconds) and within
    ``visibility_timeout`` (+ 1 s) of it."""
    import outbox

    delivered = run.delivered()
    again = [i for i in ids if delivered[i] > 1]
    beyond = []
    for message_id in again:
        lost_at_kill = [
            a
            for a in outbox.attempts(message_id)
            if a.outcome == "lost"
            and any(a.started_at - 1 <= k <= a.started_at + visibility_timeout + 1 for k in kills)
        ]
        if delivered[message_id] > 1 + len(lost_at_kill):
            beyond.append(message_id)
    return len(again), beyond
