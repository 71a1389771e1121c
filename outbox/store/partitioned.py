"""The delivery round trip of a partitioned deployment (``OUTBOX["PARTITIONS"]`` > 1), in
calls of one hash slot each, as a Redis Cluster requires (``docs/architecture.md``,
"Partitions").

With one partition, :meth:`MessageStore.outcomes_and_claim` writes a run's outcomes and
claims its next messages in one pipeline of three scripts that reach every key they
need. With more, a message's keys are in its partition's slot and its destination's state
in the destination's home slot, so the same work takes up to four round trips:

1. (with outcomes) ``lua/health.lua`` once per destination with outcomes (its home slot:
   health, breaker, the end of each attempt's grant);
2. ``lua/transition.lua`` once per partition with outcomes (told which destinations hold
   their messages, from step 1), then ``lua/pick.lua`` once per partition asked (read
   only: the due entries a claim would look at, with their destinations; on each node
   after the transitions, so a retry due at once is seen), and the probe times of step 1
   (``outbox:{g}:probes``);
3. ``lua/gate.lua`` once per destination met in the picks: what the claim may do with
   each message, the attempts it lets go granted (the destination's in-flight set);
4. ``lua/claim_apply.lua`` once per partition asked: the gates' answers applied to the
   messages still where the pick saw them; then, only when a granted message could not
   be claimed, its grant given back, and the probes claimed registered. A partition whose
   call fails for an outage (a slot moving, a primary away) claims nothing this time and
   gives its grants back (unless the call may have run: a timeout); the others' claims
   stand.

An outage of one slot (``TRYAGAIN`` while a legacy migration holds it half-moved, a
primary away: :data:`~outbox.store.outages.PARTITION_UNAVAILABLE`) is that slot's alone
at every step: a destination whose health call fails has its changes not sent
(``ChangeResult.unwritten == "destination"``), a partition whose transition fails has
its changes unwritten (``"partition"``), a partition whose pick or claim fails claims
nothing (``Claim.error``), a destination whose gate fails has its messages left due; the
rest is written. The caller writes the unwritten changes again later (each write is
safe to run twice: ``lua/health.lua``'s per-run mark, ``ChangeResult.earlier``).

A limit is never exceeded: a concurrency slot is held from its grant (step 2) to its
attempt's outcome (or release, or the end of its lease); a grant the claim could not
use is given back in the same exchange.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from outbox.store.destination_state import DestinationState
from outbox.store.messages import Change, ChangeResult, Claim, MessageStore, with_holding
from outbox.store.outages import PARTITION_UNAVAILABLE, may_have_run
from outbox.store.scripts import named

logger = logging.getLogger("outbox")

#: What the pick reports per entry: id, score, status, destination, suspect ("1" or "").
PICK_WIDTH = 5


class PartitionedMessageStore(MessageStore, DestinationState):
    """:class:`MessageStore` with the partitioned delivery round trip (see the module)."""

    def claim(self, queue: str, now: float, partition: int = 0, **options: Any) -> Claim:
        """See :meth:`MessageStore.claim`; with more than one partition, the steps of
        :meth:`outcomes_and_claim` without outcomes."""
        if not self.keys.partitioned:
            return super().claim(queue, now, partition, **options)
        ask = (partition, options.pop("limit"), options.pop("caps", None))
        return self.outcomes_and_claim([], now, queue, asks=[ask], limit=ask[1], **options)[1][0]

    def claim_apply_keys(self, message_id: str, destination: str) -> list[str]:
        """The keys ``lua/claim_apply.lua`` may touch for a message its pick saw, declared
        after its two (the script reads only those): the message's records and its
        partition's status and parked indexes of its destination. Declared, a slot held
        half-moved answers ``TRYAGAIN`` before the script runs, instead of the script
        aborting at the first key that moved ("non local key"), its earlier writes kept."""
        part = self.keys.of(message_id)
        return [
            self.keys.resend(message_id),
            self.keys.message(message_id),
            *(part.status(status, destination) for status in ("pending", "retrying", "sending")),
            part.parked(destination),
        ]

    def outcomes_and_claim(
        self,
        changes: Sequence[Change],
        now: float,
        queue: str,
        *,
        outcomes: Sequence[Sequence[Any]] = (),
        health_config: str = "{}",
        asks: Sequence[tuple[int, int, dict[str, int] | None]] = (),
        run: str = "",
        horizon: float = 0.0,
        **claim_options: Any,
    ) -> tuple[list[ChangeResult], list[Claim]]:
        """See :meth:`MessageStore.outcomes_and_claim`; with more than one partition, the
        four steps of the module's docstring."""
        if not self.keys.partitioned:
            return super().outcomes_and_claim(
                changes,
                now,
                queue,
                outcomes=outcomes,
                health_config=health_config,
                asks=asks,
                run=run,
                horizon=horizon,
                **claim_options,
            )
        if not asks:
            asks = [(0, claim_options["limit"], claim_options.get("caps"))]
        lease, deadline = claim_options["lease"], claim_options["deadline"]
        slack = claim_options.get("due_slack", 0.0)
        lane = "q" if claim_options.get("quarantine") else ""
        limits = json.loads(claim_options.get("limits") or "{}")

        # 1. health per destination (it says which destinations hold their messages: a
        # change without an outcome, of another destination, is written as not held)
        events, holding, unhealthy = (
            self.record_health(outcomes, health_config, now, run, horizon) if outcomes else ([], set(), {})
        )
        results: list[ChangeResult] = [ChangeResult(c.id, False, "") for c in changes]
        # A change whose destination's health could not be written (its home slot moving)
        # is not sent: health goes first (it may open the breaker, which parks instead of
        # charging a retry). The caller writes both again later.
        sent = [i for i, c in enumerate(changes) if not (c.destination and c.destination in unhealthy)]
        for i in range(len(changes)):
            if changes[i].destination in unhealthy and changes[i].destination:
                results[i].unwritten = "destination"

        # 2. transitions per partition, then (after them on each node: a retry due at once
        # is seen) the picks; the probe times
        calls = []
        groups = (
            [[sent[j] for j in g] for g in self.by_partition([changes[i].id for i in sent])] if sent else []
        )
        for positions in groups:
            chunk = [changes[i] for i in positions]
            args = with_holding(self.transition_args(chunk, now), holding)
            calls.append(("transition", args, self.transition_keys(chunk, now)))
        asked = [(p, limit) for p, limit, _ in asks if limit > 0]
        for partition, limit in asked:
            part = self.keys.partition(partition)
            pick_args = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                now=repr(now),
                slack=repr(slack),
                scan=claim_options.get("scan") or limit * 2 + 8,
                lane=lane,
            )
            calls.append(("pick", pick_args, [part.due(queue), part.quarantine(queue)]))
        replies = self.run_scripts(calls, errors=True) if calls else []
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, PARTITION_UNAVAILABLE):
                raise reply  # a bug, not an outage
        for positions, reply in zip(groups, replies[: len(groups)], strict=True):
            if isinstance(reply, Exception):  # its partition could not take it now: written later
                for i in positions:
                    results[i].unwritten = "partition"
                continue
            for i, r in zip(
                positions, self.parse_transition([changes[i] for i in positions], reply), strict=True
            ):
                results[i] = r
        picks = {
            partition: reply
            for (partition, _), reply in zip(asked, replies[len(groups) :], strict=True)
            if not isinstance(reply, Exception)
        }
        refused = {  # partition -> the outage its pick met
            p: reply
            for (p, _), reply in zip(asked, replies[len(groups) :], strict=True)
            if isinstance(reply, Exception)
        }
        asked = [(p, limit) for p, limit in asked if p in picks]

        # 3. gates per destination
        plans: dict[int, list[list[str]]] = {}  # partition -> [id, action, at] per entry
        # partition -> the keys its claim_apply may touch, declared (see claim_apply_keys)
        touched: dict[int, dict[str, None]] = defaultdict(dict)
        candidates: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        for partition, limit in asked:
            rows, _, _ = picks[partition]
            plan: list[list[str]] = []
            wanted = 0
            for i in range(0, len(rows), PICK_WIDTH):
                mid, score, status, dest, suspect = (v.decode() for v in rows[i : i + PICK_WIDTH])
                touched[partition].update(dict.fromkeys(self.claim_apply_keys(mid, dest)))
                if status not in ("pending", "retrying"):
                    plan.append([mid, "stale", ""])
                elif (suspect == "1") != (lane == "q"):
                    plan.append([mid, "lane", ""])
                elif wanted < limit:
                    wanted += 1
                    plan.append([mid, "", ""])  # the gate's answer, below
                    candidates[dest].append((partition, mid, score))
            plans[partition] = plan
        caps: dict[str, int] = {}
        for _, _, share in asks:
            for d, c in (share or {}).items():
                caps[d] = caps.get(d, 0) + c
        gate_dests = list(candidates)
        calls = []
        for d in gate_dests:
            cap = caps.get(d)
            args = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                destination=d,
                now=repr(now),
                lease=lease,
                deadline=repr(deadline),
                limits=json.dumps({d: limits[d]} if d in limits else {}),
                cap="" if cap is None else cap,
            )
            for _, mid, score in candidates[d]:
                args += [mid, score]
            calls.append(("gate", args, [self.keys.dest(d), self.keys.gcra(d), self.keys.inflight(d)]))
        answers: dict[str, tuple[str, str]] = {}
        ungated: dict[str, list[str]] = defaultdict(list)  # grants a failed gate may have given
        for d, reply in zip(gate_dests, self.run_scripts(calls, errors=True) if calls else [], strict=True):
            if isinstance(reply, Exception):
                if not isinstance(reply, PARTITION_UNAVAILABLE):
                    raise reply  # a bug, not an outage
                # Its home slot could not answer now: its messages are left where they are
                # ("stale" leaves a message still due untouched), due for a later claim.
                for _, mid, _ in candidates[d]:
                    answers[mid] = ("stale", "")
                    if may_have_run(reply):
                        ungated[d].append(mid)
                continue
            for (_, mid, _), j in zip(candidates[d], range(0, len(reply), 2), strict=True):
                answers[mid] = (reply[j].decode(), reply[j + 1].decode())
        probed = [mid for mid, (action, _) in answers.items() if action == "probe"]

        # 4. the answers applied per partition; unused grants given back, probes registered
        calls = []
        order = []
        for partition, _ in asked:
            plan = plans[partition]
            if not plan:
                continue
            flat: list[str] = []
            for mid, action, at in plan:
                if not action:
                    action, at = answers[mid]
                flat += [mid, action, at]
            part = self.keys.partition(partition)
            calls.append(
                (
                    "claim_apply",
                    [
                        *named(
                            prefix=self.keys.prefix,
                            parts=self.keys.partitions,
                            now=repr(now),
                            lease=lease,
                            deadline=repr(deadline),
                            lane=lane,
                        ),
                        *flat,
                    ],
                    [part.due(queue), part.quarantine(queue), *touched[partition]],
                )
            )
            order.append(partition)
        destination_of = {mid: d for d, rows in candidates.items() for _, mid, _ in rows}
        unused: dict[str, list[str]] = defaultdict(list, ungated)
        applied: dict[int, Any] = {}
        failures: dict[int, Exception] = {}  # partition -> the outage its claim_apply met
        for partition, reply in zip(
            order, self.run_scripts(calls, errors=True) if calls else [], strict=True
        ):
            if not isinstance(reply, Exception):
                applied[partition] = reply
                continue
            if not isinstance(reply, PARTITION_UNAVAILABLE):
                raise reply  # a bug, not an outage
            failures[partition] = reply
            # The partition claimed nothing now (its slot moving, its primary away): its
            # messages stay due for a later claim, the other partitions' claims stand, and
            # the grants its gate answers gave are given back at once (they would hold the
            # destination's concurrency slots until the lease ends). Unless its call may
            # have run (a timeout): then its claims may stand, and the grants end with them.
            if not may_have_run(reply):
                for mid, _, _ in plans[partition]:
                    if mid in destination_of:
                        unused[destination_of[mid]].append(mid)
        idle = [p for p, _, _ in asks if p not in applied and p not in picks and p not in refused]
        firsts = self._first_scores(queue, idle)
        claims: list[Claim] = []
        for partition, _, _ in asks:
            if partition in applied:
                reply = applied[partition]
                claim = self.parse_claim(reply[:5])
                for mid in reply[5]:
                    unused[destination_of[mid.decode()]].append(mid.decode())
            elif partition in picks:
                rows, next_due, next_suspect = picks[partition]
                if partition in order and rows:  # its claim failed: what it picked is still due
                    next_due = rows[1]
                claim = Claim(
                    [],
                    float(next_due) if next_due else None,
                    next_suspect=float(next_suspect) if next_suspect else None,
                    error=failures.get(partition),
                )
            elif partition in refused:
                claim = Claim([], None, error=refused[partition])
            else:
                first_due, first_suspect = firsts[partition]
                claim = Claim([], first_due, next_suspect=first_suspect)
            claims.append(claim)
        taken_probes = {mid for c in claims for m in c.messages if (mid := m.id) in probed}
        if unused or taken_probes:
            pipe = self.connection.pipeline(transaction=False)
            for d, ids in unused.items():  # this claim's own grants (lease|id: lua/gate.lua)
                pipe.zrem(self.keys.inflight(d), *(f"{lease}|{i}" for i in ids))
            for mid in taken_probes:
                pipe.zadd(self.keys.probes, {destination_of[mid]: deadline})
            try:
                pipe.execute()
            except PARTITION_UNAVAILABLE:
                # single-key writes (they follow a slot's move); a node away: the grants
                # end with the lease, a probe not registered is found by the next claim
                logger.warning("outbox: could not give back unused grants now", exc_info=True)
        if claims:
            claims[0].events = events
        return results, claims

    def _first_scores(
        self, queue: str, partitions: Sequence[int]
    ) -> dict[int, tuple[float | None, float | None]]:
        """Per partition of ``partitions``: when its first due message and its first suspect
        are due (None: none). One round trip."""
        if not partitions:
            return {}
        pipe = self.connection.pipeline(transaction=False)
        for partition in partitions:
            part = self.keys.partition(partition)
            pipe.zrange(part.due(queue), 0, 0, withscores=True)
            pipe.zrange(part.quarantine(queue), 0, 0, withscores=True)
        rows = cast(list[list[tuple[bytes, float]]], pipe.execute())
        return {
            p: (
                rows[2 * i][0][1] if rows[2 * i] else None,
                rows[2 * i + 1][0][1] if rows[2 * i + 1] else None,
            )
            for i, p in enumerate(partitions)
        }
