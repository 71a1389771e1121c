"""docs/webhooks.md's "Set-up" block, as a project new to the outbox writes it
(``"DESTINATIONS": {}``, endpoints only): ``manage.py check`` has nothing to warn about
that the project did on purpose (found by scripts/webhooks_check.py)."""

from __future__ import annotations

from cryptography.fernet import Fernet

from outbox.checks import check_outbox_settings


def test_a_project_of_endpoints_only_is_not_told_it_has_nowhere_to_deliver(settings):
    key = Fernet.generate_key().decode()
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {}, "ENDPOINTS": {"SECRET_KEYS": [key]}}
    assert "outbox.W002" not in {e.id for e in check_outbox_settings()}


def test_no_destinations_and_no_endpoints_still_warns(settings):
    settings.OUTBOX = {**{k: v for k, v in settings.OUTBOX.items() if k != "ENDPOINTS"}, "DESTINATIONS": {}}
    (warning,) = [e for e in check_outbox_settings() if e.id == "outbox.W002"]
    assert "ENDPOINTS" in warning.msg
