"""The Dramatiq peer: a real ``RedisBroker`` on ``BENCH_REDIS_URL`` and two actors.

Imported by the measuring process (to send) and by the Dramatiq worker process
(``python -m benchmarks.compare dramatiq-worker``, Dramatiq's ``Worker`` API).
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.peers import done

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop_actor(body):
    done()


@dramatiq.actor(queue_name="bench", max_retries=0)
def latency_actor(body):
    done(body["t"])
