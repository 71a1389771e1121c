"""The ``poison`` destination's function: runs in the worker, records deliveries, crashes on poison.

Each call appends one line ``<message id> <pid> <poison?>`` to ``FAULTS_CALLABLE_LOG``
(one ``os.write`` of an ``O_APPEND`` file: whole lines, even from several processes) and
then, for a message whose JSON body has ``"poison": true``, ends its process at once with
``os._exit(1)``: no exception, no ``finally``, no outcome written. A delivery of a
non-poison message is complete when its line is written; the harness counts lines per
id to find messages delivered more than once.
"""

from __future__ import annotations

import json
import os

from outbox.records import Message


def deliver(message: Message) -> None:
    """Record the delivery of ``message``; kill this process if it is marked poison."""
    try:
        poison = bool(json.loads(message.body).get("poison"))
    except (ValueError, AttributeError):
        poison = False
    path = os.environ.get("FAULTS_CALLABLE_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{message.id} {os.getpid()} {'poison' if poison else 'ok'}\n".encode())
        finally:
            os.close(fd)
    if poison:
        os._exit(1)


def read_log(path: str) -> list[tuple[str, bool]]:
    """The (message id, poison?) pairs recorded in ``path``, in order; [] when it does not exist."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [(parts[0], parts[2] == "poison") for parts in (line.split() for line in lines) if len(parts) == 3]
