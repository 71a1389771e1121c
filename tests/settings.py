"""Django settings for the test suite.

Redis: ``OUTBOX_TEST_REDIS_URL`` if set (worker subprocesses inherit it from the test
process), else a private server started here on a free port and stopped at exit.
Never the shared 127.0.0.1:6379.
"""

import atexit
import os

if not os.environ.get("OUTBOX_TEST_REDIS_URL"):
    from outbox.testing import RedisServer

    _server = RedisServer().start()
    atexit.register(_server.stop)
    os.environ["OUTBOX_TEST_REDIS_URL"] = _server.url

REDIS_URL = os.environ["OUTBOX_TEST_REDIS_URL"]

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
        },
        "mem": {"TRANSPORT": "locmem", "RETRY": [0], "MAX_RETRIES": 2},
    },
    "VISIBILITY_TIMEOUT": int(os.environ.get("OUTBOX_TEST_VISIBILITY_TIMEOUT", "30")),
    "RECOVERY_GRACE": 1,
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "INFO"}},
}
