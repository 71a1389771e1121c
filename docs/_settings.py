"""The smallest Django settings under which autodoc can import every outbox module.

Nothing here connects to Redis or a database: importing the modules needs settings
(django-rq reads RQ_QUEUES, the admin needs its apps), not servers.
"""

SECRET_KEY = "docs-build-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_rq",
    "outbox",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}}
RQ_QUEUES = {name: {"USE_REDIS_CACHE": "default"} for name in ("outbox_high", "outbox", "outbox_low")}
OUTBOX = {"DESTINATIONS": {}}
