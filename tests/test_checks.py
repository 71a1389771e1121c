"""System checks report bad settings at startup with stable ids."""

import pytest

from outbox.checks import check_outbox_settings


def ids(settings_obj=None):
    return sorted({e.id for e in check_outbox_settings()})


def test_the_test_settings_are_clean():
    assert check_outbox_settings() == []


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"BOGUS": 1}, "outbox.E001"),
        ({"BATCH_SIZE": 0}, "outbox.E001"),
        ({"VISIBILITY_TIMEOUT": "5"}, "outbox.E001"),
        ({"QUEUES": {"default": "outbox"}}, "outbox.E001"),
        ({"DESTINATIONS": {"x": {"OPTIONS": {}}}}, "outbox.E002"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "nope.Nope"}}}, "outbox.E002"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "webhook", "OPTIONS": {"url": "ftp://x"}}}}, "outbox.E002"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "locmem", "MAX_RETRIES": -1}}}, "outbox.E002"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "locmem", "RETRY": {"base": -1}}}}, "outbox.E002"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "locmem", "WHAT": 1}}}, "outbox.E002"),
        ({"RETRY": {"jitter": "x"}}, "outbox.E005"),
        ({"MAX_RETRIES": -2}, "outbox.E005"),
        ({"DESTINATIONS": {}}, "outbox.W002"),
    ],
)
def test_bad_outbox_settings(settings, change, expected):
    settings.OUTBOX = {**settings.OUTBOX, **change}
    assert expected in ids()


def test_missing_rq_queue(settings):
    settings.RQ_QUEUES = {"outbox": {"USE_REDIS_CACHE": "default"}}
    errors = check_outbox_settings()
    assert {e.id for e in errors} == {"outbox.E003"}
    assert any("outbox_high" in e.msg for e in errors) and "USE_REDIS_CACHE" in errors[0].hint


def test_queue_on_another_connection_warns(settings):
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "outbox": {"URL": "redis://127.0.0.1:1/0"}}
    assert ids() == ["outbox.W001"]


def test_redis_alias_must_be_django_redis(settings):
    settings.OUTBOX = {**settings.OUTBOX, "REDIS_ALIAS": "missing"}
    assert "outbox.E004" in ids()


def test_manage_py_check_runs_them(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.OUTBOX = {**settings.OUTBOX, "BOGUS": 1}
    with pytest.raises(SystemCheckError, match="outbox.E001"):
        call_command("check")


@pytest.mark.parametrize("retention", [{"pending": 5}, {"succeeded": 0}, {"succeeded": "7d"}, [1]])
def test_bad_retention(settings, retention):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": retention}
    assert "outbox.E001" in ids()


def test_webhook_whose_attempt_may_outlive_half_the_lease_warns(settings):
    hook = {
        "TRANSPORT": "webhook",
        "OPTIONS": {"url": "http://127.0.0.1:9/", "timeout": 10, "connect_timeout": 5},
    }
    # 5 + 2 x 10 = 25 s per attempt at most; the last attempt may start at half the lease.
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {"slow": hook}, "VISIBILITY_TIMEOUT": 40}
    errors = check_outbox_settings()
    assert [e.id for e in errors] == ["outbox.W003"]
    assert "'slow'" in errors[0].msg and "25 s" in errors[0].msg
    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 50}
    assert check_outbox_settings() == []
