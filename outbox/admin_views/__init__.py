"""The outbox console inside the Django admin: small modules with one job each.

* :mod:`.base`: context and permission helpers shared by the pages
* :mod:`.dashboard`: counts, queues, workers, the outcomes chart
* :mod:`.listing`: the filtered, sorted, paginated message list
* :mod:`.detail`: one message, its attempts, its body download
* :mod:`.confirm`: bulk actions: confirmation, execution, background progress
* :mod:`.filters`, :mod:`.operations`, :mod:`.tasks`, :mod:`.history`,
  :mod:`.rq_stats`, :mod:`.chart`, :mod:`.formatting`: what the pages are made of

The read-only Redis queries are in :mod:`outbox.store.reads.queries`.
"""
