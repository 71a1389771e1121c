"""``python manage.py demo_serve [addrport]``: ``runserver`` for the demo, with TCP_NODELAY.

Django's development server writes a response's headers and body in separate small
writes. On a kept-alive connection (the outbox's webhook transport reuses connections)
Nagle's algorithm then holds the body back until the client's delayed ACK, about 40 ms
per request on Linux. This command is ``runserver`` (static files included) whose
server sets ``TCP_NODELAY`` on every accepted connection: about 3 ms per webhook instead.
Options are runserver's.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from django.contrib.staticfiles.management.commands.runserver import Command as RunserverCommand
from django.core.servers.basehttp import WSGIServer


class NoDelayWSGIServer(WSGIServer):
    """Django's development WSGI server with Nagle's algorithm off on accepted sockets."""

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        with contextlib.suppress(OSError):  # not a TCP socket
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


class Command(RunserverCommand):
    help = "runserver with TCP_NODELAY on accepted connections (no 40 ms stalls on kept-alive connections)."
    server_cls = NoDelayWSGIServer
