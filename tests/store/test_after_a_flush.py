"""Redis emptied under a running process (a restart without persistence, a failover to an
empty replica): messages sent after it are delivered, although the process registered
their destination's name in the destinations set less than REGISTER_AGAIN seconds before."""

from __future__ import annotations

import outbox
from tests.support import hook_settings


def test_messages_sent_right_after_redis_lost_its_data_are_delivered(receiver, worker, repo):
    with hook_settings(receiver.url):
        outbox.send("hook", {"n": 0})  # the name registered by this process
        repo.connection.flushdb()  # Redis loses everything, the process does not know
        sent = [outbox.send("hook", {"n": n}) for n in range(1, 4)]
        worker(simple=True)
    assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3
    # and counted: the lists, counts and retention read the destinations set, which the
    # flush emptied (with partitions the name comes back within REGISTER_AGAIN seconds)
    if not repo.keys.partitioned:
        assert repo.count("succeeded") == 3 and repo.destinations() == ["hook"]
