"""The outbox's data connection on a real 3-primary cluster (OUTBOX["CLUSTER"]): the
setting checked at the boundary, one process-wide RedisCluster, the connection helpers on
every primary, and scripts run by SHA1 on the node of their keys' slot, NOSCRIPT
recovered node by node."""

from __future__ import annotations

import hashlib

import pytest
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from outbox.conf import outbox_settings, parse_cluster
from outbox.store import base, get_repository
from outbox.store.client.connection import (
    client_like,
    empty_database,
    get_connection,
    ping,
    primary_clients,
    redis_location,
)
from outbox.store.client.outages import REDIS_UNAVAILABLE
from outbox.testing import free_port

# -- OUTBOX["CLUSTER"] checked at the boundary (no server needed) -------------------------


def test_a_full_setting_is_read():
    config = parse_cluster(
        {
            "NODES": ["rediss://app:s3cret@10.0.0.1:7000", "rediss://app:s3cret@10.0.0.2"],
            "SSL_CA_CERTS": "/etc/ca.pem",
            "SOCKET_TIMEOUT": 2,
            "MAX_CONNECTIONS": 50,
            "OPTIONS": {"require_full_coverage": False},
        }
    )
    assert config is not None
    assert config.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379))
    assert (config.username, config.password, config.ssl) == ("app", "s3cret", True)
    kwargs = config.client_kwargs()
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem" and kwargs["ssl_cert_reqs"] == "required"
    assert kwargs["socket_timeout"] == 2 and kwargs["socket_connect_timeout"] == 5.0
    assert kwargs["max_connections"] == 50 and kwargs["decode_responses"] is False
    assert kwargs["require_full_coverage"] is False
    assert parse_cluster(None) is None
    assert parse_cluster({"NODES": ["10.0.0.1:7000"]}).client_kwargs().get("ssl") is None


@pytest.mark.parametrize(
    "value,names",
    [
        ("redis://h:1", "OUTBOX['CLUSTER'] must be a dict"),
        ({}, "OUTBOX['CLUSTER']['NODES'] is required"),
        ({"NODES": "redis://h:1"}, "OUTBOX['CLUSTER']['NODES'] is required"),
        ({"NODES": []}, "OUTBOX['CLUSTER']['NODES'] is required"),
        ({"NODES": ["redis://h:1", 7000]}, "OUTBOX['CLUSTER']['NODES'][1] must be a string"),
        ({"NODES": ["http://h:1"]}, "OUTBOX['CLUSTER']['NODES'][0] = 'http://h:1': use redis://"),
        (
            {"NODES": ["redis://h:1/2"]},
            "OUTBOX['CLUSTER']['NODES'][0] = 'redis://h:1/2': a cluster has database 0",
        ),
        ({"NODES": ["redis://h:99999"]}, "OUTBOX['CLUSTER']['NODES'][0] = 'redis://h:99999' is not a node"),
        ({"NODES": ["redis://h:1", "rediss://h:2"]}, "OUTBOX['CLUSTER']['NODES'][1]"),
        ({"NODES": ["redis://h:1"], "PORT": 1}, "unknown key(s) 'PORT'"),
        ({"NODES": ["redis://h:1"], "SSL": "yes"}, "OUTBOX['CLUSTER']['SSL'] must be True or False"),
        ({"NODES": ["rediss://h:1"], "SSL": False}, "OUTBOX['CLUSTER']['SSL'] is False"),
        ({"NODES": ["redis://h:1"], "SSL_CERT_REQS": "strict"}, "OUTBOX['CLUSTER']['SSL_CERT_REQS']"),
        ({"NODES": ["redis://h:1"], "SOCKET_TIMEOUT": 0}, "OUTBOX['CLUSTER']['SOCKET_TIMEOUT']"),
        ({"NODES": ["redis://h:1"], "SOCKET_CONNECT_TIMEOUT": "5"}, "['SOCKET_CONNECT_TIMEOUT']"),
        ({"NODES": ["redis://h:1"], "MAX_CONNECTIONS": 0}, "OUTBOX['CLUSTER']['MAX_CONNECTIONS']"),
        ({"NODES": ["redis://h:1"], "PASSWORD": ""}, "OUTBOX['CLUSTER']['PASSWORD']"),
        ({"NODES": ["redis://h:1"], "OPTIONS": []}, "OUTBOX['CLUSTER']['OPTIONS'] must be a dict"),
        (
            {"NODES": ["redis://h:1"], "OPTIONS": {"decode_responses": True}},
            "['OPTIONS']['decode_responses']",
        ),
        ({"NODES": ["redis://h:1"], "OPTIONS": {"password": "x"}}, "set PASSWORD"),
    ],
)
def test_a_bad_setting_is_improperly_configured_naming_its_field(settings, value, names):
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": value}
    with pytest.raises(ImproperlyConfigured) as raised:
        get_connection()
    assert names in str(raised.value)


def test_no_error_shows_a_password(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": {"NODES": ["redis://:pw1@h:1", "redis://:pw2@h:2"]}}
    with pytest.raises(ImproperlyConfigured) as raised:
        get_connection()
    assert "pw1" not in str(raised.value) and "pw2" not in str(raised.value)
    assert "'redis://:***@h:2'" in str(raised.value)


def test_an_unknown_client_option_is_improperly_configured(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": {"NODES": ["redis://h:1"], "OPTIONS": {"colour": 1}}}
    with pytest.raises(ImproperlyConfigured, match="'colour'"):
        get_connection()


def test_a_single_server_in_nodes_is_improperly_configured(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": {"NODES": [settings.REDIS_URL]}}
    with pytest.raises(ImproperlyConfigured, match="cluster support is disabled.*REDIS_ALIAS"):
        get_connection()


def test_an_unreachable_cluster_is_redis_unavailable(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "CLUSTER": {"NODES": [f"redis://127.0.0.1:{free_port()}"], "SOCKET_CONNECT_TIMEOUT": 0.5},
    }
    with pytest.raises(REDIS_UNAVAILABLE) as raised:
        get_connection()
    assert isinstance(raised.value, RedisConnectionError)


# -- the connection on the cluster --------------------------------------------------------


def test_the_connection_is_one_process_wide_cluster_client_rebuilt_on_setting_changed(
    cluster_outbox, redis_cluster, settings
):
    connection = get_connection()
    assert isinstance(connection, RedisCluster) and connection is cluster_outbox
    assert get_connection() is connection and get_repository().connection is connection
    connection.set("k", "v")
    assert connection.get("k") == b"v"  # bytes: decode_responses=False
    assert redis_location() == f"OUTBOX['CLUSTER'] ({', '.join(u[8:] for u in redis_cluster.urls)})"
    settings.OUTBOX = {**settings.OUTBOX, "MAX_RETRIES": 4}
    assert get_connection() is connection  # OUTBOX["CLUSTER"] unchanged: the same client
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": {**settings.OUTBOX["CLUSTER"], "SOCKET_TIMEOUT": 2}}
    rebuilt = get_connection()
    assert rebuilt is not connection and rebuilt.get("k") == b"v"
    assert rebuilt.get_connection_kwargs()["socket_timeout"] == 2
    assert connection.get("k") == b"v"  # not closed: a caller still holding it keeps working


def test_the_single_server_path_is_the_alias_client(redis, settings):
    from django_redis import get_redis_connection

    assert outbox_settings.cluster is None
    assert get_connection() is get_redis_connection("default")


def test_ping_reaches_every_primary(cluster_outbox, redis_cluster):
    for node in redis_cluster.nodes:
        redis_cluster.node_client(node).config_resetstat()
    ping()
    for node in redis_cluster.nodes:
        stats = redis_cluster.node_client(node).info("commandstats")
        assert stats["cmdstat_ping"]["calls"] >= 1


def test_empty_database_flushes_every_primary(cluster_outbox, redis_cluster):
    for i in range(30):
        cluster_outbox.set(f"key{i}", i)
    assert all(redis_cluster.node_client(n).dbsize() > 0 for n in redis_cluster.nodes)
    empty_database()
    assert [redis_cluster.node_client(n).dbsize() for n in redis_cluster.nodes] == [0, 0, 0]


def test_client_like_a_cluster_client_is_a_cluster_client_with_the_overrides(cluster_outbox, redis_cluster):
    quick = client_like(cluster_outbox, max_connections=2, socket_timeout=1.5)
    try:
        assert isinstance(quick, RedisCluster) and quick is not cluster_outbox
        kwargs = quick.get_connection_kwargs()
        assert kwargs["socket_timeout"] == 1.5 and kwargs["max_connections"] == 2
        assert kwargs["decode_responses"] is False
        quick.set("q", "1")
        assert cluster_outbox.get("q") == b"1"
    finally:
        quick.close()
    assert sorted(
        c.connection_pool.connection_kwargs["port"] for c in primary_clients(cluster_outbox)
    ) == sorted(port for _, port in redis_cluster.nodes)


# -- scripts ------------------------------------------------------------------------------

#: A test script (beside the outbox's own in lua/): appends ARGV[1] to KEYS[1], returns
#: the list and the length of KEYS[2].
PROBE = "redis.call('RPUSH', KEYS[1], ARGV[1]); return {redis.call('LRANGE', KEYS[1], 0, -1), redis.call('LLEN', KEYS[2])}"


@pytest.fixture
def probe(monkeypatch):
    """The repository's scripts plus ``probe`` (:data:`PROBE`)."""
    names, sha, source = base.names, base.sha, base.source
    monkeypatch.setattr(base, "names", lambda: (*names(), "probe"))
    monkeypatch.setattr(
        base, "sha", lambda n: hashlib.sha1(PROBE.encode()).hexdigest() if n == "probe" else sha(n)
    )
    monkeypatch.setattr(base, "source", lambda n: PROBE if n == "probe" else source(n))
    return hashlib.sha1(PROBE.encode()).hexdigest()


def tagged_keys(redis_cluster):
    """Per primary, two keys of one slot (one hash tag) that it serves."""
    found = {}
    for i in range(10_000):
        owner = redis_cluster.slot_owner(key_slot(f"{{p{i}}}".encode()))
        found.setdefault(owner, (f"{{p{i}}}:list", f"{{p{i}}}:other"))
        if len(found) == len(redis_cluster.nodes):
            return [found[n] for n in redis_cluster.nodes]
    raise AssertionError("a primary serves no tag p0..p9999")


def test_run_scripts_runs_each_call_on_the_primary_of_its_keys(cluster_outbox, redis_cluster, probe):
    repo = get_repository()
    keys = tagged_keys(redis_cluster)
    calls = [("probe", [f"v{i}"], list(pair)) for i, pair in enumerate(keys)] + [
        ("probe", ["again"], list(keys[0]))
    ]
    replies = repo.run_scripts(calls)
    assert replies == [[[b"v0"], 0], [[b"v1"], 0], [[b"v2"], 0], [[b"v0", b"again"], 0]]
    for node, (key, _) in zip(redis_cluster.nodes, keys, strict=True):
        assert redis_cluster.node_client(node).llen(key) >= 1  # written on its own primary
    assert repo.run_script("probe", ["one"], keys=list(keys[1])) == [[b"v1", b"one"], 0]


def test_noscript_on_one_primary_is_recovered(cluster_outbox, redis_cluster, probe):
    repo = get_repository()
    keys = tagged_keys(redis_cluster)
    repo.run_scripts([("probe", ["a"], list(pair)) for pair in keys])
    flushed = redis_cluster.nodes[1]
    redis_cluster.node_client(flushed).script_flush()
    assert redis_cluster.node_client(flushed).script_exists(probe) == [False]
    replies = repo.run_scripts([("probe", ["b"], list(pair)) for pair in keys])
    assert [r[0] for r in replies] == [[b"a", b"b"]] * 3  # each call ran once
    assert redis_cluster.node_client(flushed).script_exists(probe) == [True]
    redis_cluster.node_client(flushed).script_flush()
    assert repo.run_script("probe", ["c"], keys=list(keys[1])) == [[b"a", b"b", b"c"], 0]


def test_a_script_without_keys_is_refused_on_a_cluster(cluster_outbox, probe):
    repo = get_repository()
    with pytest.raises(RedisClusterException, match="'probe' is called without KEYS"):
        repo.run_scripts([("probe", ["x"])])
    with pytest.raises(RedisClusterException, match="without KEYS"):
        repo.run_script("probe", ["x"])


def test_redis_py_cluster_pipelines_still_refuse_evalsha(cluster_outbox):
    """Why run_scripts sends EVALSHA with execute_command on a cluster: when this fails,
    redis-py carries PR #4206 and ``pipe.evalsha`` works on a cluster pipeline too."""
    with pytest.raises(RedisClusterException, match="evalsha is blocked"):
        cluster_outbox.pipeline(transaction=False).evalsha("0" * 40, 1, "k")


def getkeys_calls(redis_cluster) -> int:
    """``COMMAND GETKEYS`` calls the cluster's primaries have answered (INFO commandstats)."""
    total = 0
    for node in redis_cluster.nodes:
        stats = redis_cluster.node_client(node).info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def test_run_scripts_asks_no_node_for_the_keys_of_its_calls(cluster_outbox, redis_cluster, probe):
    """redis-py 8's cluster pipeline asks a node (``COMMAND GETKEYS``, a round trip) for
    the keys of each EVALSHA it routes itself; run_scripts names each call's primary."""
    repo = get_repository()
    keys = tagged_keys(redis_cluster)
    repo.run_scripts([("probe", ["warm"], list(pair)) for pair in keys])
    before = getkeys_calls(redis_cluster)
    replies = repo.run_scripts([("probe", [f"v{i}"], list(pair)) for i, pair in enumerate(keys)] * 2)
    assert [r[0][-1] for r in replies] == [b"v0", b"v1", b"v2"] * 2
    assert getkeys_calls(redis_cluster) == before


def test_run_scripts_refuses_keys_of_several_slots(cluster_outbox, redis_cluster, probe):
    (first, _), (second, _) = tagged_keys(redis_cluster)[:2]
    with pytest.raises(RedisClusterException, match="same key slot"):
        get_repository().run_scripts([("probe", ["x"], [first, second])])


def test_run_scripts_follows_a_slot_moved_behind_its_back(cluster_outbox, redis_cluster, probe):
    """The slot map of the outbox's client is stale (MOVED): the call named the old
    primary, and redis-py sends it again to the new one."""
    repo = get_repository()
    keys = tagged_keys(redis_cluster)
    repo.run_scripts([("probe", ["a"], list(pair)) for pair in keys])
    key = keys[0][0]
    slot, source, target = key_slot(key.encode()), redis_cluster.nodes[0], redis_cluster.nodes[1]
    try:
        assert redis_cluster.move_slots([slot], target) == 1
        replies = repo.run_scripts([("probe", ["b"], list(pair)) for pair in keys])
        assert [r[0] for r in replies] == [[b"a", b"b"]] * 3  # each call ran once, where its slot is
        assert redis_cluster.node_client(target).lrange(key, 0, -1) == [b"a", b"b"]
    finally:
        redis_cluster.move_slots([slot], source)
