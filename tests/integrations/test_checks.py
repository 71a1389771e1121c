"""System checks report bad settings at startup with stable ids."""

import pytest

from outbox.checks import check_outbox_settings


def reported():
    """What the settings checks report."""
    return check_outbox_settings()


def ids(settings_obj=None):
    return sorted({e.id for e in reported()})


def test_the_test_settings_are_clean():
    assert reported() == []


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"BOGUS": 1}, "outbox.E001"),
        ({"BATCH_SIZE": 0}, "outbox.E001"),
        ({"VISIBILITY_TIMEOUT": "5"}, "outbox.E001"),
        ({"QUEUES": {"default": "outbox"}}, "outbox.E001"),
        ({"ORDERING": "reorder"}, "outbox.E001"),
        ({"ORDERING_KEY_TTL": 0}, "outbox.E001"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "locmem", "ORDERING": "fifo"}}}, "outbox.E002"),
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
    # without ENDPOINTS: a project of endpoints only is not warned of empty DESTINATIONS
    settings.OUTBOX = {**{k: v for k, v in settings.OUTBOX.items() if k != "ENDPOINTS"}, **change}
    assert expected in ids()


@pytest.mark.parametrize(
    "config",
    [
        {"TRANSPORT": "nope.Nope"},
        {"OPTIONS": {}},
        {"TRANSPORT": "webhook", "OPTIONS": {"url": "ftp://x"}},
        {"TRANSPORT": "locmem", "RATE_LIMIT": "x"},
        {"TRANSPORT": "callable", "OPTIONS": {}},
    ],
)
def test_each_destination_error_names_its_destination(settings, config):
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {"billing": config}}
    (error,) = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert "'billing'" in error.msg


def test_missing_rq_queue(settings):
    settings.RQ_QUEUES = {"outbox": {"USE_REDIS_CACHE": "default"}}
    errors = reported()
    assert {e.id for e in errors} == {"outbox.E003"}
    assert any("outbox_high" in e.msg for e in errors) and "USE_REDIS_CACHE" in errors[0].hint


def test_queue_on_another_connection_warns(settings):
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "outbox": {"URL": "redis://127.0.0.1:1/0"}}
    assert ids() == ["outbox.W001"]


def test_redis_alias_must_be_django_redis(settings):
    settings.OUTBOX = {**settings.OUTBOX, "REDIS_ALIAS": "missing"}
    assert "outbox.E004" in ids()


@pytest.mark.django_db  # Django 6.1's check runs the model checks on every database: JSONField's reads SQLite's features
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
    errors = reported()
    assert [e.id for e in errors] == ["outbox.W003"]
    assert "'slow'" in errors[0].msg and "25 s" in errors[0].msg
    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 50}
    assert reported() == []


# -- outbox.W010: a webhook the SSRF guard would refuse at every attempt (issue 20, item 8) --
def address_warnings(settings, url: str, **options):
    from outbox.checks import check_webhook_addresses

    hook = {"TRANSPORT": "webhook", "OPTIONS": {"url": url, **options}}
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {**settings.OUTBOX["DESTINATIONS"], "crm": hook}}
    return check_webhook_addresses()


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000/hooks", "http://localhost:8000/hooks", "https://[::1]/h", "http://10.1.2.3/h"],
)
def test_a_webhook_on_a_private_or_loopback_address_warns(settings, url):
    (warning,) = address_warnings(settings, url)
    assert warning.id == "outbox.W010"
    assert "'crm'" in warning.msg and "blocked_address" in warning.msg
    assert "allow_private_networks" in warning.hint and "BLOCK_PRIVATE_NETWORKS" in warning.hint


def test_a_private_webhook_that_opts_in_or_a_public_one_does_not_warn(settings):
    assert address_warnings(settings, "http://127.0.0.1:8000/h", allow_private_networks=True) == []
    assert address_warnings(settings, "https://93.184.215.14/h") == []  # a public literal: no lookup
    settings.OUTBOX = {**settings.OUTBOX, "BLOCK_PRIVATE_NETWORKS": False}
    assert address_warnings(settings, "http://localhost:8000/h") == []


@pytest.mark.django_db  # Django 6.1's check runs the model checks on every database: JSONField's reads SQLite's features
def test_manage_py_check_shows_the_private_address_warning(settings, capsys):
    from django.core.management import call_command

    address_warnings(settings, "http://localhost:8000/hooks")
    call_command("check")
    out, err = capsys.readouterr()
    assert "outbox.W010" in out + err


def test_a_renamed_setting_is_still_read_and_the_check_says_to_rename_it(settings):
    # RECOVERY_GRACE (the dashboard's "late" threshold) is LATE_AFTER since 0.2
    from outbox.conf import outbox_settings

    settings.OUTBOX = {**settings.OUTBOX, "RECOVERY_GRACE": 42}
    settings.OUTBOX.pop("LATE_AFTER", None)
    assert outbox_settings.LATE_AFTER == 42 and outbox_settings.RECOVERY_GRACE == 42
    found = [m for m in check_outbox_settings() if m.id == "outbox.W011"]
    assert len(found) == 1 and "LATE_AFTER" in found[0].msg
    assert not [m for m in check_outbox_settings() if m.id == "outbox.E001"]  # not an unknown key
    settings.OUTBOX = {**settings.OUTBOX, "LATE_AFTER": 7}
    assert outbox_settings.LATE_AFTER == 7  # the new name wins
    assert "is ignored" in [m for m in check_outbox_settings() if m.id == "outbox.W011"][0].msg
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "RECOVERY_GRACE"}
    assert not [m for m in check_outbox_settings() if m.id == "outbox.W011"]


@pytest.mark.parametrize("value", [0, -1, 16385, "16", 2.0, True])
def test_partitions_must_be_an_int_from_1_to_16384(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": value}
    errors = [e for e in check_outbox_settings() if e.id == "outbox.E001"]
    assert any("PARTITIONS" in e.msg for e in errors), errors


def test_a_cluster_with_one_partition_is_refused(settings):
    """One partition has no hash tags: a cluster would refuse every script (CROSSSLOT)."""
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 1, "CLUSTER": {"NODES": ["redis://127.0.0.1:7000"]}}
    errors = [e for e in check_outbox_settings() if e.id == "outbox.E010"]
    assert len(errors) == 1 and "PARTITIONS'] is 1" in errors[0].msg and "CROSSSLOT" in errors[0].msg
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 64}
    assert not [e for e in check_outbox_settings() if e.id == "outbox.E010"]


def test_partitions_without_a_cluster_pass(settings):
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 16}
    assert not [e for e in check_outbox_settings() if e.id in ("outbox.E010", "outbox.E001")]


def test_one_partition_and_no_cluster_pass(settings):
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 1}
    assert not [e for e in check_outbox_settings() if e.id in ("outbox.E010", "outbox.E001")]


def test_every_finding_is_reported_at_once(settings):
    """Issue 30, item 9: an unknown key hid an OPTIONS typo of the same destination, and
    any destination's error (E002) hid the other destinations' W003 and W010."""
    from outbox.checks import check_webhook_addresses

    settings.OUTBOX = {
        **settings.OUTBOX,
        "VISIBILITY_TIMEOUT": 40,
        "DESTINATIONS": {
            "typos": {
                "TRANSPORT": "webhook",
                "RETRIES": 3,
                "OPTIONS": {"url": "https://example.com/", "timout": 5},
            },
            "slow": {"TRANSPORT": "webhook", "OPTIONS": {"url": "https://93.184.215.14/", "timeout": 30}},
            "private": {"TRANSPORT": "webhook", "OPTIONS": {"url": "http://10.1.2.3/h"}},
        },
    }
    findings = [(e.id, e.msg) for e in reported()]
    typos = [msg for id_, msg in findings if id_ == "outbox.E002" and "'typos'" in msg]
    assert any("RETRIES" in msg for msg in typos), findings  # the unknown key
    assert any("timout" in msg for msg in typos), findings  # and the option it did not hide
    assert any(id_ == "outbox.W003" and "'slow'" in msg for id_, msg in findings), findings
    assert [w.id for w in check_webhook_addresses() if "'private'" in w.msg] == ["outbox.W010"]
