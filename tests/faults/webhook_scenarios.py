"""The fault scenario of webhooks for customers (issue 34): one publish fanned out to many
endpoints while things break.

* ``fan-out``: applications of many endpoints each (type filters and channels, so that
  not every endpoint subscribes to every event), each endpoint a path of one of two
  receiver processes with its own secret; events published with :func:`outbox.publish`
  while workers are SIGKILLed and one receiver answers 500 to a share of its requests.
  Checks: nothing lost; each publish created exactly one delivery per subscribed
  endpoint (computed here from the plan, not asked of the outbox); every endpoint
  accepted every event it subscribed to at least once and never saw one it did not
  (every request it got verified with its own secret, keyed by ``webhook-id``, the
  event's id); a delivery accepted again only for an attempt in flight at a kill.

Registered in :data:`tests.faults.scenarios.SCENARIOS` (imported at the end of that module).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .harness import ReceiverProcess, Result, environment, in_flight_duplicates, paced, worker_notes
from .scenarios import faults_settings, killer, register, send_errors, settle, wait_workers

EVENT_TYPES = ("order.paid", "order.refunded", "user.created", "invoice.sent")
CHANNELS = ("eu", "us")
#: The channels an event is published with, chosen at random.
EVENT_CHANNELS: tuple[tuple[str, ...], ...] = ((), ("eu",), ("us",), ("eu", "us"))


@dataclass(frozen=True)
class Subscription:
    """One endpoint of the plan: where it receives, and what it subscribed to."""

    application: str
    path: str
    types: tuple[str, ...]  # none: every type
    channels: tuple[str, ...]  # none: every event, whatever its channels

    def wants(self, event_type: str, channels: tuple[str, ...]) -> bool:
        """Whether an event of ``event_type`` on ``channels`` is this endpoint's (Svix's
        rules, as docs/webhooks.md states them)."""
        return (not self.types or event_type in self.types) and (
            not self.channels or bool(set(self.channels) & set(channels))
        )


def plan(applications: int, endpoints: int, rng: random.Random) -> list[Subscription]:
    """``endpoints`` endpoints for each of ``applications`` applications: about a fifth
    subscribe to every type, the rest to one or two; about a third to one channel."""
    out = []
    for a in range(applications):
        app = f"app-{a}"
        for e in range(endpoints):
            types = () if e % 5 == 0 else tuple(sorted(rng.sample(EVENT_TYPES, 1 + e % 2)))
            channels = (CHANNELS[e % 2],) if e % 3 == 0 else ()
            out.append(Subscription(app, f"/{app}/ep-{e}", types, channels))
    return out


def register_endpoints(subs: list[Subscription], receivers: list[ReceiverProcess]) -> dict[str, str]:
    """Create the catalogue, the applications and their endpoints (each on one of
    ``receivers``, in turn), and give each receiver path its endpoint's secret. Returns
    destination name -> path."""
    from outbox import webhooks

    for name in EVENT_TYPES:
        webhooks.create_event_type(name, description=name)
    for app in dict.fromkeys(s.application for s in subs):
        webhooks.create_application(app, name=app)
    secrets: list[dict[str, str]] = [{} for _ in receivers]
    paths = {}
    for n, sub in enumerate(subs):
        receiver = receivers[n % len(receivers)]
        created = webhooks.create_endpoint(
            sub.application,
            f"http://127.0.0.1:{receiver.port}{sub.path}",
            uid=sub.path.rsplit("/", 1)[1],
            filter_types=list(sub.types),
            channels=list(sub.channels),
        )
        secrets[n % len(receivers)][sub.path] = created.secret
        paths[created.endpoint.destination] = sub.path
    for receiver, mine in zip(receivers, secrets, strict=True):
        receiver.set_secrets(mine)
    return paths


def fan_out(
    name: str,
    *,
    events: int = 300,
    rate: float = 10,
    applications: int = 3,
    endpoints: int = 50,
    workers: int = 3,
    kill_for: float = 25,
    kill_every: tuple[float, float] = (2, 5),
    restart_after: float = 1,
    fail_rate: float = 0.3,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 240,
    seed: int = 1,
) -> Result:
    """Events fanned out to applications of many endpoints while workers are SIGKILLed
    and one of two receivers fails a share of its requests.

    ``applications`` applications of ``endpoints`` endpoints each (type filters and
    channels: see :func:`plan`), their endpoints spread over two receiver processes, each
    path verifying with its endpoint's own secret; ``events`` events of 4 types published
    at ``rate``/s, each to one application at random with random channels; ``workers``
    workers, one SIGKILLed (process group) every ``kill_every`` s for ``kill_for`` s; the
    second receiver answers 500 to ``fail_rate`` of its requests until the kills end.
    Expected: nothing lost; one delivery per subscribed endpoint per event, no other;
    every endpoint accepted each of its events at least once and got no request for
    another event or signed with another secret; a delivery accepted again only for an
    attempt in flight at a kill.
    """
    import outbox

    result = Result(name)
    rng = random.Random(seed)
    subs = plan(applications, endpoints, rng)
    with environment(
        name, settings=faults_settings(visibility_timeout, recovery_interval), database=True
    ) as run:
        assert run.receiver is not None
        receivers = [run.receiver, run.add_receiver()]
        failing = receivers[1]
        failing.set_mode(fail_rate=fail_rate)
        paths = register_endpoints(subs, receivers)
        supervisor = run.workers(workers, restart_delay=restart_after)
        wait_workers(run, workers)
        stop = threading.Event()
        acked: list[str] = []
        expected: dict[str, tuple[str, str]] = {}  # delivery id -> (path, event id)
        wrong_fan_out: list[str] = []
        errors: Counter = Counter()
        thread = killer(run, supervisor, rng, kill_for, kill_every, stop)
        first_send = time.monotonic()
        thread.start()
        try:
            for i in paced(events, rate):
                app = f"app-{rng.randrange(applications)}"
                event_type = rng.choice(EVENT_TYPES)
                channels = rng.choice(EVENT_CHANNELS)
                try:
                    event = outbox.publish(
                        event_type, {"n": i, "type": event_type}, application=app, channels=list(channels)
                    )
                except Exception as exc:
                    send_errors(errors, exc, "publish()")
                    continue
                want = {s.path for s in subs if s.application == app and s.wants(event_type, channels)}
                got = [paths.get(d.destination, "?") for d in event.deliveries]
                if sorted(got) != sorted(want):
                    wrong_fan_out.append(
                        f"event {i} ({app}, {event_type}, {channels}): {len(got)} of {len(want)}"
                    )
                for delivery, path in zip(event.deliveries, got, strict=True):
                    acked.append(delivery.message.id)
                    expected[delivery.message.id] = (path, event.id)
            thread.join(kill_for + 30)
        finally:
            stop.set()
        failing.set_mode(fail_rate=0.0)
        run.fault_ended()
        settle(run, result, acked, first_send, settle_timeout)
        check_fan_out(result, run.receivers(), expected, wrong_fan_out, events)
        offset = time.time() - time.monotonic()
        kill_times = [e.at + offset for e in supervisor.exits if e.killed_by_us]
        duplicated, beyond = in_flight_duplicates(run, acked, kill_times, visibility_timeout)
        result.check(
            "a delivery accepted again only when an attempt was in flight at a kill",
            not beyond,
            f"{duplicated} accepted more than once, {len(beyond)} of them not explained by a kill"
            + (f": {beyond[:3]}" if beyond else ""),
        )
        if errors:
            result.notes.append(f"publish() exceptions: {dict(errors)}")
        result.notes.append(
            f"{applications} applications × {endpoints} endpoints, {events} events, "
            f"{len(acked)} deliveries ({len(acked) / max(1, events):.1f} per event)"
        )
        worker_notes(result, supervisor)
    return result


def check_fan_out(
    result: Result,
    receivers: list[ReceiverProcess],
    expected: dict[str, tuple[str, str]],
    wrong_fan_out: list[str],
    events: int,
) -> None:
    """The scenario's checks of who received what (see :func:`fan_out`)."""
    states = [r.state() for r in receivers]
    accepted: Counter[str] = Counter()
    routes: Counter[str] = Counter()
    for state in states:
        accepted.update(state["accepted"])
        routes.update(state["routes"])
    result.check(
        "each publish created one delivery per subscribed endpoint, no other",
        not wrong_fan_out and len({e for _, e in expected.values()}) <= events,
        f"{len(wrong_fan_out)} events fanned out wrong" + (f": {wrong_fan_out[:3]}" if wrong_fan_out else ""),
    )
    bad = sum(int(s.get("bad_signature", 0)) for s in states)
    result.check(
        "every request verified with its endpoint's own secret",
        bad == 0,
        f"{bad} bad signatures" + (f": {states[0].get('bad_examples', [])[:2]}" if bad else ""),
    )
    misdirected = []
    for route in routes:
        path, webhook_id, delivery_id = route.split(" ")
        if expected.get(delivery_id) != (path, webhook_id):
            misdirected.append(route)
    result.check(
        "no endpoint got a request for an event it did not subscribe to (path, webhook-id, delivery)",
        not misdirected,
        f"{len(misdirected)} requests misdirected" + (f": {misdirected[:3]}" if misdirected else ""),
    )
    missing = [d for d in expected if not accepted[d]]
    pairs = {(p, e) for p, e in expected.values()}
    result.check(
        "every endpoint accepted every event it subscribed to at least once",
        not missing,
        f"{len(pairs) - len({expected[d] for d in missing})} of {len(pairs)} (endpoint, event) pairs accepted"
        + (f"; missing e.g. {[expected[d] for d in missing[:3]]}" if missing else ""),
    )
    failed = sum(int(s.get("failed", 0)) for s in states)
    requests = sum(int(s.get("requests", 0)) for s in states)
    incomplete = sum(int(s.get("incomplete", 0)) for s in states)
    result.notes.append(
        f"receivers: {requests} requests, {failed} answered 500 (the failing one), "
        f"{incomplete} cut short by a killed worker"
    )


SHORT: dict[str, Any] = {
    "events": 30,
    "rate": 30,
    "applications": 2,
    "endpoints": 10,
    "workers": 2,
    "kill_for": 2,
    "kill_every": (0.6, 0.9),
    "visibility_timeout": 3,
    "recovery_interval": 1,
    "settle_timeout": 25,
}

register("fan-out", fan_out, short=SHORT, full={})
