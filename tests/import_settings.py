"""The smallest Django settings under which every outbox module can be imported, with
no server: for the type checker (django-stubs' mypy plugin runs ``django.setup()`` to
learn the models) and for the docs build (autodoc imports the modules). The test
settings would start a Redis server; these name the same apps and start nothing, and no
code here opens a connection (the Redis location is never dialled).
"""

SECRET_KEY = "import-only"
USE_TZ = True
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
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}}
RQ_QUEUES = {name: {"USE_REDIS_CACHE": "default"} for name in ("outbox_high", "outbox", "outbox_low")}
OUTBOX: dict[str, dict[str, object]] = {"DESTINATIONS": {}}
