"""What the tests share besides fixtures (those are in the conftest.py files, built on this).

- :mod:`tests.support.http`: the one loopback HTTP receiver (:class:`Receiver`,
  :func:`receiving`; the ``receiver`` fixture) and :func:`serving` for any socketserver.
- :mod:`tests.support.processes`: the one process supervisor (:class:`Supervisor`; the
  ``processes`` fixture) for real ``outbox_worker`` processes.
- :mod:`tests.support.messages`: settings overrides (destinations, a Redis that is
  down), burst workers in this process, the index invariant, waiting for a condition.
- :mod:`tests.support.cluster`: a real 3-primary cluster (the ``redis_cluster`` and
  ``cluster_outbox`` fixtures).
- :mod:`tests.support.console` and :mod:`tests.support.browser`: the console's tests'.

The names of the first three are importable from here.
"""

from tests.support.http import ENDLESS, Received, Receiver, receiving, serving
from tests.support.messages import (
    assert_due_order,
    assert_index_invariant,
    hook_settings,
    redis_at,
    redis_down,
    run_worker,
    settle,
    settle_due,
    wait_for,
    with_destinations,
)
from tests.support.processes import ROOT, Supervisor

__all__ = [
    "assert_due_order",
    "ENDLESS",
    "ROOT",
    "Received",
    "Receiver",
    "Supervisor",
    "assert_index_invariant",
    "hook_settings",
    "receiving",
    "redis_at",
    "redis_down",
    "run_worker",
    "serving",
    "settle",
    "settle_due",
    "wait_for",
    "with_destinations",
]
