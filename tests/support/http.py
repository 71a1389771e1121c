"""One loopback HTTP receiver for every test that needs a real one.

:func:`receiving` runs a :class:`Receiver` (a threaded HTTP/1.1 server on 127.0.0.1) for a
block; the ``receiver`` fixture is one for a test. What it answers, in order of precedence:

- ``handler``: a function given the request handler, which writes the whole response
  itself (an echo, a gzip bomb, a recording proxy...);
- ``answer``: a function ``answer(receiver, request) -> response`` deciding from the
  receiver's state when the request arrives (under its lock: ``receiver.active`` is the
  number of other requests being answered);
- :meth:`Receiver.on`: a script of responses for one path, used in turn (the last repeats);
- :meth:`Receiver.respond`: the script for every other path, used in turn across them.

A response is a status code or a tuple ``(status, headers, delay seconds, body)`` whose
tail may be left out; the body defaults to ``b"ok"`` below 300, else ``b"nope"``. The body
:data:`ENDLESS` streams chunks until the client hangs up. Every request is recorded in
``requests`` (with its client port: one per TCP connection), every status answered in
``statuses`` (in the order answered), and ``most_active`` is the most requests it was
answering at once.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: A response body marker: stream chunks until the client hangs up (or 10 s).
ENDLESS = b"<endless>"

Response = tuple[int, dict[str, str], float, "bytes | None"]


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    header_items: list[tuple[str, str]] = field(default_factory=list)  # as sent, in order
    port: int = 0  # the client's source port: one per TCP connection
    method: str = "POST"
    at: float = field(default_factory=time.time)  # when the request arrived (epoch seconds)

    def json(self):
        return json.loads(self.body)


def _full(response: int | tuple) -> Response:
    r = (response,) if isinstance(response, int) else tuple(response)
    return (r[0], r[1] if len(r) > 1 else {}, r[2] if len(r) > 2 else 0.0, r[3] if len(r) > 3 else None)


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 answering from scripts of responses (see the module)."""

    base: str = ""  # http://127.0.0.1:<port>
    url: str = ""  # base + "/hook"
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    responses: list[Response] = field(default_factory=lambda: [(200, {}, 0.0, None)])
    script: dict[str, list[Response]] = field(default_factory=dict)
    answer: Callable[[Receiver, Received], int | tuple] | None = None
    handler: Callable[[BaseHTTPRequestHandler], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    most_active: int = 0

    def respond(self, *responses: int | tuple) -> None:
        """Answer requests (on paths not scripted with :meth:`on`) with these in turn."""
        self.responses = [_full(r) for r in responses]

    def on(self, path: str, *responses: int | tuple) -> str:
        """Answer requests on ``path`` with these in turn; returns its URL."""
        self.script[path] = [_full(r) for r in responses]
        return self.base + path

    def for_path(self, path: str) -> list[Received]:
        return [r for r in self.requests if r.path == path]

    def ports(self, path: str | None = None) -> set[int]:
        """The client ports requests came from (one per TCP connection)."""
        return {r.port for r in self.requests if path is None or r.path == path}

    def arrive(self, request: Received) -> Response:
        """Record ``request`` and choose its response (called with the lock held)."""
        on_path = len(self.for_path(request.path))
        everywhere = len(self.requests)
        self.requests.append(request)
        if self.answer is not None:
            return _full(self.answer(self, request))
        if request.path in self.script:
            script = self.script[request.path]
            return script[min(on_path, len(script) - 1)]
        return self.responses[min(everywhere, len(self.responses) - 1)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body in two writes meet delayed ACKs: +40 ms
    state: Receiver  # set on the subclass made for each receiver

    def do_POST(self):
        state = self.state
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length) if length else b""
        if state.handler is not None:
            with state.lock:
                state.requests.append(self._received(body))
            state.handler(self)
            return
        with state.lock:
            status, headers, delay, payload = state.arrive(self._received(body))
            state.active += 1
            state.most_active = max(state.most_active, state.active)
        try:
            if delay:
                time.sleep(delay)
        finally:
            with state.lock:
                state.active -= 1
                state.statuses.append(status)
        if payload is None:
            payload = b"ok" if status < 300 else b"nope"
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if payload == ENDLESS:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 8192
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # until the client hangs up
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                return
            if status in (204, 304):
                self.end_headers()
                return
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (its timeout, a size cap): nothing to answer
            self.close_connection = True

    do_GET = do_POST

    def _received(self, body: bytes) -> Received:
        return Received(
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            list(self.headers.items()),
            self.client_address[1],
            self.command,
        )

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    # socketserver's backlog of 5 drops the SYNs of a worker opening 16 or more
    # connections at once; each dropped one connects a second later (SYN retry).
    request_queue_size = 128


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[socketserver.BaseServer]:
    """Run a socketserver (HTTP, SMTP...) on loopback in a daemon thread for the block."""
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def receiving(
    *,
    answer: Callable[[Receiver, Received], int | tuple] | None = None,
    handler: Callable[[BaseHTTPRequestHandler], None] | None = None,
) -> Iterator[Receiver]:
    """A :class:`Receiver` listening on loopback for the block (the ``receiver`` fixture
    is one; a test that needs another, or one that answers by ``answer`` or ``handler``,
    opens it with this)."""
    state = Receiver(answer=answer, handler=handler)
    handler_class = type("Handler", (_Handler,), {"state": state})
    with serving(_Server(("127.0.0.1", 0), handler_class)) as server:
        state.base = f"http://127.0.0.1:{server.server_address[1]}"
        state.url = state.base + "/hook"
        yield state
