"""The delivery side: workers claim due messages and attempt them.

- :mod:`~outbox.delivery.loop`: one wake-up job's claim loop (:func:`run`).
- :mod:`~outbox.delivery.attempts`: one attempt through its transport, timed.
- :mod:`~outbox.delivery.outcomes`: an attempt's outcome decided (retry, backoff, dead
  letter, parked), written and announced.
- :mod:`~outbox.delivery.recovery`: the recovery sweep and retention purge.
- :mod:`~outbox.delivery.worker`: the ``outbox_worker`` process and its housekeeping.
- :mod:`~outbox.delivery.liveness`: which workers are alive, by their heartbeat.

:func:`run` is re-exported here: ``outbox.delivery.run`` is the name the docs give it.
"""

from outbox.delivery.loop import RunReport, run

__all__ = ["RunReport", "run"]
