"""Cost of ``send()`` and of delivery, against bare baselines measured in the same run.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_send [N]

Prints, for N messages (default 5,000):

* ``send()`` per call vs a bare RQ ``queue.enqueue()`` of a job (what django-rq alone
  costs) on the same private Redis;
* ``send_many()`` per message;
* delivery throughput of one in-place RQ worker (claim, POST, record) to a loopback
  HTTP receiver vs bare ``httpx`` POSTs of the same bodies to the same receiver.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import django


def receiver() -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # The default listen backlog (5) overflows when the worker opens its 16 concurrent
        # connections at once: the kernel drops SYNs and the client retries after 1 s.
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


def per_call(fn, n: int) -> float:
    """Median microseconds per call over 5 rounds of n/5 calls."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n // 5):
            fn()
        rounds.append((time.perf_counter() - t0) / (n // 5) * 1e6)
    return statistics.median(rounds)


def main(n: int) -> None:
    django.setup()
    import httpx
    from django.test import override_settings
    from rq import SimpleWorker

    import outbox
    from outbox.conf import outbox_settings
    from outbox.store.background.wakeups import get_queue
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    server, url = receiver()
    body = {"order": 1, "items": [{"sku": "A-1", "qty": 2}], "total": "19.90"}
    config = {**outbox_settings.user_settings}
    config["DESTINATIONS"] = {
        **config["DESTINATIONS"],
        "bench": {"TRANSPORT": "webhook", "OPTIONS": {"url": url, "allow_private_networks": True}},
    }
    with override_settings(OUTBOX=config):
        conn.flushdb()
        queue = get_queue("outbox")
        outbox.send("bench", body)  # warm-up
        bare = per_call(lambda: queue.enqueue("outbox.jobs.deliver", ["x"]), n)
        conn.flushdb()
        one = per_call(lambda: outbox.send("bench", body), n)
        conn.flushdb()
        t0 = time.perf_counter()
        for _ in range(0, n, 500):
            outbox.send_many([{"destination": "bench", "body": body}] * 500)
        many = (time.perf_counter() - t0) / n * 1e6
        print(
            f"send():            {one:8.1f} us/message   bare RQ enqueue: {bare:8.1f} us/job   ratio {one / bare:5.2f}"
        )
        print(f"send_many(500):    {many:8.1f} us/message   ratio to bare enqueue {many / bare:5.2f}")

        worker = SimpleWorker([queue], connection=conn)
        t0 = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING")
        delivered = time.perf_counter() - t0
        assert outbox.api.get_repository().count("succeeded") == n, "not all delivered"
        payload = b'{"order":1}'
        with httpx.Client() as client:
            t0 = time.perf_counter()
            for i in range(n):
                client.post(url, content=payload, headers={"webhook-id": f"msg_{i}"})
            bare_http = time.perf_counter() - t0
        print(
            f"delivery (batches of {outbox_settings.BATCH_SIZE}): {n / delivered:8.0f} messages/s   "
            f"bare httpx POST: {n / bare_http:8.0f} requests/s   ratio {bare_http / delivered:5.2f} of bare"
        )
    server.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
