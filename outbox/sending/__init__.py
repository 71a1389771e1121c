"""The sending side: how a message gets into Redis.

- :mod:`~outbox.sending.validation`: ``send()`` arguments checked and turned into a
  :class:`outbox.records.Message`, before anything is written.
- :mod:`~outbox.sending.intake`: the one write step (outside a transaction, on commit,
  and the relay of captured messages all use it).
- :mod:`~outbox.sending.capture`: transactional capture in the caller's database and
  the relay that pushes captured rows into Redis.
"""
