"""Issue 33's "Done when" scenario, run by ``test_uvicorn.py`` (what it asserts) and by
``benchmarks/bench_async.py`` (the health endpoint's latency, with its 50 ms target):
``tests/integrations/uvicorn_app.py`` served by uvicorn in a subprocess on the private
Redis ``server``; its view sends ``n`` messages with ``outbox.asend`` (``asend_again``
after an unknown outcome) while ``/health`` is asked every 10 ms from this process and
the Redis is stopped (SIGSTOP) for ``hang`` seconds, ``hang_at`` seconds after the send
began.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """What one run saw.

    Attributes:
        status, ids, again: the send view's answer (HTTP status; the id of each message
            it stored, in order; how many ``asend_again`` calls it made).
        latencies: seconds of each ``/health`` answer while the view was sending.
        during_hang: those asked while the Redis was stopped.
    """

    status: int = 0
    ids: list[str] = field(default_factory=list)
    again: int = 0
    latencies: list[float] = field(default_factory=list)
    during_hang: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(server: Any, *, n: int = 1000, chunk: int = 50, pause: float = 0.1, hang_at: float = 0.5,
        hang: float = 2.0, socket_timeout: float = 1.0, gc_freeze: bool = False) -> Run:  # fmt: skip
    """The scenario on ``server`` (a started :class:`outbox.testing.RedisServer`);
    ``gc_freeze``: the app calls ``gc.freeze()`` once loaded (the benchmark's tuned row)."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.integrations.uvicorn_app",
        "OUTBOX_TEST_REDIS_URL": server.url,
        "OUTBOX_TEST_SERVERS_FOR": os.environ.get("PYTEST_XDIST_WORKER", ""),
        "OUTBOX_TEST_SOCKET_TIMEOUT": str(socket_timeout),
        "OUTBOX_TEST_GC_FREEZE": "1" if gc_freeze else "",
    }
    env.pop("OUTBOX_TEST_CLUSTER", None)
    app = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.integrations.uvicorn_app:application",
         "--port", str(port), "--log-level", "warning", "--lifespan", "off"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    out = Run()
    try:
        health = _wait_for(port, app)
        done = threading.Event()

        def sender() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("GET", f"/send?n={n}&chunk={chunk}&pause={pause}")
                response = conn.getresponse()
                answer = json.loads(response.read())
                out.status, out.ids, out.again = response.status, answer["ids"], answer["again"]
            finally:
                done.set()

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        started = time.monotonic()
        stopped_at: float | None = None
        resumed = False
        while not done.is_set():
            elapsed = time.monotonic() - started
            if elapsed > 60:
                raise AssertionError("the send view did not answer within 60 s")
            if stopped_at is None and elapsed > hang_at:
                server.process.send_signal(signal.SIGSTOP)
                stopped_at = elapsed
            elif stopped_at is not None and not resumed and elapsed - stopped_at > hang:
                server.process.send_signal(signal.SIGCONT)
                resumed = True
            hanging = stopped_at is not None and not resumed
            asked = time.perf_counter()
            health.request("GET", "/health")
            if health.getresponse().read() != b"ok":
                raise AssertionError("/health did not answer ok")
            took = time.perf_counter() - asked
            out.latencies.append(took)
            if hanging:
                out.during_hang.append(took)
            time.sleep(0.01)
        thread.join()
    finally:
        server.process.send_signal(signal.SIGCONT)
        app.terminate()
        app.wait(10)
    return out


def _wait_for(port: int, app: subprocess.Popen[bytes]) -> http.client.HTTPConnection:
    """A connection to the app once ``/health`` answers (at most 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        health = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            health.request("GET", "/health")
            if health.getresponse().read() == b"ok":
                return health
        except OSError:
            pass
        if time.monotonic() > deadline or app.poll() is not None:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.1)
