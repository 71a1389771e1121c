"""Settings of the demo project: a shop whose orders go out through the outbox.

Everything that differs between runs comes from environment variables, so that the
web server, the workers and ``outbox_demo``'s child processes agree:

=======================  ===============================================================
``REDIS_URL``            the Redis for the outbox, django-rq and the receiver's counters
                         (default ``redis://127.0.0.1:6379/0``; ``scripts/demo`` and
                         ``outbox_demo`` start a private server and set it).
``DEMO_DATA_DIR``        where the SQLite database and logs go (default ``.demo/``).
``DEMO_RECEIVER_URL``    where the ``orders`` webhook destination POSTs (default
                         ``http://127.0.0.1:8000/receiver/orders``: this project's
                         own flaky receiver).
``DEMO_FAILURE_RATE``    fraction of webhook requests the receiver answers with HTTP 500
                         (0 to 1, default 0.3).
``DEMO_SLOW_RATE``       fraction it answers after sleeping 1 to 2 seconds (default 0.02).
``DEMO_OUTBOX_PREFIX``   the outbox's Redis key prefix (default ``outbox``); any other
                         prefix also gets its own queues ``<prefix>_high``, ``<prefix>``,
                         ``<prefix>_low``, so runs sharing one Redis stay apart.
``DEMO_MAX_RETRIES``     retries after the first attempt before a message is failed (3).
``DEMO_WEBHOOK_SECRET``  the Standard Webhooks secret (``whsec_`` + base64) shared by
                         the ``orders`` destination and the receiver.
``DEMO_BREAKER``         ``1`` turns on the ``orders`` destination's circuit breaker
                         (10 consecutive failures, cool-down 2 s to 10 s); off by default,
                         so that the demo's random failures show retries and dead letters.
=======================  ===============================================================

Not for production: DEBUG is on and the secret key is fixed.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_float(name: str, default: float, low: float, high: float) -> float:
    """A float from the environment, between ``low`` and ``high``.

    Raises:
        ImproperlyConfigured: not a number, or out of range.
    """
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{name} must be between {low} and {high}, not {value}")
    return value


DEMO_DATA_DIR = Path(os.environ.get("DEMO_DATA_DIR") or BASE_DIR / ".demo")
DEMO_DATA_DIR.mkdir(parents=True, exist_ok=True)

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-key-do-not-deploy")
DEBUG = os.environ.get("DEMO_DEBUG", "1") != "0"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "outbox",
    "demo_site.shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"
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
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DEMO_DATA_DIR / "db.sqlite3",
        # The web server, workers and outbox_demo may write at once: wait for the lock (seconds).
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"
LOGIN_URL = "/admin/login/"

# The outbox has a cache alias of its own (as the README says a project should), on the
# demo's Redis; nothing else is cached in that database, so no cache.clear() can empty it.
# The site's own cache is per process. The demo receiver keeps its counters in the same
# Redis under its own key prefix (DEMO_RECEIVER_PREFIX), through the outbox's alias.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "outbox": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 5},
    },
}

DEMO_OUTBOX_PREFIX = os.environ.get("DEMO_OUTBOX_PREFIX") or "outbox"
if DEMO_OUTBOX_PREFIX == "outbox":
    OUTBOX_QUEUES = {"high": "outbox_high", "default": "outbox", "low": "outbox_low"}
else:
    OUTBOX_QUEUES = {
        "high": f"{DEMO_OUTBOX_PREFIX}_high",
        "default": DEMO_OUTBOX_PREFIX,
        "low": f"{DEMO_OUTBOX_PREFIX}_low",
    }
RQ_QUEUES = {name: {"USE_REDIS_CACHE": "outbox"} for name in OUTBOX_QUEUES.values()}
# The demo runs on a throwaway Redis (a private server without persistence, or REDIS_URL)
# and cleans up after itself by key prefix. A real project's outbox needs a Redis that
# keeps what it is given (README, "Operations"); here the warning that says so is known
# and silenced (outbox_worker honours SILENCED_SYSTEM_CHECKS too).
SILENCED_SYSTEM_CHECKS = ["outbox.W004"]

# The demo's flaky receiver (demo_site/shop/receiver.py).
DEMO_RECEIVER_URL = os.environ.get("DEMO_RECEIVER_URL") or "http://127.0.0.1:8000/receiver/orders"
DEMO_FAILURE_RATE = _env_float("DEMO_FAILURE_RATE", 0.3, 0.0, 1.0)
DEMO_SLOW_RATE = _env_float("DEMO_SLOW_RATE", 0.02, 0.0, 1.0)
DEMO_SLOW_SECONDS = (1.0, 2.0)  # a slow answer sleeps uniformly in this range; well under the 10 s timeout
DEMO_RECEIVER_PREFIX = "demo:receiver"  # the receiver's Redis keys; apart from the outbox's
# whsec_ + base64(b"django-redis-outbox demo secret!"): a fixed demo secret, not a real one.
DEMO_WEBHOOK_SECRET = (
    os.environ.get("DEMO_WEBHOOK_SECRET") or "whsec_ZGphbmdvLXJlZGlzLW91dGJveCBkZW1vIHNlY3JldCE="
)

EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "shop@example.com"

# Retries tuned so that 500 orders at a 30 % failure rate settle within about a minute:
# waits of about 0.5, 1, 2 s (equal jitter halves them at most), then dead letter after
# 1 + 3 attempts (0.3 ** 4: about 1 message in 120 ends failed and shows in the admin).
OUTBOX = {
    "REDIS_ALIAS": "outbox",
    "KEY_PREFIX": DEMO_OUTBOX_PREFIX,
    "QUEUES": OUTBOX_QUEUES,
    "MAX_RETRIES": int(_env_float("DEMO_MAX_RETRIES", 3, 0, 1000)),
    "RETRY": {"strategy": "exponential", "base": 0.5, "factor": 2, "max_delay": 5, "jitter": "equal"},
    "VISIBILITY_TIMEOUT": 120,
    "RECOVERY_INTERVAL": 5,
    "LATE_AFTER": 10,
    "DESTINATIONS": {
        "orders": {
            "TRANSPORT": "webhook",
            "OPTIONS": {
                "url": DEMO_RECEIVER_URL,
                "secret": DEMO_WEBHOOK_SECRET,
                "timeout": 10,
                "connect_timeout": 3,
                # The demo's receiver runs on this machine (127.0.0.1), which the SSRF guard
                # (OUTBOX["BLOCK_PRIVATE_NETWORKS"]) refuses unless a destination opts in.
                "allow_private_networks": True,
            },
            "BREAKER": (
                {"FAILURES": 10, "COOLDOWN": 2, "MAX_COOLDOWN": 10}
                if os.environ.get("DEMO_BREAKER") == "1"
                else False
            ),
        },
        "emails": {
            "TRANSPORT": "email",
            "OPTIONS": {"to": ["warehouse@example.com"], "subject": "New order"},
            "MAX_RETRIES": 2,
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "outbox": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "demo_site": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
