"""Read models: what the console, the metrics and the testing helpers read, on the
repository. Read-only.

- :mod:`~outbox.store.reads.queries`: the console's message list: filters, sorts, pages,
  search.
- :mod:`~outbox.store.reads.merged_pages`: a page across partitions, merged from a page
  of each (a cursor per partition).
- :mod:`~outbox.store.reads.gauges`: levels for monitoring (counts per destination and
  status, due depth, blocked ordering keys).
- :mod:`~outbox.store.reads.destination_reads`: destination health as Redis has it, for
  :mod:`outbox.destinations.health`.
- :mod:`~outbox.store.reads.inspection`: which messages were sent, which wait (for
  :mod:`outbox.testing`).
"""
