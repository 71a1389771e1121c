"""Run a private Redis-compatible server for the demo until told to stop.

``python -m demo_site.redis_server [--url-file PATH]`` starts a server on a free
127.0.0.1 port with :class:`outbox.testing.RedisServer` (``redis-server`` or
``valkey-server`` on PATH, else the Valkey binary of the ``server`` extra), prints its
URL on stdout (and writes it to ``--url-file``), then waits. SIGTERM, SIGINT or SIGHUP
stop the server (its data is thrown away) and exit with status 0.

Exit status 1 when no server could be started (the reason is on stderr).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from outbox.testing import RedisServer


def main(argv: list[str] | None = None) -> int:
    """Start the server, announce its URL, wait for a stop signal. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m demo_site.redis_server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url-file", type=Path, help="also write the URL to this file (removed on exit)")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # scripts/demo starts it with SIGINT ignored
            signal.signal(signum, on_signal)
    try:
        # Ctrl-C in scripts/demo's terminal must not stop Redis before the worker has
        # written its outcomes: the server gets a process group of its own.
        server = RedisServer(own_session=True).start()
    except RuntimeError as exc:
        print(f"redis_server: {exc}", file=sys.stderr)
        return 1
    try:
        if args.url_file:
            args.url_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.url_file.with_suffix(".tmp")
            tmp.write_text(server.url + "\n")
            tmp.replace(args.url_file)
        print(server.url, flush=True)
        while not stop.wait(1.0):
            if server.process is not None and server.process.poll() is not None:
                print(
                    f"redis_server: {server.binary} exited with code {server.process.returncode}",
                    file=sys.stderr,
                )
                return 1
        return 0
    finally:
        server.stop()
        if args.url_file:
            args.url_file.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
