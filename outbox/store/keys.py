"""Redis key names. Nothing outside :mod:`outbox.store` builds an outbox key.

Layout, for prefix ``outbox`` (see ``docs/architecture.md``):

==================================  ===========  ============================================
key                                 type         holds
==================================  ===========  ============================================
``outbox:message:<id>``             string       the message record: a JSON header line, then
                                                 the body (older versions: a hash)
``outbox:resend:<id>``              hash         the resend record (delivery state)
``outbox:attempts:<id>``            list         attempt records, newest first, capped
``outbox:status:<status>:dest:<d>`` sorted set   ids of destination ``d`` in that status
                                                 (score: see below)
``outbox:created:dest:<d>``         sorted set   every id of destination ``d``, by created_at
``outbox:destinations``             set          destination names ever used: the indexes
                                                 across destinations are the union of theirs
``outbox:due:<queue>``              sorted set   pending and retrying ids of a queue, by due
                                                 time: what workers claim from
``outbox:quarantine:<queue>``       sorted set   suspects of a queue (pending/retrying ids
                                                 taken back from lost workers), by due time:
                                                 each is claimed alone
``outbox:wake:<queue>``             string       set while a wake-up job for the queue waits
``outbox:idempotency:<n>:<d>:<key>`` string      ``<id>|<fingerprint>`` sent under that key to
                                                 destination ``d`` (``n`` = len(d)); expires
``outbox:payload:<event id>``       hash         a published event's payload, once per
                                                 partition: body, content_type, refs (its
                                                 deliveries there still stored)
``outbox:endpoints:version``        string       counter of committed endpoint changes
``outbox:endpoints:changed``        sorted set   endpoint destination -> counter at its last
                                                 change (the newest 10,000 kept)
``outbox:lock:<name>``              string       short-lived locks (recovery sweep)
``outbox:housekeeping``             string       host:pid of an outbox_worker whose housekeeping
                                                 ran lately (expires: 2 recovery intervals + 5 s)
``outbox:workers``                  sorted set   host:pid of each outbox_worker -> when its
                                                 heartbeat expires (epoch s; written with the
                                                 one above; dropped an hour after expiring)
``outbox:stats:<outcome>:<minute>`` string       outcome counters per minute (expire)
``outbox:dest:<d>``                 hash         destination health: admin and breaker
                                                 state, counters, totals, latency histogram
``outbox:health:<d>:<minute>``      hash         attempts per minute by outcome (s, r, p)
                                                 and latency buckets (b0..b16); expire 2 h
``outbox:errors:<d>:<hour>``        hash         failures per (status code, error class)
                                                 in an hour: count, last time, last error;
                                                 expire 25 h
``outbox:parked:<d>``               sorted set   pending/retrying ids of a destination held
                                                 while it is paused, disabled or its breaker
                                                 open (not in a due index), by due time
``outbox:probes``                   sorted set   destination -> when the wake check must look
                                                 at its parked messages (probe or unpark)
``outbox:gcra:<d>``                 string       GCRA theoretical arrival time (rate limit)
``outbox:alert:sent:<e>:<d>``       string       set (NX, expiring) while alerts of event
                                                 ``e`` about ``d`` are suppressed
``outbox:alert:count:<e>:<d>``      hash         occurrences of ``e`` about ``d`` no alert
                                                 reported yet: n, since, last; expire 7 days
``outbox:alert:flush``              sorted set   ``<e>|<d>`` -> when its suppression ends and
                                                 the counted occurrences must be reported
``outbox:batch:<token>``            sorted set   ids one bulk action acted on, scored by
                                                 order (expires; see ``outbox.operations.batches``)
``outbox:task:<job id>``            string       a background action the console started:
                                                 JSON (operation, state, progress, report);
                                                 expires 7 days after its last write (see
                                                 ``outbox.store.background.tasks``)
==================================  ===========  ============================================

There is no index across destinations (older versions: ``outbox:status:<status>`` and
``outbox:created``): a list or count over every destination reads the destinations'
indexes together (:class:`~outbox.store.indexes.Index`), so a status change moves a
message in two sorted sets, not four, and a finished message has two index entries.

Status index scores: ``pending`` and ``retrying`` by next_attempt_at (so due messages
are a range query), ``sending`` by lease deadline (claim time + visibility timeout),
the others by the time they entered the status.

Every key a Lua script (``lua/``) can know before it runs is built here and passed to
it in ``KEYS``. Keys a script finds only at run time (ids it reads from an index, the
destination or queue a resend record names) are built by one Lua helper,
``lua/lib/keys.lua``, from the prefix the script is given: ``tests/store/test_lua_keys.py``
runs it in Redis and checks each name against the method of the same name here. Those
run-time keys are what still keeps the multi-key scripts off Redis Cluster.
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from outbox.records import partition_of

#: The most partitions a deployment can have: one hash slot each at most (Redis Cluster
#: has 16,384 slots; https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/).
MAX_PARTITIONS = 16384


def partition_for(destination: str, key: str, partitions: int) -> int:
    """The partition of a message of ``destination`` with ``key`` (its ordering key, else
    its idempotency key): CRC-32 of the pair, length-prefixed so that no two pairs meet,
    modulo ``partitions``. 0 when ``partitions`` is 1.

    A message without such a key may go to any partition (:func:`random_partition`):
    its id names the partition it went to."""
    if partitions <= 1:
        return 0
    return zlib.crc32(f"{len(destination)}:{destination}:{key}".encode()) % partitions


def random_partition(partitions: int) -> int:
    """A partition for messages without a key: uniform over ``0 .. partitions - 1``."""
    return random.randrange(partitions) if partitions > 1 else 0


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix, for a deployment of ``partitions`` partitions.

    With one partition (the default) every name is as it always was (``outbox:...``).
    With more, every key carries a hash tag so that the keys one script touches share one
    hash slot of a Redis Cluster (https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags):

    * a message's records and the indexes it is claimed, counted or listed from carry its
      partition's tag, ``outbox:{p<k>}:...`` (``k`` from the message id,
      :func:`~outbox.records.partition_of`). The index methods (:meth:`status`,
      :meth:`created`, :meth:`due`, :meth:`quarantine`, :meth:`parked`, :meth:`stats`)
      need a partition: call them on :meth:`partition` (``keys.partition(k).due(q)``);
      on ``Keys`` itself they raise ``ValueError`` when there is more than one;
    * a destination's state (:meth:`dest`, :meth:`gcra`, :meth:`health`,
      :meth:`errors`) carries its home tag, ``outbox:{d:<destination>}:...``: one home
      slot per destination, so its limits stay exact;
    * the keys across the deployment (destinations, probes, workers, locks, wake-up
      flags, alerts, batches, tasks) carry the tag ``{g}``.
    """

    prefix: str
    partitions: int = 1
    #: The partition this view names (:meth:`partition`); None: none chosen.
    part: int | None = None

    # -- hash tags ---------------------------------------------------------------------

    @property
    def partitioned(self) -> bool:
        """True when the deployment has more than one partition (keys carry hash tags)."""
        return self.partitions > 1

    def partition(self, number: int) -> Keys:
        """These names, with the index methods naming partition ``number``'s indexes.

        Raises:
            ValueError: ``number`` is not in ``0 .. partitions - 1``.
        """
        if not 0 <= number < self.partitions:
            raise ValueError(f"partition {number} is not one of 0..{self.partitions - 1}")
        return _view(self.prefix, self.partitions, number)

    def partition_numbers(self) -> range:
        """Every partition's number: ``range(partitions)``."""
        return range(self.partitions)

    def every(self, name: str, *args: object) -> list[str]:
        """Index ``name`` (a method of a partition's indexes: ``"status"``, ``"due"``...)
        with ``args`` in every partition, partition 0 first: one key with one partition.
        A read across partitions reads them all (a union, a sum)."""
        return [getattr(self.partition(k), name)(*args) for k in self.partition_numbers()]

    def of(self, message_id: str) -> Keys:
        """The view of the partition message ``message_id`` lives in (:meth:`partition`)."""
        return self.partition(partition_of(message_id) if self.partitioned else 0)

    def tag_prefix(self, number: int) -> str:
        """The prefix of partition ``number``'s keys: ``outbox:{p<k>}`` (``outbox`` with one
        partition). Lua scripts build the same from a message id (``lib/keys.lua``, K.part)."""
        return f"{self.prefix}:{{p{number}}}" if self.partitioned else self.prefix

    @property
    def _part_prefix(self) -> str:
        if not self.partitioned:
            return self.prefix
        if self.part is None:
            raise ValueError("an index key of a partitioned deployment needs a partition: keys.partition(k)")
        return self.tag_prefix(self.part)

    def _message_prefix(self, message_id: str) -> str:
        if not self.partitioned:
            return self.prefix
        return self.tag_prefix(partition_of(message_id))

    def home(self, destination: str) -> str:
        """The prefix of ``destination``'s state keys: ``outbox:{d:<destination>}``
        (``outbox`` with one partition)."""
        return f"{self.prefix}:{{d:{destination}}}" if self.partitioned else self.prefix

    @property
    def shared(self) -> str:
        """The prefix of the keys across the deployment: ``outbox:{g}`` (``outbox`` with
        one partition)."""
        return f"{self.prefix}:{{g}}" if self.partitioned else self.prefix

    # -- a message's records (partition from its id) -------------------------------------

    def message(self, message_id: str) -> str:
        return f"{self._message_prefix(message_id)}:message:{message_id}"

    def resend(self, message_id: str) -> str:
        return f"{self._message_prefix(message_id)}:resend:{message_id}"

    def attempts(self, message_id: str) -> str:
        return f"{self._message_prefix(message_id)}:attempts:{message_id}"

    # -- a partition's indexes -----------------------------------------------------------

    def status(self, status: str, destination: str) -> str:
        return f"{self._part_prefix}:status:{status}:dest:{destination}"

    def created(self, destination: str) -> str:
        return f"{self._part_prefix}:created:dest:{destination}"

    def due(self, queue: str) -> str:
        return f"{self._part_prefix}:due:{queue}"

    def quarantine(self, queue: str) -> str:
        """A queue's suspects (taken back from lost workers), by due time: each is claimed
        alone (``lua/claim.lua``)."""
        return f"{self._part_prefix}:quarantine:{queue}"

    def parked(self, destination: str) -> str:
        return f"{self._part_prefix}:parked:{destination}"

    def stats(self, outcome: str, minute: int) -> str:
        return f"{self._part_prefix}:stats:{outcome}:{minute}"

    @staticmethod
    def idempotency_scope(destination: str, key: str) -> str:
        """An idempotency key scoped to its destination, unambiguously (length-prefixed)."""
        return f"{len(destination)}:{destination}:{key}"

    def idempotency(self, destination: str, key: str) -> str:
        """The idempotency record of ``key`` for ``destination``, in the partition of the
        message sent under it (:func:`partition_for` of the pair, for a message without
        an ordering key): ``keys.partition(k).idempotency(d, key)``."""
        return f"{self._part_prefix}:idempotency:{self.idempotency_scope(destination, key)}"

    def order(self, destination: str, key: str) -> str:
        """The queue of an ordering key: its unsettled messages (a sorted set: id -> its
        sequence number); the head is the lowest (``lua/lib/ordering.lua``)."""
        return f"{self._part_prefix}:order:{self.idempotency_scope(destination, key)}"

    def order_state(self, destination: str, key: str) -> str:
        """An ordering key's state (a hash): ``seq`` (the last sequence number given),
        ``last`` (the sequence of the last message delivered), ``blocked`` (the id of the
        dead letter at its head while it blocks the key). It expires
        ``ORDERING_KEY_TTL`` seconds after the key's queue empties."""
        return f"{self._part_prefix}:orderstate:{self.idempotency_scope(destination, key)}"

    def order_log(self, destination: str, key: str) -> str:
        """Every message of an ordering key, settled or not, until it is deleted (a sorted
        set: id -> created_at): the console's list of one key."""
        return f"{self._part_prefix}:orderlog:{self.idempotency_scope(destination, key)}"

    def payload(self, event_id: str) -> str:
        """A published event's payload record in this partition (a hash: ``body``,
        ``content_type``, ``refs``: the event's deliveries of this partition that still
        exist), written by the ``lua/create.lua`` call that writes them and deleted with
        the last of them (``lua/delete.lua``): ``keys.of(delivery id).payload(event id)``."""
        return f"{self._part_prefix}:payload:{event_id}"

    def blocked(self, destination: str) -> str:
        """The ordering keys of ``destination`` blocked by a dead letter at their head (a
        sorted set: key -> when it was blocked), in this partition."""
        return f"{self._part_prefix}:blocked:{destination}"

    def idempotency_home(self, destination: str, key: str) -> str:
        """:meth:`idempotency` in the partition the pair maps to (:func:`partition_for`)."""
        return self.partition(partition_for(destination, key, self.partitions)).idempotency(destination, key)

    def legacy_indexes(self, statuses: Iterable[str]) -> list[str]:
        """The indexes across destinations that older versions kept (``outbox:created``
        and ``outbox:status:<status>``): read by the 0.1 upgrade, deleted by the schema 3 one."""
        return [f"{self.prefix}:created", *(self.legacy_status(s) for s in statuses)]

    def legacy_status(self, status: str) -> str:
        """The index across destinations of one status that older versions kept
        (``outbox:status:<status>``): read by ``lua/backfill.lua``."""
        return f"{self.prefix}:status:{status}"

    # -- a destination's state (its home slot) -------------------------------------------

    def dest(self, destination: str) -> str:
        return f"{self.home(destination)}:dest:{destination}"

    def health(self, destination: str, minute: int) -> str:
        return f"{self.home(destination)}:health:{destination}:{minute}"

    def errors(self, destination: str, hour: int) -> str:
        return f"{self.home(destination)}:errors:{destination}:{hour}"

    def gcra(self, destination: str) -> str:
        return f"{self.home(destination)}:gcra:{destination}"

    def counted(self, destination: str, run: str) -> str:
        """The highest outcome sequence number of one worker run (``run``: its token)
        that ``destination``'s health has counted (a string; it expires): an exchange
        repeated after a lost reply or a failed later step counts each attempt once
        (``lua/health.lua``)."""
        return f"{self.home(destination)}:counted:{destination}:{run}"

    def counted_run(self, run: str) -> str:
        """On one partition, the highest outcome sequence number of one worker run that
        health has counted, for every destination at once (``lua/health.lua``: one call
        counts all of an exchange's destinations; :meth:`counted` with more partitions)."""
        return f"{self.shared}:counted:{run}"

    def inflight(self, destination: str) -> str:
        """With more than one partition, ``destination``'s attempts in flight (a sorted set:
        "<lease>|<message id>" -> lease deadline) that its gate granted (``lua/gate.lua``): its
        ``MAX_CONCURRENCY`` counts them, as the sending index (one per partition) cannot
        be counted from the home slot."""
        return f"{self.home(destination)}:inflight:{destination}"

    @staticmethod
    def inflight_member(lease: str, message_id: str) -> str:
        """A member of :meth:`inflight`: ``<lease>|<message id>``, so that another claim's
        grant of the same message, given back, cannot end this one (``K.inflight_member``
        of ``lua/lib/keys.lua`` builds the same in ``lua/gate.lua`` and ``lua/health.lua``)."""
        return f"{lease}|{message_id}"

    # -- across the deployment -----------------------------------------------------------

    @property
    def schema(self) -> str:
        """The schema version of the records (a string: an int), for the upgrade of records
        written by older versions (:meth:`~outbox.store.maintenance.Maintenance.upgrade`).
        Untagged: one key, read and written alone."""
        return f"{self.prefix}:schema"

    def sync(self, number: int | None = None) -> str:
        """The name a durability wait writes to, to wait for earlier writes
        (:func:`~outbox.store.client.durability.wait_for_earlier_writes`): with
        ``number``, a key of that partition's slot (``SET``); without, a Pub/Sub channel
        nothing subscribes to (``PUBLISH``)."""
        return f"{self.prefix if number is None else self.tag_prefix(number)}:durability"

    @property
    def destinations(self) -> str:
        return f"{self.shared}:destinations"

    @property
    def summary(self) -> str:
        """``outbox:{g}:summary``: the destination summary's totals and when it was made
        (a hash; :mod:`outbox.store.reads.summary`)."""
        return f"{self.shared}:summary"

    @property
    def summary_rows(self) -> str:
        """``outbox:{g}:summary:rows``: destination -> its summary row (a hash of JSON)."""
        return f"{self.shared}:summary:rows"

    @property
    def summary_order(self) -> str:
        """``outbox:{g}:summary:order``: destination -> its rank group, failing first (a
        sorted set: a page of the console's destination table is one ZRANGE)."""
        return f"{self.shared}:summary:order"

    @staticmethod
    def staged(key: str) -> str:
        """The copy of ``key`` written before it replaces ``key`` at once (same slot)."""
        return f"{key}:new"

    @property
    def summary_lock(self) -> str:
        """``outbox:{g}:summary:lock``: held by the process refreshing the summary."""
        return f"{self.shared}:summary:lock"

    @property
    def endpoints_version(self) -> str:
        """``outbox:{g}:endpoints:version``: a counter incremented after each committed
        change of endpoints (:mod:`outbox.store.endpoint_versions`)."""
        return f"{self.shared}:endpoints:version"

    @property
    def endpoints_changed(self) -> str:
        """``outbox:{g}:endpoints:changed``: destination name -> the counter's value at
        its last change (a sorted set, its newest entries kept)."""
        return f"{self.shared}:endpoints:changed"

    @property
    def partitions_record(self) -> str:
        """``outbox:{g}:partitions``: the partition count a partitioned deployment was set
        up with (written once, ``SET NX``, with its first message), whatever this view's
        count; a deployment of one partition has the untagged ``outbox:destinations``
        instead. The check ``outbox.E011`` compares them with the setting."""
        return f"{self.prefix}:{{g}}:partitions"

    @property
    def unpartitioned_destinations(self) -> str:
        """``outbox:destinations``: the destination set of a deployment of one partition
        (the sign, for ``outbox.E011``, that one wrote messages here)."""
        return f"{self.prefix}:destinations"

    def wake(self, queue: str) -> str:
        return f"{self.shared}:wake:{queue}"

    def heartbeat(self) -> str:
        """The housekeeping heartbeat: set, with a TTL, by each ``outbox_worker``."""
        return f"{self.shared}:housekeeping"

    @property
    def workers(self) -> str:
        """Each ``outbox_worker``'s own heartbeat: ``host:pid`` -> when it expires."""
        return f"{self.shared}:workers"

    def lock(self, name: str) -> str:
        return f"{self.shared}:lock:{name}"

    def batch(self, token: str) -> str:
        return f"{self.shared}:batch:{token}"

    def task(self, job_id: str) -> str:
        """The registry entry of a background action the console started (RQ job id)."""
        return f"{self.shared}:task:{job_id}"

    @property
    def probes(self) -> str:
        return f"{self.shared}:probes"

    def alert_sent(self, event: str, destination: str) -> str:
        return f"{self.shared}:alert:sent:{event}:{destination}"

    def alert_count(self, event: str, destination: str) -> str:
        return f"{self.shared}:alert:count:{event}:{destination}"

    @property
    def alert_flush(self) -> str:
        return f"{self.shared}:alert:flush"


@functools.lru_cache(maxsize=4096)
def _view(prefix: str, partitions: int, number: int) -> Keys:
    """``Keys(prefix, partitions, number)``, made once (a frozen dataclass: every send()
    asks for its partition's view, :meth:`Keys.of`)."""
    return Keys(prefix, partitions, number)
