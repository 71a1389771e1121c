"""The restructuring moved modules, not names: the public names and the paths stored in
queued RQ jobs never moved; the old module paths kept for 0.2 are gone in 0.3."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from django.utils.module_loading import import_string

import outbox

#: The shims 0.2 kept at the old module paths, gone in 0.3 (docs/upgrading.md)
REMOVED = [
    "actions",
    "batches",
    "connection",
    "deadlines",
    "dispatch",
    "health",
    "liveness",
    "redis_health",
    "worker",
]


@pytest.mark.parametrize("name", REMOVED)
def test_the_old_module_paths_are_gone(name):
    assert importlib.util.find_spec(f"outbox.{name}") is None


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
