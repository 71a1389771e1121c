"""Django settings for mypy's Django plugin (pyproject.toml ``[tool.django-stubs]``).

The plugin imports the settings and runs ``django.setup()`` to learn the models; the
test settings would start a Redis server for that. These name the same apps and start
nothing; no code here opens a connection.
"""

SECRET_KEY = "typing-only"
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
