"""One process supervisor for the tests: real ``outbox_worker`` processes (``python -m
django outbox_worker``, run from the repository root with the test settings), stopped at
the end whatever happened, and restarted when they exit if asked (as systemd or
Kubernetes would). The ``processes`` fixture is one for a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import IO

#: The repository's root: the worker processes' working directory and PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]


class Supervisor:
    """Starts processes, optionally restarts them when they exit, and stops them all.

    Output: each process's stdout and stderr together, on a pipe (``process.stdout``,
    :meth:`output_of`), or in a file ``<folder>/worker-<n>.log`` when ``folder`` is given
    (:meth:`output`). With ``restart``, a process that exits is started again (same
    arguments) 0.2 s later; its exit codes are in ``exits``.
    """

    def __init__(self, folder: Path | None = None, *, restart: bool = False) -> None:
        self.folder = folder
        self.restart = restart
        self.exits: list[int] = []
        self.processes: list[subprocess.Popen] = []
        self._commands: dict[int, tuple[list[str], dict[str, str], object]] = {}
        self._started = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- starting ---------------------------------------------------------------------

    def worker(
        self,
        *args: str,
        settings_module: str = "tests.settings",
        hook_url: str | None = None,
        visibility_timeout: float | None = None,
        redis_url: str | None = None,
        env: dict[str, str] | None = None,
        preexec_fn=None,
    ) -> subprocess.Popen:
        """A real ``outbox_worker ARGS`` process. It inherits this process's environment,
        OUTBOX_TEST_REDIS_URL included (the suite's Redis) unless ``redis_url``;
        ``hook_url`` and ``visibility_timeout`` set what tests/settings.py reads from
        OUTBOX_TEST_HOOK_URL and OUTBOX_TEST_VISIBILITY_TIMEOUT; ``env`` adds more."""
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings_module,
            "PYTHONPATH": str(ROOT),
            **({"OUTBOX_TEST_HOOK_URL": hook_url} if hook_url else {}),
            **({"OUTBOX_TEST_VISIBILITY_TIMEOUT": str(visibility_timeout)} if visibility_timeout else {}),
            **({"OUTBOX_TEST_REDIS_URL": redis_url} if redis_url else {}),
            **(env or {}),
        }
        return self.start([sys.executable, "-m", "django", "outbox_worker", *args], environment, preexec_fn)

    def start(self, argv: list[str], env: dict[str, str], preexec_fn=None) -> subprocess.Popen:
        """Start ``argv`` in the repository's root with ``env``; supervised from now on."""
        with self._lock:
            self._started += 1
            output: int | IO[bytes] = subprocess.PIPE
            if self.folder is not None:
                output = open(self.folder / f"worker-{self._started}.log", "wb")  # noqa: SIM115 (the process keeps it)
            process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, preexec_fn=preexec_fn
            )
            if self.folder is not None:
                output.close()  # the child has its own copy
            self.processes.append(process)
            self._commands[process.pid] = (argv, env, preexec_fn)
            if self.restart and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True)
                self._watcher.start()
        return process

    def _watch(self) -> None:
        while not self._stopping.is_set():
            for process in list(self.processes):
                if process.poll() is not None and not self._stopping.is_set():
                    self.exits.append(process.returncode)
                    time.sleep(0.2)
                    argv, env, preexec_fn = self._commands.pop(process.pid)
                    self.processes.remove(process)
                    self.start(argv, env, preexec_fn)
            time.sleep(0.05)

    # -- reading ----------------------------------------------------------------------

    def ready(self, count: int) -> bool:
        """Whether ``count`` worker logs (in ``folder``) say their RQ loop is listening."""
        logs = [p.read_text(errors="replace") for p in self.folder.glob("worker-*.log")]
        return sum("Listening on" in text for text in logs) >= count

    def output(self) -> str:
        """The end of each log in ``folder``."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.folder.glob("worker-*.log"))
        )

    @staticmethod
    def output_of(process: subprocess.Popen) -> str:
        """All of a piped process's output: it is killed first if still running."""
        if process.poll() is None:
            process.kill()
        out, _ = process.communicate(timeout=10)
        return out.decode(errors="replace")

    # -- stopping ---------------------------------------------------------------------

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        """Stop restarting; send ``sig`` to every process still running, wait up to
        ``timeout`` seconds for each, then kill what is left."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(5)
        for process in self.processes:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    process.send_signal(sig)
        for process in self.processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
