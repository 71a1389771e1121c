"""Redis safety findings (outbox.store.client.diagnostics) and their system checks, against real servers."""

from __future__ import annotations

import logging
import time

import pytest
from django.core.checks.registry import registry
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from redis import Redis

from outbox.checks import check_redis_safety, check_shared_cache_alias
from outbox.store.client import diagnostics as redis_health
from outbox.testing import RedisServer, free_port


@pytest.fixture
def server_with(request):
    """Start a private Redis with the given RedisServer options; stopped after the test."""
    started = []

    def start(**options) -> Redis:
        server = RedisServer(**options).start()
        started.append(server)
        return Redis.from_url(server.url)

    yield start
    for server in started:
        server.stop()


def ids(findings) -> list[str]:
    return sorted(f.id for f in findings)


def caches_for(url: str, alias: str = "default", **more) -> dict:
    return {alias: {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}, **more}


def test_a_safe_redis_has_no_findings(server_with):
    conn = server_with(appendonly=True, maxmemory="64mb", maxmemory_policy="noeviction")
    found = redis_health.inspect_redis(conn)
    assert found.source == "config" and found.findings == []
    assert (found.maxmemory_policy, found.maxmemory, found.appendonly) == (
        "noeviction",
        64 * 1024 * 1024,
        True,
    )


def test_rdb_snapshots_count_as_persistence(server_with):
    found = redis_health.inspect_redis(server_with(save="3600 1"))
    assert found.save == "3600 1" and found.findings == []


def test_allkeys_lru_with_a_limit_is_an_error(server_with):
    found = redis_health.inspect_redis(
        server_with(appendonly=True, maxmemory="8mb", maxmemory_policy="allkeys-lru")
    )
    assert ids(found.findings) == ["outbox.E006"]
    assert found.findings[0].level == "error" and "allkeys-lru" in found.findings[0].msg
    assert "noeviction" in found.findings[0].hint


@pytest.mark.parametrize(
    "options",
    [
        {"maxmemory": "8mb", "maxmemory_policy": "volatile-lru"},  # idempotency keys and RQ jobs go
        {"maxmemory_policy": "allkeys-random"},  # no limit yet: nothing evicted today
    ],
)
def test_other_eviction_policies_warn(server_with, options):
    found = redis_health.inspect_redis(server_with(appendonly=True, **options))
    assert ids(found.findings) == ["outbox.W006"]


def test_no_persistence_warns(server_with):
    found = redis_health.inspect_redis(server_with())
    assert ids(found.findings) == ["outbox.W004"] and "restart" in found.findings[0].msg


def test_without_config_it_falls_back_to_info(server_with):
    """Managed services disable CONFIG; INFO still shows the policy and the AOF (not the RDB schedule)."""
    conn = server_with(
        maxmemory="8mb", maxmemory_policy="allkeys-lru", extra_args=["--rename-command", "CONFIG", ""]
    )
    found = redis_health.inspect_redis(conn)
    assert found.source == "info" and found.maxmemory_policy == "allkeys-lru" and found.appendonly is False
    assert found.save is None  # unknown, so no W004 guess
    assert ids(found.findings) == ["outbox.E006"]


def test_an_unreachable_redis_is_a_quick_warning():
    started = time.monotonic()
    found = redis_health.inspect_redis(Redis(host="127.0.0.1", port=free_port()))
    assert time.monotonic() - started < 3
    assert found.source == "none" and ids(found.findings) == ["outbox.W007"]
    assert found.findings[0].level == "warning"


def test_the_default_alias_is_shared(settings, redis):
    assert settings.OUTBOX.get("REDIS_ALIAS", "default") == "default"
    assert ids(redis_health.shared_alias_findings()) == ["outbox.W005"]


def test_a_dedicated_alias_is_not_shared(settings):
    url = settings.CACHES["default"]["LOCATION"]
    base = url.rsplit("/", 1)[0]
    settings.CACHES = caches_for(f"{base}/0", "default") | caches_for(f"{base}/1", "outbox")
    settings.OUTBOX = {**settings.OUTBOX, "REDIS_ALIAS": "outbox"}
    assert redis_health.shared_alias_findings() == []
    # another alias on the same server and database shares it again
    settings.CACHES = caches_for(f"{base}", "default") | caches_for(f"{base}/0", "outbox")
    found = redis_health.shared_alias_findings()
    assert ids(found) == ["outbox.W005"] and "'default'" in found[0].msg


@pytest.mark.django_db  # Django 6.1's check runs the model checks on every database: JSONField's reads SQLite's features
def test_the_system_check_fails_an_evicting_redis(settings, server_with):
    conn = server_with(appendonly=True, maxmemory="8mb", maxmemory_policy="allkeys-lru")
    port = conn.connection_pool.connection_kwargs["port"]
    settings.CACHES = caches_for(f"redis://127.0.0.1:{port}/0")
    assert [m.id for m in check_redis_safety()] == ["outbox.E006"]
    with pytest.raises(SystemCheckError, match="outbox.E006"):
        call_command("check")


def test_the_system_check_only_warns_when_redis_is_down(settings):
    settings.CACHES = caches_for(f"redis://127.0.0.1:{free_port()}/0")
    messages = check_redis_safety()
    assert [m.id for m in messages] == ["outbox.W007"]
    call_command("check", tags=["outbox_redis"])  # warnings do not stop commands


def test_checks_are_registered_with_their_tags():
    assert check_redis_safety in registry.registered_checks and "outbox_redis" in check_redis_safety.tags
    assert [m.id for m in check_shared_cache_alias()] == ["outbox.W005"]


def test_log_startup_findings(settings, server_with, caplog):
    conn = server_with(maxmemory="8mb", maxmemory_policy="allkeys-lru")
    port = conn.connection_pool.connection_kwargs["port"]
    settings.CACHES = caches_for(f"redis://127.0.0.1:{port}/0")
    logger = logging.getLogger("outbox")
    with caplog.at_level(logging.WARNING, logger="outbox"):
        found = redis_health.log_startup_findings(logger)
    assert ids(found) == ["outbox.E006", "outbox.W004", "outbox.W005"]
    levels = {r.getMessage().split(":")[0]: r.levelno for r in caplog.records}
    assert levels == {
        "outbox.E006": logging.ERROR,
        "outbox.W004": logging.WARNING,
        "outbox.W005": logging.WARNING,
    }


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_private_server_restarts_on_its_port_with_its_aof(tmp_path, sig):
    """RedisServer.halt()/start(): same port and directory; the AOF brings the data back."""
    import signal

    server = RedisServer(appendonly=True, appendfsync="always", data_dir=tmp_path)
    try:
        conn = Redis.from_url(server.start().url)
        conn.set("kept", "1")
        server.halt(getattr(signal, sig))
        assert not server.running
        server.start()
        assert Redis.from_url(server.url).get("kept") == b"1"
        assert redis_health.inspect_redis(conn).findings == []
    finally:
        server.stop()
    assert any(tmp_path.iterdir())  # a given data_dir is kept


def test_the_worker_logs_no_finding_that_the_project_silenced(settings, redis, caplog):
    """``outbox_worker`` logs the Redis findings at start-up; one in
    ``SILENCED_SYSTEM_CHECKS`` is known to the project and stays quiet there too, as it
    does in ``manage.py check`` (the demo silenced outbox.W005 and its worker still logged it)."""
    logger = logging.getLogger("outbox.test_findings")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logged = redis_health.log_startup_findings(logger)
    assert "outbox.W005" in {f.id for f in logged}  # the tests' alias is 'default'
    caplog.clear()
    settings.SILENCED_SYSTEM_CHECKS = ["outbox.W005"]
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logged = redis_health.log_startup_findings(logger)
    assert "outbox.W005" not in {f.id for f in logged}
    assert "outbox.W005" not in caplog.text
