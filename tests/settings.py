"""Django settings for the test suite.

Redis: ``OUTBOX_TEST_REDIS_URL`` if set (worker subprocesses inherit it from the test
process), else a private server started here on a free port and stopped at exit.
Never the shared 127.0.0.1:6379.
"""

import atexit
import json
import os

# Under pytest-xdist (scripts/test runs the suite with -n) each test process has its own
# servers: a process whose OUTBOX_TEST_SERVERS_FOR is not its own xdist worker id inherited
# the URLs of the process that started it (the xdist controller) and starts its own. A
# worker subprocess started by a test inherits both, and so shares its test's servers.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_INHERITED = os.environ.get("OUTBOX_TEST_SERVERS_FOR", _XDIST_WORKER) != _XDIST_WORKER
if _INHERITED:
    os.environ.pop("OUTBOX_TEST_REDIS_URL", None)
    os.environ.pop("OUTBOX_TEST_CLUSTER_NODES", None)

if not os.environ.get("OUTBOX_TEST_REDIS_URL"):
    from outbox.testing import RedisServer

    _server = RedisServer().start()
    atexit.register(_server.stop)
    os.environ["OUTBOX_TEST_REDIS_URL"] = _server.url
    os.environ["OUTBOX_TEST_SERVERS_FOR"] = _XDIST_WORKER

REDIS_URL = os.environ["OUTBOX_TEST_REDIS_URL"]

# OUTBOX_TEST_CLUSTER=1 runs the suite with the outbox's data on a private 3-primary
# cluster (OUTBOX["CLUSTER"], 16 partitions) and RQ on the private plain Redis beside it,
# as a cluster deployment runs (scripts/test-cluster). Worker subprocesses inherit the
# cluster's node URLs through OUTBOX_TEST_CLUSTER_NODES.
CLUSTER_NODES: list[str] = []
if os.environ.get("OUTBOX_TEST_CLUSTER"):
    if not os.environ.get("OUTBOX_TEST_CLUSTER_NODES"):
        from outbox.testing import ClusterServer

        _cluster = ClusterServer(primaries=3).start()
        atexit.register(_cluster.stop)
        os.environ["OUTBOX_TEST_CLUSTER_NODES"] = ",".join(_cluster.urls)
        os.environ["OUTBOX_TEST_SERVERS_FOR"] = _XDIST_WORKER
    CLUSTER_NODES = os.environ["OUTBOX_TEST_CLUSTER_NODES"].split(",")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "outbox",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}


def _postgres_answers() -> str:
    """ "" when the PostgreSQL of OUTBOX_TEST_POSTGRES (default 127.0.0.1:5432, database
    test, trust auth) answers, else why not (tests needing it skip with that reason)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        psycopg.connect(POSTGRES_DSN, connect_timeout=2).close()
    except Exception as exc:
        return f"no PostgreSQL answers at {POSTGRES_DSN}: {exc}"
    return ""


POSTGRES_DSN = os.environ.get("OUTBOX_TEST_POSTGRES", "host=127.0.0.1 port=5432 dbname=test user=postgres")
POSTGRES_MISSING = _postgres_answers()
if not POSTGRES_MISSING:
    _pg = dict(part.split("=", 1) for part in POSTGRES_DSN.split())
    DATABASES["postgres"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.get("dbname", "test"),
        "USER": _pg.get("user", "postgres"),
        "HOST": _pg.get("host", "127.0.0.1"),
        "PORT": _pg.get("port", "5432"),
        "TEST": {"NAME": f"outbox_test_{os.getpid()}"},
    }

#: OUTBOX_TEST_DATABASE=postgres: the ``default`` alias on that PostgreSQL too, so a run
#: (``OUTBOX_TEST_DATABASE=postgres scripts/test tests/webhooks``) is on PostgreSQL
#: instead of SQLite; when none answers every test skips with POSTGRES_MISSING
#: (tests/conftest.py). Unset or "sqlite": SQLite in memory.
TEST_DATABASE = os.environ.get("OUTBOX_TEST_DATABASE", "sqlite")
if TEST_DATABASE not in ("sqlite", "postgres"):
    raise ValueError(f"OUTBOX_TEST_DATABASE={TEST_DATABASE!r}: 'sqlite' or 'postgres'")
if TEST_DATABASE == "postgres" and not POSTGRES_MISSING:
    DATABASES["default"] = {
        **DATABASES["postgres"],
        "TEST": {"NAME": f"outbox_test_default_{os.getpid()}"},
    }
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            # Worker subprocesses of tests/delivery/test_worker_process.py bound reads as a project's
            # settings would (the README's block says SOCKET_TIMEOUT: 5).
            **(
                {"SOCKET_TIMEOUT": float(os.environ["OUTBOX_TEST_SOCKET_TIMEOUT"])}
                if os.environ.get("OUTBOX_TEST_SOCKET_TIMEOUT")
                else {}
            ),
        },
    }
}
RQ_QUEUES = {
    "outbox_high": {"USE_REDIS_CACHE": "default"},
    "outbox": {"USE_REDIS_CACHE": "default"},
    "outbox_low": {"USE_REDIS_CACHE": "default"},
}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
STATIC_URL = "/static/"
OUTBOX = {
    "DESTINATIONS": {
        "hook": {
            "TRANSPORT": "webhook",
            "OPTIONS": {
                "url": os.environ.get("OUTBOX_TEST_HOOK_URL", "http://127.0.0.1:9/hook"),
                "timeout": 5,
                # The test receivers listen on 127.0.0.1, which the SSRF guard refuses by default.
                "allow_private_networks": True,
            },
            "RETRY": [0],
            "MAX_RETRIES": 3,
            # Worker subprocesses of tests/destinations/test_rate_limits.py get limits this way.
            **json.loads(os.environ.get("OUTBOX_TEST_HOOK_EXTRA", "{}")),
        },
        "mem": {"TRANSPORT": "locmem", "RETRY": [0], "MAX_RETRIES": 2},
        "poison": {
            "TRANSPORT": "callable",
            "OPTIONS": {"path": "tests.poison.record", "deadline": 5},
            "RETRY": [0],
            "MAX_RETRIES": 2,
        },
    },
    "VISIBILITY_TIMEOUT": int(os.environ.get("OUTBOX_TEST_VISIBILITY_TIMEOUT", "30")),
    "LATE_AFTER": 1,
    # OUTBOX_TEST_PARTITIONS=16 runs the suite with partitioned keys (scripts/test-partitions).
    "PARTITIONS": int(os.environ.get("OUTBOX_TEST_PARTITIONS", "16" if CLUSTER_NODES else "1")),
    # Most tests script failures and count retries: the circuit breaker would park their
    # messages. tests/destinations/test_health.py turns it on per destination.
    "BREAKER": False,
    # Endpoints registered at runtime (tests/webhooks): a fixed test key; receivers on loopback.
    "ENDPOINTS": {
        "SECRET_KEYS": ["yJ1yRKDHGPTdSR1Dd1k8k2oV2u7yQ2Zb6Xz8E0p3Zx8="],
        "ALLOW_PRIVATE_NETWORKS": True,
        "RETRY": [0],
        "MAX_RETRIES": 3,
        "CACHE_TTL": 5,
        "VERSION_CHECK": 0.1,
    },
}
if CLUSTER_NODES:
    OUTBOX["CLUSTER"] = {"NODES": CLUSTER_NODES}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "INFO"}},
}
if os.environ.get(
    "OUTBOX_TEST_STALL_FILE"
):  # tests/delivery/test_worker_process.py: a signal lost in logging
    LOGGING["formatters"] = {"stalling": {"()": "tests.support.stalling_log.StallingFormatter"}}
    LOGGING["handlers"]["stalling"] = {"class": "logging.StreamHandler", "formatter": "stalling"}
    LOGGING["loggers"]["rq.worker"] = {"handlers": ["stalling"], "level": "DEBUG"}
# Silenced here: none (tests call the checks themselves); settings that build on these
# add their own (tests/settings_quarantine.py).
SILENCED_SYSTEM_CHECKS: list[str] = []
