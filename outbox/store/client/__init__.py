"""The Redis client and topology: how the store reaches Redis, and what Redis is.

- :mod:`~outbox.store.client.connection`: the outbox's client (the django-redis alias's,
  or the process-wide ``RedisCluster``), helpers that work on both, where Redis is.
- :mod:`~outbox.store.client.thread_client`: one held connection per thread, the client
  ``send()`` writes through.
- :mod:`~outbox.store.client.routing`: which primary of a cluster serves a key.
- :mod:`~outbox.store.client.outages`: which Redis errors mean an outage, not a bug.
- :mod:`~outbox.store.client.durability`: ``WAIT``/``WAITAOF`` after a write of new
  messages (``OUTBOX["DURABILITY"]``).
- :mod:`~outbox.store.client.cluster_admin`: commands that administer one cluster node
  (used by the test cluster).
- :mod:`~outbox.store.client.diagnostics`: is this Redis safe to keep messages in
  (eviction, persistence, shared alias, partitions)?

Below the repository: nothing here imports it.
"""
