"""RQ plumbing and the console's records: the background side's state in Redis.

- :mod:`~outbox.store.background.wakeups`: wake-up jobs, the only code that enqueues
  delivery jobs (``outbox.jobs.deliver``).
- :mod:`~outbox.store.background.rq_stats`: counts of RQ's wake-up jobs, read without
  changing anything.
- :mod:`~outbox.store.background.rq_workers`: which workers are registered (RQ's, and the
  outbox's housekeeping heartbeat).
- :mod:`~outbox.store.background.tasks`: the registry of the console's background
  operations.
- :mod:`~outbox.store.background.batches`: the record of a bulk operation's messages.

Not ``store/rq/``: a package named like the ``rq`` library it uses reads as that library
in tracebacks and imports.
"""
