"""Process-wide locks made anew in a child after ``fork()``.

``fork()`` copies a lock as it is: held, when another thread of the parent was inside
it at that moment, by a thread the child does not have, so the child's first use would
wait for good (a multiprocessing pool or a pre-fork server started from a web process
with threads; RQ's forking worker). Python's own modules guard theirs the same way
(``logging``, ``random``: ``os.register_at_fork``).
"""

from __future__ import annotations

import os
import threading
from typing import Any


def renew_lock_after_fork(owner: Any, attribute: str) -> None:
    """Set ``owner.attribute`` (a module or an object holding a ``threading.Lock``) to a
    new lock in every child this process forks from now on (``os.register_at_fork``,
    Python 3.7+). Code that takes the lock must read it there at each use (``with
    _lock:`` of a module global, ``with self._lock:``), not keep a reference."""

    def renew() -> None:
        setattr(owner, attribute, threading.Lock())

    os.register_at_fork(after_in_child=renew)
