"""Settings for ``python -m benchmarks.compare``: the test settings (Redis from
``OUTBOX_TEST_REDIS_URL``, which each measurement sets to its own private server) with
the library's defaults for everything that shapes delivery (VISIBILITY_TIMEOUT 300,
CONCURRENCY 32, MAX_IN_FLIGHT 16, BATCH_SIZE 100) and three destinations:

* ``noop``: the callable transport calling :func:`benchmarks.peers.noop` (no I/O);
* ``latency``: the callable transport calling :func:`benchmarks.peers.record_latency`;
* ``hook``: the webhook transport to ``BENCH_HOOK_URL`` (a loopback receiver, allowed
  with ``allow_private_networks``).

``BENCH_PROFILE`` picks each destination's ``MAX_IN_FLIGHT`` (the one setting the
table's rows differ by; the compare says which profile each row ran):

* ``tuned`` (or unset): every destination at 32, the worker's ``CONCURRENCY`` (what
  a user with one busy destination would tune it to);
* ``defaults``: no destination sets it, so each gets what a user who copies the
  documentation gets: a callable the worker's ``CONCURRENCY`` (32), a webhook
  ``OUTBOX["MAX_IN_FLIGHT"]``'s default (16) as its share, which a busy destination
  alone in the queue exceeds by borrowing idle slots, up to 24 (``outbox/delivery.py``,
  ``lend_reserve``).

``BENCH_DB`` (``--endpoints``) puts the database in that SQLite file, shared with the
worker processes, with ``OUTBOX["ENDPOINTS"]`` at the library's defaults but loopback
receivers allowed; ``BENCH_HOOK_SECRET`` signs ``hook``'s requests with that secret.

``BENCH_CLUSTER_NODES`` (comma-separated ``redis://host:port``) puts the outbox's data on
that Redis/Valkey Cluster (``OUTBOX["CLUSTER"]``) in ``BENCH_PARTITIONS`` partitions
(default 16), with RQ's queues on the plain private Redis of ``OUTBOX_TEST_REDIS_URL``
beside it, as a cluster deployment runs it (docs/operations.md, "Running on a cluster").

The ``outbox`` logger is at INFO (what ``manage.py outbox_worker`` sets at its default
verbosity) with no handler: each attempt's log record is built, not written out.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import OUTBOX

DEBUG = False
OUTBOX = {
    **{k: v for k, v in OUTBOX.items() if k not in ("VISIBILITY_TIMEOUT", "LATE_AFTER", "DESTINATIONS")},
    "DESTINATIONS": {
        # Thread-safe no-op callables: they may run concurrently.
        "noop": {"TRANSPORT": "callable", "OPTIONS": {"path": "benchmarks.peers.noop"}, "MAX_IN_FLIGHT": 32},
        "latency": {
            "TRANSPORT": "callable",
            "OPTIONS": {"path": "benchmarks.peers.record_latency"},
            "MAX_IN_FLIGHT": 32,
        },
        "hook": {
            "TRANSPORT": "webhook",
            "OPTIONS": {
                "url": os.environ.get("BENCH_HOOK_URL", "http://127.0.0.1:9/hook"),
                "timeout": 10,
                "allow_private_networks": True,  # the receiver is on loopback
            },
            "MAX_IN_FLIGHT": 32,
        },
    },
}
if os.environ.get("BENCH_HOOK_SECRET"):  # --endpoints: the hook signed, as every endpoint is
    OUTBOX["DESTINATIONS"]["hook"]["OPTIONS"]["secret"] = os.environ["BENCH_HOOK_SECRET"]
if os.environ.get("BENCH_DB"):  # --endpoints: a database file the worker processes share
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["BENCH_DB"]}}
    # the library's defaults (CACHE_TTL 30 s, VERSION_CHECK 1 s), loopback receivers allowed
    OUTBOX["ENDPOINTS"] = {
        "SECRET_KEYS": OUTBOX["ENDPOINTS"]["SECRET_KEYS"],
        "ALLOW_PRIVATE_NETWORKS": True,
    }
if os.environ.get("BENCH_PROFILE") == "defaults":
    # Out of the box: no destination sets MAX_IN_FLIGHT (see the module docstring).
    for _entry in OUTBOX["DESTINATIONS"].values():
        _entry.pop("MAX_IN_FLIGHT", None)
if os.environ.get("BENCH_MAX_IN_FLIGHT"):  # diagnostics only: the table uses the default (16)
    OUTBOX["MAX_IN_FLIGHT"] = int(os.environ["BENCH_MAX_IN_FLIGHT"])
if os.environ.get("BENCH_CONCURRENCY"):  # diagnostics only: the tables use the default (32)
    OUTBOX["CONCURRENCY"] = int(os.environ["BENCH_CONCURRENCY"])
if os.environ.get("BENCH_CLUSTER_NODES"):
    OUTBOX["CLUSTER"] = {"NODES": os.environ["BENCH_CLUSTER_NODES"].split(",")}
    OUTBOX["PARTITIONS"] = int(os.environ.get("BENCH_PARTITIONS", "16"))
    # RQ cannot run on a cluster: its queues on the plain private Redis (outbox.E009, W001).
    RQ_QUEUES = {name: {"URL": REDIS_URL} for name in ("outbox_high", "outbox", "outbox_low")}  # noqa: F405
elif os.environ.get("BENCH_PARTITIONS"):  # diagnostics: partitions on the single server
    OUTBOX["PARTITIONS"] = int(os.environ["BENCH_PARTITIONS"])
if OUTBOX.get("CLUSTER") and OUTBOX.get("PARTITIONS", 1) == 1:
    # the diagnostic case cluster1-p1 (one partition on a cluster), which outbox.E010
    # refuses; the worker process runs the checks.
    SILENCED_SYSTEM_CHECKS = ["outbox.E010"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"outbox": {"handlers": ["null"], "level": "INFO", "propagate": False}},
}
