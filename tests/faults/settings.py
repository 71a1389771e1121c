"""Django settings of the fault suite, shared by its driver and its worker subprocesses.

Everything that differs between scenarios comes from the environment, which the harness
sets before starting Django and which worker subprocesses inherit:

=============================  =================================================================
``FAULTS_REDIS_URL``           the scenario's private Redis (required)
``FAULTS_RECEIVER_URL``        the receiver's webhook URL (default: a closed port)
``FAULTS_SECRET``              the Standard Webhooks secret (``whsec_`` + base64 of 32 bytes)
``FAULTS_DB``                  SQLite file (default ``.faults/db.sqlite3``)
``FAULTS_PG_DSN``              use PostgreSQL instead (``postgresql://user@host:port/db``), with
``FAULTS_PG_SCHEMA``           this schema as search_path (the harness creates and drops it)
``FAULTS_VISIBILITY_TIMEOUT``  ``OUTBOX["VISIBILITY_TIMEOUT"]`` seconds (10)
``FAULTS_RECOVERY_INTERVAL``   ``OUTBOX["RECOVERY_INTERVAL"]`` seconds (2)
``FAULTS_LATE_AFTER``      ``OUTBOX["LATE_AFTER"]`` seconds (2)
``FAULTS_HOOK_TIMEOUT``        the webhook transport's ``timeout`` seconds (2)
``FAULTS_HOOK_RETRIES``        ``MAX_RETRIES`` of ``hook`` (10)
``FAULTS_POISON_RETRIES``      ``MAX_RETRIES`` of ``poison`` (2)
``FAULTS_CALLABLE_LOG``        file the ``poison`` destination's function appends delivered ids to
``FAULTS_BATCH_SIZE``          ``OUTBOX["BATCH_SIZE"]`` (100)
``FAULTS_BREAKER_COOLDOWN``    ``OUTBOX["BREAKER"]["COOLDOWN"]`` seconds (0.5)
``FAULTS_BREAKER_MAX_COOLDOWN`` ``OUTBOX["BREAKER"]["MAX_COOLDOWN"]`` seconds (2)
``FAULTS_BREAKER``             JSON of the ``hook`` destination's own ``BREAKER`` (default: none,
                               the global one applies)
``FAULTS_CLUSTER_NODES``       comma-separated ``redis://host:port`` of a cluster's nodes: the
                               outbox's data on it (``OUTBOX["CLUSTER"]``), in
                               ``FAULTS_PARTITIONS`` partitions (16), RQ's queues on
                               ``FAULTS_REDIS_URL`` beside it (as ``tests/support/cluster.py``)
``FAULTS_DURABILITY``          JSON of ``OUTBOX["DURABILITY"]`` (default: none, no wait)
``FAULTS_ORDERING``            the ``hook`` destination's ``ORDERING`` policy, ``block`` or
                               ``skip`` (default: none, ``OUTBOX["ORDERING"]``'s ``block``)
=============================  =================================================================

Endpoints registered at runtime (``OUTBOX["ENDPOINTS"]``): retried as ``hook``, private
networks allowed (the receivers are on loopback).

Destinations: ``hook`` (signed webhook to the receiver, exponential retries from 0.5 s,
capped at 4 s) and ``poison`` (:func:`tests.faults.targets.deliver`, which kills its
process for messages marked poison).
"""

import json
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def _number(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


REDIS_URL = os.environ["FAULTS_REDIS_URL"]

SECRET_KEY = "faults-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_rq",
    "outbox",
]
if os.environ.get("FAULTS_PG_DSN"):
    from urllib.parse import urlsplit

    _pg = urlsplit(os.environ["FAULTS_PG_DSN"])
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _pg.path.lstrip("/"),
            "USER": _pg.username or "postgres",
            "PASSWORD": _pg.password or "",
            "HOST": _pg.hostname or "127.0.0.1",
            "PORT": _pg.port or 5432,
            "OPTIONS": {"options": f"-c search_path={os.environ.get('FAULTS_PG_SCHEMA', 'public')}"},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("FAULTS_DB", str(BASE_DIR / ".faults" / "db.sqlite3")),
            # concurrent transactions from 8 threads and the workers: wait for the lock
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    }
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}
RQ_QUEUES = {
    "outbox_high": {"USE_REDIS_CACHE": "default"},
    "outbox": {"USE_REDIS_CACHE": "default"},
    "outbox_low": {"USE_REDIS_CACHE": "default"},
}
OUTBOX = {
    "DESTINATIONS": {
        "hook": {
            "TRANSPORT": "webhook",
            "OPTIONS": {
                "url": os.environ.get("FAULTS_RECEIVER_URL", "http://127.0.0.1:9/hook"),
                "secret": os.environ.get("FAULTS_SECRET", "whsec_" + "A" * 43 + "="),
                "timeout": _number("FAULTS_HOOK_TIMEOUT", 2),
                "connect_timeout": 1,
                "allow_private_networks": True,  # the receiver is on loopback
            },
            "RETRY": {"strategy": "exponential", "base": 0.5, "factor": 2, "max_delay": 4, "jitter": "equal"},
            "MAX_RETRIES": int(_number("FAULTS_HOOK_RETRIES", 10)),
            **(
                {"BREAKER": json.loads(os.environ["FAULTS_BREAKER"])}
                if os.environ.get("FAULTS_BREAKER")
                else {}
            ),
            **({"ORDERING": os.environ["FAULTS_ORDERING"]} if os.environ.get("FAULTS_ORDERING") else {}),
        },
        "poison": {
            "TRANSPORT": "callable",
            "OPTIONS": {"path": "tests.faults.targets.deliver"},
            "RETRY": [0.5],
            "MAX_RETRIES": int(_number("FAULTS_POISON_RETRIES", 2)),
        },
    },
    "VISIBILITY_TIMEOUT": int(_number("FAULTS_VISIBILITY_TIMEOUT", 10)),
    "RECOVERY_INTERVAL": _number("FAULTS_RECOVERY_INTERVAL", 2),
    "LATE_AFTER": _number("FAULTS_LATE_AFTER", 2),
    "BATCH_SIZE": int(_number("FAULTS_BATCH_SIZE", 100)),
    # The breaker stays on (a fault opens it; its parked messages must be delivered too),
    # with cool-downs that fit the scenarios' settle bounds (the default is 15 s to 600 s).
    "BREAKER": {
        "COOLDOWN": _number("FAULTS_BREAKER_COOLDOWN", 0.5),
        "MAX_COOLDOWN": _number("FAULTS_BREAKER_MAX_COOLDOWN", 2),
    },
    # Endpoints registered at runtime (the fan-out scenario): retried as ``hook`` is, on
    # loopback receivers (private networks allowed), their secrets encrypted with a key
    # of this suite's own.
    "ENDPOINTS": {
        "SECRET_KEYS": ["Jm1mXy7rQ0dI3tX3d5xQ3GJ7yTz6m0jYv8v4s6ZkQhE="],
        "ALLOW_PRIVATE_NETWORKS": True,
        "TIMEOUT": _number("FAULTS_HOOK_TIMEOUT", 2),
        "RETRY": {"strategy": "exponential", "base": 0.5, "factor": 2, "max_delay": 4, "jitter": "equal"},
        "MAX_RETRIES": int(_number("FAULTS_HOOK_RETRIES", 10)),
    },
}
# The fault settings break these on purpose; the suite reports outcomes, not settings advice.
SILENCED_SYSTEM_CHECKS = ["outbox.W003", "outbox.W004", "outbox.W005"]
if os.environ.get("FAULTS_CLUSTER_NODES"):
    OUTBOX["CLUSTER"] = {"NODES": os.environ["FAULTS_CLUSTER_NODES"].split(",")}
    OUTBOX["PARTITIONS"] = int(_number("FAULTS_PARTITIONS", 16))
    RQ_QUEUES = {name: {"URL": REDIS_URL} for name in RQ_QUEUES}
if os.environ.get("FAULTS_DURABILITY"):
    OUTBOX["DURABILITY"] = json.loads(os.environ["FAULTS_DURABILITY"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "INFO"}},
}
