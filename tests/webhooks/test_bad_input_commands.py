"""Issue 34, item 10, through the commands and a real worker: ``manage.py check
--database default`` fails on a secret no key decrypts (outbox.E013) without showing
it; a worker meeting that endpoint's delivery logs the error and the delivery waits
(parked, no retry charged), not a dead letter."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import SystemCheckError

import outbox
from outbox import webhooks
from outbox.destinations.config import endpoint_cache
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_wrong_key_fails_manage_py_check_and_the_worker_logs_it_and_waits(settings, caplog):
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    created = webhooks.create_endpoint("acme", "https://93.184.215.14/hook")
    call_command("check", "--database", "default")  # fine with the right key
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "SECRET_KEYS": [Fernet.generate_key().decode()]},
    }
    with pytest.raises(SystemCheckError, match="outbox.E013") as info:
        call_command("check", "--database", "default")
    assert created.secret not in str(info.value)
    call_command("check")  # without --database the check reads no database

    delivery = outbox.publish("order.paid", {"a": 1}, application="acme").deliveries[0]
    endpoint_cache.clear()
    run_worker(simple=True)
    assert "cannot be used" in caplog.text and created.secret not in caplog.text
    message = outbox.get(delivery.id)
    assert message.status in ("pending", "retrying") and message.retry_count == 0
