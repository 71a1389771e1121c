"""The deployment a captured message belongs to, so that a relay pushes only its own.

A *deployment* is one place where the outbox's data lives: one Redis (or one cluster)
and one ``KEY_PREFIX``. Every captured row (:class:`~outbox.models.CapturedMessage`)
carries its deployment's identity, and the relay and every push read back only rows of
their own deployment, plus legacy rows (written before rows carried one). So two
configurations sharing one database (staging and production, two services, two Redis
servers) never push each other's messages into the wrong Redis.

The identity (:func:`current`), a string of at most 64 characters:

* ``OUTBOX["DEPLOYMENT"]`` when set: a name the project chooses (letters, digits and
  ``._:-``), the same in the settings of every web process and worker of the deployment.
  It is the way to keep one identity when Redis moves to a new address, and to tell two
  deployments apart whose configurations name the same address (each on its own host,
  with its own Redis on ``localhost``).
* Otherwise derived from where the data lives (:func:`describe`): ``"auto-"`` and 16
  hexadecimal digits of the SHA-256 of

  - a single server: ``redis://<host>:<port>/<db>`` from the django-redis alias's
    client (so ``redis://h``, ``redis://h:6379`` and ``redis://h:6379/0`` agree), or
    ``unix://<path>/<db>`` for a socket, ``sentinel://<service>/<db>`` through Sentinel;
  - a cluster: ``cluster://`` and the startup nodes of ``OUTBOX["CLUSTER"]["NODES"]``,
    ``host:port`` sorted and without duplicates (their order does not matter; the list
    does: processes listing different nodes of one cluster need ``DEPLOYMENT``);

  and the ``KEY_PREFIX``. Host names are compared lower-cased, without a trailing dot;
  names are not resolved (resolution can differ between hosts and over time), except
  that every loopback address (``localhost``, ``127.0.0.0/8``, ``::1``) counts as
  ``localhost``: a loopback server is reachable only from its own host, so the
  processes that use it run there and may write it either way.

  It is stable across processes and restarts while the settings are; changing the
  address or the prefix changes it (see "Captured rows and deployments" in
  docs/operations.md).

Legacy rows (identity ``""``, :data:`LEGACY`): written before this column existed. Any
relay pushes them, as before the upgrade, so none is stranded; in a database that two
deployments share, a legacy row may still reach the wrong one, once, as it could before.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.conf import outbox_settings
from outbox.store.client.connection import data_location

#: The identity of rows written before rows carried one; every relay pushes them.
LEGACY = ""
#: Largest identity, in characters (the column's length).
MAX_LENGTH = 64
#: What ``OUTBOX["DEPLOYMENT"]`` may be.
NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
AUTO_PREFIX = "auto-"

_cache: dict[str, str] = {}


def current() -> str:
    """This configuration's deployment identity (see the module docstring), cached until
    ``OUTBOX`` or ``CACHES`` changes. Reads no network: it works while Redis is down.

    Returns:
        ``OUTBOX["DEPLOYMENT"]``, or ``"auto-"`` and 16 hexadecimal digits.

    Raises:
        ImproperlyConfigured: ``OUTBOX["DEPLOYMENT"]`` is not a valid name, or the Redis
            settings are invalid (no such alias, a bad ``OUTBOX["CLUSTER"]``).
    """
    found = _cache.get("identity")
    if found is None:
        found = _cache["identity"] = _identity()
    return found


def relayed() -> list[str]:
    """The identities whose rows this configuration pushes: its own and :data:`LEGACY`.

    Raises:
        ImproperlyConfigured: as :func:`current`.
    """
    return [current(), LEGACY]


def configured() -> str | None:
    """``OUTBOX["DEPLOYMENT"]`` checked, or None when unset.

    Raises:
        ImproperlyConfigured: it is set but not 1 to 64 letters, digits and ``._:-``.
    """
    value = outbox_settings.DEPLOYMENT
    if value is None:
        return None
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ImproperlyConfigured(
            f"OUTBOX['DEPLOYMENT'] must be None or 1 to {MAX_LENGTH} letters, digits and '._:-', "
            f"not {value!r}"
        )
    return value


def _identity() -> str:
    named = configured()
    if named is not None:
        return named
    digest = hashlib.sha256(describe().encode()).hexdigest()[:16]
    return f"{AUTO_PREFIX}{digest}"


def describe() -> str:
    """Where the outbox's data lives, normalised (the input of the derived identity):
    ``"redis://localhost:6379/0 prefix=outbox"``, ``"cluster://10.0.0.1:7000,10.0.0.2:7000
    prefix=outbox"``... No credentials, no network.

    Raises:
        ImproperlyConfigured: the Redis settings are invalid.
    """
    return f"{data_location()} prefix={outbox_settings.KEY_PREFIX}"


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES"):
        _cache.clear()
