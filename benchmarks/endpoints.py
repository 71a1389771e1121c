"""Issue 34's rows (``python -m benchmarks.compare --endpoints``): webhooks for customers
at 10,000 registered endpoints against the same traffic to one settings destination.

One case (:func:`case_endpoints`, ``case endpoints``) per round, in a process of its own
with its own private Redis and SQLite file:

* 10,000 endpoints registered: 10 applications of 1,000 (``bulk_create`` with encrypted
  secrets, then :func:`outbox.webhooks.changed`, the cache/version announce), each a URL
  of a loopback receiver (:func:`verifying_receiver`) with its own secret;
* delivery: ``n`` deliveries spread over the 1,000 endpoints of one application
  (``n / 1000`` events published to it), drained by one ``outbox_worker --burst`` process,
  against ``n`` messages ``send_many``-ed to the settings destination ``hook`` (signed
  too), drained the same way; the order of the two alternates by round. Each request is
  verified at the receiver with its endpoint's own secret (the receiver answers after
  ``RECEIVER_DELAY``, 50 ms, as the other webhook rows). Rate: as the receiver saw it;
  Redis commands: ``INFO commandstats`` during the drain, per delivery, and the server's
  CPU for them (``INFO cpu``, its main thread: a script call and a ``ZREM`` count one
  command each, not the same work);
* ``publish()`` to an application with one endpoint against ``send()`` to ``hook``:
  alternating blocks of calls, calls per second, median of the blocks;
* ``publish()`` of one event to 1,000 subscribed endpoints: milliseconds, median;
* bytes per delivery: Redis ``used_memory`` delta over events to 1,000 endpoints each, of
  a 200-byte payload and of a 10 KB one.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ENDPOINTS = 10_000
PER_APPLICATION = 1_000
RECEIVER_DELAY = 0.050
CALL_BLOCK = 100  # calls per block of publish() / send()
# blocks of each (5 until 2026-11-29 16:15 UTC). Right after a drain the process has
# hiccups (a block of 100 calls at half the rate, then one at 1.3 times it) that hit 2 of 5
# blocks of one side often enough to move that side's median by 20 %; of 20 they move
# neither median
CALL_BLOCKS = 20
FAN_OUT_CALLS = 10  # publishes of one event to 1,000 endpoints
MEMORY_EVENTS = 3  # events (of 1,000 deliveries each) per payload size
SWEEP_INTERVAL = 30  # s: RECOVERY_INTERVAL as the benchmark runs it (the default)


def verifying_receiver(secrets: dict[str, str], delay: float) -> tuple[ThreadingHTTPServer, str]:
    """A loopback server answering 200 after ``delay`` s to a request whose signature its
    path's own secret (``secrets``: path -> secret) verifies, 401 otherwise; records the
    time of each 200 (``server.answered``) and counts bad signatures (``server.bad``)."""
    from standardwebhooks import Webhook

    verifiers = {path: Webhook(secret) for path, secret in secrets.items()}
    answered: list[float] = []
    bad = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = 200
            try:
                self.server.verifiers[self.path].verify(body, {k.lower(): v for k, v in self.headers.items()})
            except Exception:
                status = 401
                with lock:
                    bad[0] += 1
            if delay and status == 200:
                time.sleep(delay)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if status == 200:
                answered.append(time.perf_counter())

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    server = Server(("127.0.0.1", 0), Handler)
    server.answered = answered  # type: ignore[attr-defined]
    server.bad = bad  # type: ignore[attr-defined]
    server.verifiers = verifiers  # type: ignore[attr-defined]  (more paths: add_secrets)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def register(base: str) -> tuple[dict[str, str], float]:
    """10 applications of 1,000 endpoints (``app-0`` .. ``app-9``; ``solo`` with one), each
    URL ``base/<app>/<i>`` with its own secret. Returns (path -> secret, seconds taken)."""
    from outbox import webhooks
    from outbox.destinations import secrets as secret_store
    from outbox.models import Endpoint

    t0 = time.perf_counter()
    webhooks.create_event_type("order.paid")
    paths: dict[str, str] = {}
    for a in range(ENDPOINTS // PER_APPLICATION):
        app = webhooks.create_application(f"app-{a}")
        rows = []
        for i in range(PER_APPLICATION):
            secret = secret_store.generate_secret()
            path = f"/app-{a}/{i}"
            paths[path] = secret
            rows.append(
                Endpoint(
                    application=app,
                    url=base + path,
                    uid=f"ep-{i}",
                    secrets=secret_store.encrypt(secret_store.SecretSet(secret)),
                )
            )
        webhooks.changed(*Endpoint.objects.bulk_create(rows, batch_size=500))
    webhooks.create_application("solo")
    created = webhooks.create_endpoint("solo", base + "/solo/0")
    paths["/solo/0"] = created.secret
    assert Endpoint.objects.count() == ENDPOINTS + 1
    return paths, time.perf_counter() - t0


def sweep() -> int:
    """One recovery sweep (:func:`outbox.delivery.recovery.recover`: leases, purge, the
    destination summary) made here under the sweep's lock, as the one worker process that
    takes the lock in an interval makes it; its Redis commands (INFO commandstats),
    reported apart and amortised at its interval (:func:`endpoints_run`). The lock is
    kept for its interval: the drain's ``--burst`` worker finds it held and skips its own
    sweep, as it does behind a long-running worker's (``run_housekeeping_once``).
    Returns the sweep's commands."""
    import uuid

    from benchmarks.common import commandstats, stats_delta
    from outbox.conf import outbox_settings
    from outbox.delivery.recovery import recover
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    before = commandstats(conn)
    held = get_repository().acquire_lock(
        "recovery", uuid.uuid4().hex, outbox_settings.RECOVERY_INTERVAL * 0.9
    )
    assert held, "another process holds the recovery lock"
    recover()
    return sum(stats_delta(before, commandstats(conn)).values())


def drain(n: int, receiver: Any) -> dict[str, float]:
    """One burst worker delivers the n due messages: the receiver's rate and the Redis
    commands per delivery during the run; the recovery sweep, made just before (:func:`sweep`),
    counted apart (commands per sweep)."""
    from benchmarks.common import commandstats, outbox_burst, receiver_rate, server_cpu, stats_delta
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    receiver.answered.clear()
    swept = sweep()
    before, cpu_before = commandstats(conn), server_cpu(conn)
    outbox_burst(n)
    cpu = server_cpu(conn) - cpu_before
    commands = sum(stats_delta(before, commandstats(conn)).values())
    counts = get_repository().counts()
    assert counts["succeeded"] >= n and not counts["pending"], counts
    return {
        "per_s": receiver_rate(receiver),
        "cmds_per_msg": commands / n,
        "server_us_per_msg": cpu * 1e6 / n,
        "sweep": swept,
    }


def delivery_pair(n: int, receiver: Any, endpoints_first: bool) -> dict[str, float]:
    """n deliveries over app-0's 1,000 endpoints and n to ``hook``, each drained alone."""
    import outbox
    from benchmarks.common import body_200
    from outbox.store.client.connection import get_connection

    out: dict[str, float] = {}
    body = body_200()

    def to_endpoints() -> None:
        for _ in range(n // PER_APPLICATION):
            outbox.publish("order.paid", body, application="app-0")
        r = drain(n // PER_APPLICATION * PER_APPLICATION, receiver)
        out.update({f"endpoints_{k}": v for k, v in r.items()})

    def to_hook() -> None:
        for i in range(0, n, 100):
            outbox.send_many([{"destination": "hook", "body": body}] * min(100, n - i))
        r = drain(n, receiver)
        out.update({f"hook_{k}": v for k, v in r.items()})

    for step in (to_endpoints, to_hook) if endpoints_first else (to_hook, to_endpoints):
        get_connection().flushdb()
        step()
    return out


def calls(receiver: Any) -> dict[str, float]:
    """publish() to ``solo`` (one endpoint) against send() to ``hook``, calls per second
    in alternating blocks (medians); publish() to 1,000 endpoints, ms (median)."""
    import outbox
    from benchmarks.common import body_200

    body = body_200()
    publish_rates, send_rates = [], []
    for _ in range(CALL_BLOCKS):
        t0 = time.perf_counter()
        for _ in range(CALL_BLOCK):
            outbox.publish("order.paid", body, application="solo")
        publish_rates.append(CALL_BLOCK / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(CALL_BLOCK):
            outbox.send("hook", body)
        send_rates.append(CALL_BLOCK / (time.perf_counter() - t0))
    fan_out_ms = []
    for _ in range(FAN_OUT_CALLS):
        t0 = time.perf_counter()
        event = outbox.publish("order.paid", body, application="app-1")
        fan_out_ms.append((time.perf_counter() - t0) * 1000)
        assert len(event.deliveries) == PER_APPLICATION
    return {
        "publish_per_s": statistics.median(publish_rates),
        "send_per_s": statistics.median(send_rates),
        "fan_out_ms": statistics.median(fan_out_ms),
    }


def memory() -> dict[str, float]:
    """Bytes of Redis memory per pending delivery, events of a 200-byte and a 10 KB
    payload, each to app-2's 1,000 endpoints."""
    import outbox
    from benchmarks.common import body_200, used_memory
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    out = {}
    for label, body in (("small", body_200()), ("large", {**body_200(), "pad": "x" * 10_000})):
        conn.flushdb()
        outbox.publish("order.paid", body, application="app-2")  # scripts, keys of the set-up
        m0 = used_memory(conn)
        for _ in range(MEMORY_EVENTS):
            outbox.publish("order.paid", body, application="app-2")
        out[f"{label}_bytes"] = (used_memory(conn) - m0) / (MEMORY_EVENTS * PER_APPLICATION)
        out[f"{label}_payload"] = len(json.dumps(body, separators=(",", ":")))
    return out


@contextlib.contextmanager
def registered(prefix: str) -> Iterator[tuple[Any, dict[str, str], float, str]]:
    """One round's set-up (:func:`case_endpoints`, ``benchmarks.profile_endpoints``): the
    tuned profile, a SQLite file in a new temporary folder (named ``prefix...``), the
    verifying receiver (the settings destination ``hook`` signed with a secret of its
    own), a private Redis, Django migrated and the endpoints registered (:func:`register`).
    Yields (receiver, path -> secret, seconds the registration took, the folder)."""
    from benchmarks.common import private_redis, setup_django, use_profile
    from outbox.destinations.secrets import generate_secret

    use_profile("tuned")  # the hook may use the worker's CONCURRENCY, as an endpoint may
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.environ["BENCH_DB"] = str(Path(tmp) / "db.sqlite3")
    hook_secret = generate_secret()
    os.environ["BENCH_HOOK_SECRET"] = hook_secret
    receiver, base = verifying_receiver({"/hook": hook_secret}, RECEIVER_DELAY)
    os.environ["BENCH_HOOK_URL"] = base + "/hook"
    server = private_redis()
    try:
        setup_django()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        paths, setup_s = register(base)
        add_secrets(receiver, paths)
        yield receiver, paths, setup_s, tmp
    finally:
        server.stop()
        receiver.shutdown()


def case_endpoints(n: int, round_no: int = 1) -> dict:
    """Every figure of the table, in one process (see the module docstring)."""
    with registered("bench-endpoints-") as (receiver, paths, setup_s, _):
        out: dict[str, Any] = {"setup_s": setup_s, "endpoints": len(paths)}
        out.update(delivery_pair(n, receiver, endpoints_first=round_no % 2 == 1))
        out.update(calls(receiver))
        out.update(memory())
        out["bad_signatures"] = receiver.bad[0]  # type: ignore[attr-defined]
        return out


def add_secrets(receiver: Any, secrets: dict[str, str]) -> None:
    """Paths (and their secrets) the running :func:`verifying_receiver` verifies too."""
    from standardwebhooks import Webhook

    receiver.verifiers.update({path: Webhook(secret) for path, secret in secrets.items()})


def _ratio_row(
    what: str, ours: list[float], peer: list[float], target: str, met: bool | None, peer_name: str
) -> str:
    from benchmarks.common import med

    ratio = statistics.median(ours) / statistics.median(peer)
    verdict = "" if met is None else "yes" if met else "**no**"
    return f"| {what} | {med(ours)} | {peer_name}: {med(peer)} | {ratio:.2f}× | {target} | {verdict} |"


def endpoints_run(rounds: int, n: int, out: str) -> None:
    """``--endpoints``: ``rounds`` rounds of :func:`case_endpoints`, the table of medians."""
    import platform

    from benchmarks.common import loadavg, med, publish, run_json

    results: list[dict] = []
    loads = [loadavg()]
    for r in range(1, rounds + 1):
        t = time.perf_counter()
        res = run_json(["case", "endpoints", "--n", str(n), "--round", str(r)], timeout=1200)
        results.append(res)
        print(f"round {r} endpoints {time.perf_counter() - t:5.1f} s  load {loadavg()}  {res}", flush=True)
        loads.append(loadavg())

    def vals(key: str) -> list[float]:
        return [float(res[key]) for res in results]

    def m(key: str) -> float:
        return statistics.median(vals(key))

    def amortised(side: str) -> float:
        return m(f"{side}_sweep") / (m(f"{side}_per_s") * SWEEP_INTERVAL)

    rate = m("endpoints_per_s") / m("hook_per_s")
    cmds = m("endpoints_cmds_per_msg") / m("hook_cmds_per_msg")
    server = m("endpoints_server_us_per_msg") / m("hook_server_us_per_msg")
    calls = m("publish_per_s") / m("send_per_s")
    mem = m("large_bytes") / m("small_bytes")
    lines = [
        f"Issue 34 (`python -m benchmarks.compare --endpoints --rounds {rounds} --n {n}`), {rounds} rounds, "
        f"medians (min-max); Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"load average before / after each round: {' → '.join(loads)}.",
        "",
        f"Set-up per round: {ENDPOINTS:,} endpoints (10 applications × {PER_APPLICATION:,}) registered by "
        f"`bulk_create` + `webhooks.changed()` in {med(vals('setup_s'))} s; each a loopback receiver path "
        f"with its own secret, every request verified there ({int(sum(vals('bad_signatures')))} bad signatures). "
        f"Receiver answers after {RECEIVER_DELAY * 1000:.0f} ms; one `outbox_worker --burst` process, "
        "started cold (its endpoint cache empty); `hook` at MAX_IN_FLIGHT 32 (the worker's CONCURRENCY).",
        "",
        "| what | endpoints | against | ratio | target | met |",
        "|---|---|---|---|---|:-:|",
        _ratio_row(
            f"delivery rate, 1 worker, {n:,} deliveries over 1,000 endpoints (msg/s)",
            vals("endpoints_per_s"), vals("hook_per_s"), "≥ 0.9×", rate >= 0.9,
            f"{n:,} to one settings destination",
        ),
        _ratio_row(
            "Redis commands per delivered message (INFO commandstats, during the drain; the sweep apart)",
            vals("endpoints_cmds_per_msg"), vals("hook_cmds_per_msg"), "within 10 %", abs(cmds - 1) <= 0.10,
            "settings destination",
        ),
        f"| Redis server CPU per delivered message (µs; `INFO cpu`, main thread, during the drain: "
        f"what the commands cost, scripts included) | {med(vals('endpoints_server_us_per_msg'))} | settings "
        f"destination: {med(vals('hook_server_us_per_msg'))} | {server:.2f}× | (context) | |",
        f"| recovery sweep (leases, purge, destination summary), once per RECOVERY_INTERVAL across the "
        f"workers, made just before each drain: commands per sweep | {med(vals('endpoints_sweep'))} | "
        f"settings destination: {med(vals('hook_sweep'))} | | (apart) | |",
        f"| the sweep amortised over a {SWEEP_INTERVAL} s interval at the measured rate (commands per "
        f"delivery) | {amortised('endpoints'):.2f} | settings destination: {amortised('hook'):.2f} | | | |",
        _ratio_row(
            "`publish()` to an application with one endpoint (calls/s, blocks of "
            f"{CALL_BLOCK})", vals("publish_per_s"), vals("send_per_s"), "≥ 0.8×", calls >= 0.8, "`send()`",
        ),
        f"| `publish()` of one event to 1,000 subscribed endpoints (ms per call, median of {FAN_OUT_CALLS}) | "
        f"{med(vals('fan_out_ms'))} | | | < 100 ms | {'yes' if m('fan_out_ms') < 100 else '**no**'} |",
        _ratio_row(
            f"Redis bytes per pending delivery, {int(m('large_payload')):,}-byte event (used_memory delta / "
            "deliveries)", vals("large_bytes"), vals("small_bytes"), "within 10 %", abs(mem - 1) <= 0.10,
            f"{int(m('small_payload'))}-byte event",
        ),
    ]  # fmt: skip
    publish(lines, out, "endpoints.md")
