"""The fault suite's webhook receiver: a separate process on loopback that can be told to fail.

``python -m tests.faults.receiver --port P --control-port C --secret whsec_...``

Webhooks (``POST`` to any path on port P) are verified with
``standardwebhooks.Webhook(secret).verify`` (401 when forged); then, in this order:

1. a message whose JSON body has ``"hang": s`` (and optionally ``"hang_times": n``, default
   1) makes its first n requests wait s seconds and answer 503, not accepted: a receiver
   that hangs for one message;
2. ``"delay": s`` in the body waits s seconds, then goes on (a slow but working receiver);
3. mode ``slow``: waits that many seconds before going on (beyond the transport deadline);
4. mode ``refuse_marked``: a message whose body has ``"refuse": true`` is answered 400 (a
   permanent failure: the outbox makes it a dead letter at once);
5. mode ``reset_rate``: that fraction of requests is answered by resetting the connection
   (``SO_LINGER`` 0, then close: the client reads a TCP RST, no answer; not accepted);
6. mode ``fail_rate``: answers 500 (not accepted) to that fraction of requests;
7. otherwise the ``webhook-id`` is *accepted*: counted, and answered 200 — dripped one byte
   per ``drip`` seconds when that mode is set (status line, headers and body, so a client
   with only per-read timeouts waits for all of it).

Every signed request is also logged, for the ordering scenarios: ``[arrived, decided, id,
ordering key, sequence, previous, answer]``, where ``arrived`` and ``decided`` are numbers
of one counter (taken when the request was read, and when its answer was decided, just
before it is written: a client cannot see an answer before its ``decided``), the ordering
fields are the ``Outbox-Ordering-*`` headers (None when absent) and ``answer`` is ``200``,
``400``, ``500``, ``503`` or ``"reset"``. The first ``200`` of an id is its first acceptance;
two requests of one key whose [arrived, decided] overlap were in flight at once.

An accepted id counts as processed even if the client gave up before the answer (as a real
receiver commits its side effects); an id accepted twice is a duplicate delivery.

Endpoints registered at runtime (webhooks for customers, ``fan-out``): ``POST /secrets`` with
``{path: secret}`` gives each path its own secret. A request to such a path is verified with
that secret alone (401 when another endpoint's secret signed it); its acceptance is counted
under its ``Outbox-Delivery-Id`` (the ``webhook-id`` is the event's, the same for every
endpoint), and every verified request to it is also counted in ``routes`` under
``"<path> <webhook-id> <delivery id>"``, answered or not, so a misdirected delivery shows.

Mode ``down`` closes the listening socket and every open connection (connections are
refused) until it is cleared; the port stays the same.

Control (port C): ``GET /state`` returns JSON ``{"accepted": {id: count}, "requests": n,
"bad_signature": n, "failed": n, "hung": n, "reset": n, "refused": n, "incomplete": n,
"routes": {...}, "mode": {...}}``;
``GET /log`` the request log above (a JSON list, in order of arrival); ``POST /mode`` with a JSON
object sets mode keys (``down``, ``fail_rate``, ``reset_rate``, ``refuse_marked``, ``slow``,
``drip``, ``drip_bytes``); ``POST /secrets`` the per-path secrets above; ``POST /reset`` clears the counters and the log. A request whose body
ends before its ``Content-Length`` (the client died while sending it) is counted as
``incomplete`` and not answered, not as a bad signature.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook

DEFAULT_MODE: dict[str, Any] = {
    "down": False,
    "fail_rate": 0.0,
    "reset_rate": 0.0,
    "refuse_marked": False,
    "slow": 0.0,
    "drip": 0.0,
    "drip_bytes": 40,
}
ORDERING_HEADERS = ("outbox-ordering-key", "outbox-ordering-sequence", "outbox-ordering-previous")


class State:
    """Counters and the failure mode, shared by the handler threads."""

    def __init__(self, secret: str) -> None:
        self.verifier = Webhook(secret)
        self.path_verifiers: dict[str, Webhook] = {}  # path -> its endpoint's own secret
        self.routes: Counter[str] = Counter()  # "<path> <webhook-id> <delivery id>" per verified request
        self.lock = threading.Lock()
        self.mode = dict(DEFAULT_MODE)
        self.accepted: Counter[str] = Counter()
        self.hangs: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()
        self.clock = 0  # the request log's counter (arrivals and decisions)
        self.log: list[list[Any]] = []
        self.bad: list[str] = []  # the first bad signatures: id, why

    def tick(self) -> int:
        """The request log's next number (call with :attr:`lock` held)."""
        self.clock += 1
        return self.clock

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "accepted": dict(self.accepted),
                "routes": dict(self.routes),
                "mode": dict(self.mode),
                "bad_examples": list(self.bad),
                **self.counters,
            }


class HookServer(ThreadingHTTPServer):
    """A threaded HTTP server that can close every connection it has open (``down``)."""

    daemon_threads = True
    allow_reuse_address = True
    # A listen backlog like a real server's (nginx and gunicorn default to 511 and 2048;
    # Python's socketserver to 5): when the receiver comes back after an outage every
    # worker connects at once, and a backlog of 5 dropped SYNs, which the workers saw as
    # 1 s connect timeouts that the scenario counted against the outbox.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: State) -> None:
        self.state = state
        self.open_sockets: set[socket.socket] = set()
        self.to_reset: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, HookHandler)

    def process_request(self, request, client_address):  # type: ignore[override]
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[override]
        with self.sockets_lock:
            self.open_sockets.discard(request)
            reset = request in self.to_reset
            self.to_reset.discard(request)
        if reset:  # no FIN first (socketserver's shutdown(SHUT_WR)): close with SO_LINGER 0 sends RST
            self.close_request(request)
        else:
            super().shutdown_request(request)

    def close_all(self) -> None:
        """Stop listening and cut every open connection."""
        self.shutdown()
        self.server_close()
        with self.sockets_lock:
            for sock in list(self.open_sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class HookHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: HookServer

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes = b"", drip: float = 0.0) -> None:
        raw = (
            f"HTTP/1.1 {status} {'OK' if status < 300 else 'Error'}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        try:
            if drip > 0:
                for i in range(len(raw)):
                    self.wfile.write(raw[i : i + 1])
                    self.wfile.flush()
                    time.sleep(drip)
            else:
                self.wfile.write(raw)
        except OSError:  # the client gave up
            self.close_connection = True

    def reset(self) -> None:
        """End this connection with a TCP RST instead of an answer."""
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self.server.sockets_lock:
            self.server.to_reset.add(self.connection)
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        state = self.server.state
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        with state.lock:
            state.counters["requests"] += 1
            mode = dict(state.mode)
            if len(body) < length:  # the client went away mid-request (a worker killed): no answer
                state.counters["incomplete"] += 1
        if len(body) < length:
            self.close_connection = True
            return
        path = self.path.split("?", 1)[0]
        with state.lock:
            verifier = state.path_verifiers.get(path)
        try:
            (verifier or state.verifier).verify(body, {k.lower(): v for k, v in self.headers.items()})
        except Exception as exc:  # forged, or headers missing
            with state.lock:
                state.counters["bad_signature"] += 1
                if len(state.bad) < 10:
                    state.bad.append(f"{self.headers.get('webhook-id')}: {type(exc).__name__}: {exc}"[:200])
            return self.answer(401, b"bad signature")
        message_id = self.headers["webhook-id"]
        counted = message_id
        if verifier is not None:  # an endpoint's: one webhook-id (the event's) for all endpoints
            counted = str(self.headers.get("outbox-delivery-id"))
            with state.lock:
                state.routes[f"{path} {message_id} {counted}"] += 1
        entry: list[Any] = [0, 0, message_id, *(self.headers.get(h) for h in ORDERING_HEADERS), "error"]
        with state.lock:
            entry[0] = state.tick()
            state.log.append(entry)
        status, payload = 500, b"receiver error"
        try:
            status, payload = self.decide(state, mode, message_id, body)
        finally:
            # decided before the answer is written: the client cannot see it earlier
            with state.lock:
                entry[1] = state.tick()
                entry[6] = status
                if status == 200:
                    state.accepted[counted] += 1
        if status == "reset":
            return self.reset()
        self.answer(status, payload, drip=float(mode["drip"]) if status == 200 else 0.0)

    def decide(self, state: State, mode: dict[str, Any], message_id: str, body: bytes) -> tuple[Any, bytes]:
        """The answer to a signed request: (status or ``"reset"``, body)."""
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        data = data if isinstance(data, dict) else {}
        if data.get("hang"):
            with state.lock:
                state.hangs[message_id] += 1
                hang = state.hangs[message_id] <= int(data.get("hang_times", 1))
                if hang:
                    state.counters["hung"] += 1
            if hang:
                time.sleep(float(data["hang"]))
                return 503, b"hung"
        if data.get("delay"):
            time.sleep(float(data["delay"]))
        if mode["slow"]:
            time.sleep(float(mode["slow"]))
        if mode["refuse_marked"] and data.get("refuse"):
            with state.lock:
                state.counters["refused"] += 1
            return 400, b"refused for good"
        if mode["reset_rate"] and random.random() < mode["reset_rate"]:
            with state.lock:
                state.counters["reset"] += 1
            return "reset", b""
        if mode["fail_rate"] and random.random() < mode["fail_rate"]:
            with state.lock:
                state.counters["failed"] += 1
            return 500, b"simulated failure"
        return 200, b"ok" + b"." * (int(mode["drip_bytes"]) if mode["drip"] else 0)


class ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, data: Any, status: int = 200) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        state = self.server.receiver.state  # type: ignore[attr-defined]
        if self.path == "/log":
            with state.lock:
                log = [list(entry) for entry in state.log]
            return self.reply(log)
        self.reply(state.snapshot())

    def do_POST(self) -> None:  # noqa: N802
        receiver: Receiver = self.server.receiver  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/reset":
            with receiver.state.lock:
                receiver.state.accepted.clear()
                receiver.state.hangs.clear()
                receiver.state.counters.clear()
                receiver.state.log.clear()
                receiver.state.bad.clear()
                receiver.state.routes.clear()
            return self.reply({"ok": True})
        changes = json.loads(raw or b"{}")
        if self.path == "/secrets":
            verifiers = {path: Webhook(secret) for path, secret in changes.items()}
            with receiver.state.lock:
                receiver.state.path_verifiers.update(verifiers)
            return self.reply({"paths": len(receiver.state.path_verifiers)})
        unknown = set(changes) - set(DEFAULT_MODE)
        if unknown:
            return self.reply({"error": f"unknown mode keys {sorted(unknown)}"}, 400)
        receiver.set_mode(changes)
        self.reply(receiver.state.snapshot()["mode"])


class Receiver:
    """The webhook server (restartable, for ``down``) and its control server."""

    def __init__(self, port: int, control_port: int, secret: str) -> None:
        self.port = port
        self.state = State(secret)
        self.hook: HookServer | None = None
        self.control = ThreadingHTTPServer(("127.0.0.1", control_port), ControlHandler)
        self.control.daemon_threads = True
        self.control.receiver = self  # type: ignore[attr-defined]
        self.mode_lock = threading.Lock()

    def up(self) -> None:
        if self.hook is None:
            self.hook = HookServer(("127.0.0.1", self.port), self.state)
            threading.Thread(
                target=self.hook.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            ).start()

    def down(self) -> None:
        if self.hook is not None:
            self.hook.close_all()
            self.hook = None

    def set_mode(self, changes: dict[str, Any]) -> None:
        with self.mode_lock:
            with self.state.lock:
                self.state.mode.update(changes)
                down = self.state.mode["down"]
            self.down() if down else self.up()

    def serve(self) -> None:
        self.up()
        self.control.serve_forever(poll_interval=0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.receiver", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--secret", required=True)
    args = parser.parse_args(argv)
    receiver = Receiver(args.port, args.control_port, args.secret)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(
        f"receiver: http://127.0.0.1:{args.port}/hook, control http://127.0.0.1:{args.control_port}/",
        flush=True,
    )
    receiver.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
