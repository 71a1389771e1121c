"""The version of django-redis-outbox (re-exported as ``outbox.__version__``)."""

__version__ = "0.2.0.dev0"
