"""The restructuring moved modules, not names: every old path the docs gave still works for
one release and warns, and the paths stored in queued RQ jobs never moved."""

from __future__ import annotations

import importlib

import pytest
from django.utils.module_loading import import_string

import outbox

#: old module, a name read through it, the module that now has it
MOVED = [
    ("outbox.connection", "get_repository", "outbox.store"),
    ("outbox.health", "get_health", "outbox.destinations.health"),
    ("outbox.health", "pause", "outbox.destinations.controls"),
    ("outbox.health", "DestinationEvent", "outbox.events"),
    ("outbox.dispatch", "enqueue_wakeups", "outbox.store.background.wakeups"),
    ("outbox.dispatch", "wake_due", "outbox.delivery.recovery"),
    ("outbox.worker", "run_worker", "outbox.delivery.worker"),
    ("outbox.worker", "housekeeping_seen", "outbox.delivery.worker"),
    ("outbox.liveness", "workers", "outbox.delivery.liveness"),
    ("outbox.batches", "recorder_for", "outbox.operations.batches"),
    ("outbox.actions", "requeue", "outbox.operations.actions"),
    ("outbox.deadlines", "call_with_deadline", "outbox.transports.deadlines"),
    ("outbox.redis_health", "inspect_redis", "outbox.store.client.diagnostics"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED)
def test_an_old_path_still_works_and_warns(old, name, new):
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


#: The public names of outbox/health.py before it was split (git show 4db0e98:outbox/health.py)
OLD_HEALTH = [
    "DestinationEvent",
    "DestinationHealth",
    "DestinationState",
    "ErrorGroup",
    "MinuteStats",
    "Window",
    "destination_state",
    "disable",
    "enable",
    "error_groups",
    "get_all_health",
    "get_health",
    "health_config_json",
    "known_destinations",
    "limits_json",
    "notify",
    "parse_events",
    "pause",
    "percentile",
    "release_parked_due",
    "resume",
    "status_line",
    "timeline",
    "unpark_all",
    "BOUNDS",
    "BUCKETS",
    "ERROR_HOURS",
    "EVENTS",
    "FAILING_CONSECUTIVE",
    "FAILING_MIN_ATTEMPTS",
    "FAILING_RATE",
    "HELD_STATES",
    "OUTCOME_KINDS",
    "STATES",
    "TROUBLE_STATES",
    "UNPARK_BATCH",
    "WINDOW_SECONDS",
]


@pytest.mark.parametrize("name", OLD_HEALTH)
def test_every_name_of_the_split_health_module_is_still_read_through_it(name):
    with pytest.warns(DeprecationWarning):
        assert getattr(importlib.import_module("outbox.health"), name) is not None


def test_an_old_path_refuses_a_name_it_never_had():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        importlib.import_module("outbox.health").nothing_here  # noqa: B018


@pytest.mark.parametrize(
    "path",
    [
        "outbox.jobs.deliver",  # every queued wake-up job
        "outbox.admin_views.tasks.run_operation",  # the console's background operations
        "outbox.delivery.run",
        "outbox.destinations.get_destination",
        "outbox.operations.recover_since",
        "outbox.alerts.notify",
        "outbox.alerts.flush_due",
        "outbox.records.pack_retry",
        "outbox.testing.deliver_all",
        "outbox.metrics.views.metrics",
        "outbox.transports.webhook.WebhookTransport",
        "outbox.transports.locmem.outbox",
    ],
)
def test_public_and_stored_paths_did_not_move(path, recwarn):
    assert import_string(path) is not None
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_every_name_of_the_front_door_is_there():
    for name in outbox.__all__:
        assert getattr(outbox, name) is not None, name
