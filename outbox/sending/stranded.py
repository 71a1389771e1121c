"""Captured rows that no running relay pushes: seen (:func:`warn_if_due`) and adopted
(:func:`adopt`).

A relay pushes only its own deployment's rows and legacy ones
(:func:`outbox.sending.deployment.relayed`). A row captured under an identity that no
running relay has (Redis moved and the derived identity changed with its address, web
processes and workers that write the address differently, a typo in
``OUTBOX["DEPLOYMENT"]``) would wait for ever. So:

* every relay, at most once per :data:`CHECK_INTERVAL` per process, counts the rows of
  other deployments (not its own, not legacy) older than :data:`STRANDED_AFTER` and logs
  one warning per identity and database, with what to do (:func:`warn_if_due`);
* ``manage.py outbox_recover --adopt-captured IDENTITY`` re-tags that identity's rows as
  this deployment's (:func:`adopt`), and this deployment's relay pushes them. A row whose
  (destination, idempotency key) this deployment has captured already stays where it is
  and is reported: keys are unique per deployment, and neither message is dropped.

A row of another deployment that is running is not stranded: its own relay pushes it
within ``RELAY_AFTER`` and ``RELAY_INTERVAL`` seconds, far below :data:`STRANDED_AFTER`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, Min, OuterRef

from outbox.models import CapturedMessage
from outbox.sending import deployment

logger = logging.getLogger("outbox")

#: Seconds between two checks for stranded rows, per process (each relay pass otherwise).
CHECK_INTERVAL = 300.0
#: Seconds a row of another deployment must have waited to count as stranded; its own
#: relay, if one runs, pushes it within seconds.
STRANDED_AFTER = 600.0

_last_check: float | None = None  # time.monotonic() of this process's last check


@dataclass(frozen=True)
class Stranded:
    """The old captured rows of one other deployment in one database.

    Attributes:
        database: the database alias.
        deployment: their identity.
        count: how many rows.
        oldest: ``created_at`` of the oldest, epoch seconds.
    """

    database: str
    deployment: str
    count: int
    oldest: float


@dataclass
class Adoption:
    """What :func:`adopt` did (or, with ``dry_run``, would do).

    Attributes:
        adopted: database alias -> rows re-tagged as this deployment's.
        left: ids of the rows left with their identity: this deployment has a captured
            row of the same (destination, idempotency key).
    """

    adopted: dict[str, int] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.adopted.values())


def reset() -> None:
    """Forget the last check, so the next relay pass checks (tests)."""
    global _last_check
    _last_check = None


def find(aliases: Sequence[str], *, older_than: float = STRANDED_AFTER) -> list[Stranded]:
    """The rows of other deployments (neither this one's nor legacy) captured more than
    ``older_than`` seconds ago, grouped per database and identity: one query per alias.

    Raises:
        django.db.DatabaseError: from the database.
        ImproperlyConfigured: as :func:`deployment.current`.
    """
    cutoff = time.time() - older_than
    found: list[Stranded] = []
    for alias in aliases:
        groups = (
            CapturedMessage.objects.using(alias)
            .filter(created_at__lte=cutoff)
            .exclude(deployment__in=deployment.relayed())
            .values("deployment")
            .annotate(count=Count("id"), oldest=Min("created_at"))
            .order_by("deployment")
        )
        found += [Stranded(alias, g["deployment"], g["count"], g["oldest"]) for g in groups]
    return found


def warn_if_due(aliases: Sequence[str]) -> list[Stranded] | None:
    """When :data:`CHECK_INTERVAL` has passed since this process's last check, find the
    stranded rows of ``aliases`` (:func:`find`) and log a warning for each group.

    Returns:
        What was found, or None when no check was due. Never raises: a database error
        is logged at debug level (the relay reports the database itself).
    """
    global _last_check
    now = time.monotonic()
    if _last_check is not None and now - _last_check < CHECK_INTERVAL:
        return None
    _last_check = now
    try:
        found = find(aliases)
        own = deployment.current()
    except Exception as exc:
        logger.debug("outbox relay: could not check for other deployments' captured rows: %s", exc)
        return None
    for group in found:
        logger.warning(
            "outbox relay: %d captured message(s) of deployment %r in database %r, oldest waiting %s, "
            "that no relay of this deployment (%r) pushes. If they are this deployment's, captured "
            "under another Redis address or name, set OUTBOX['DEPLOYMENT'] = %r in the settings of "
            "every web process and worker; if that deployment is gone, run `manage.py outbox_recover "
            "--adopt-captured %s` to push them into this deployment's Redis",
            group.count,
            group.deployment,
            group.database,
            duration(time.time() - group.oldest),
            own,
            group.deployment,
            group.deployment,
        )
    return found


def duration(seconds: float) -> str:
    """``seconds`` for people: ``"45 s"``, ``"60 min"``, ``"5 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def adopt(identity: str, aliases: Sequence[str], *, dry_run: bool = False) -> Adoption:
    """Re-tag the captured rows of deployment ``identity`` as this deployment's, so that
    its relay pushes them, in every database of ``aliases``; one transaction per alias.

    A row whose (destination, idempotency key) this deployment has captured too is left
    as it is (the key is unique per deployment, and either row may be the message the
    sender meant): it is named in :attr:`Adoption.left`.

    Args:
        identity: the deployment whose rows to adopt.
        aliases: database aliases.
        dry_run: count, change nothing.

    Returns:
        An :class:`Adoption`.

    Raises:
        ValueError: ``identity`` is this deployment's own, or the legacy ``""`` (any
            relay pushes those already).
        django.db.DatabaseError: from the database (that alias's rows stay as they were).
        ImproperlyConfigured: as :func:`deployment.current`.
    """
    own = deployment.current()
    if identity == deployment.LEGACY:
        raise ValueError("'' is the identity of legacy rows, which every relay pushes already")
    if identity == own:
        raise ValueError(
            f"{identity!r} is this deployment's own identity: its relay pushes those rows already"
        )
    report = Adoption()
    for alias in aliases:
        with transaction.atomic(using=alias):
            theirs = CapturedMessage.objects.using(alias).filter(deployment=identity)
            left = _taken(alias, identity, own)
            ids = list(theirs.exclude(id__in=left).values_list("id", flat=True))
            if not dry_run:
                ids = _retag(alias, ids, own, left)
            report.adopted[alias] = len(ids)
            report.left += left
    return report


def _taken(alias: str, identity: str, own: str) -> list[str]:
    """Ids of ``identity``'s keyed rows whose (destination, key) deployment ``own`` has."""
    rows = CapturedMessage.objects.using(alias)
    same_key = rows.filter(
        deployment=own, destination=OuterRef("destination"), idempotency_key=OuterRef("idempotency_key")
    )
    theirs = rows.filter(deployment=identity, idempotency_key__isnull=False)
    return list(theirs.filter(Exists(same_key)).values_list("id", flat=True))


def _retag(alias: str, ids: list[str], own: str, left: list[str]) -> list[str]:
    """Set ``deployment=own`` on the rows of ``ids``: all at once, or, when a key was
    captured in ``own`` meanwhile (the unique constraint), row by row, appending the ids
    that collide to ``left``. Returns the ids re-tagged."""
    rows = CapturedMessage.objects.using(alias)
    try:
        with transaction.atomic(using=alias):
            rows.filter(id__in=ids).update(deployment=own)
        return ids
    except IntegrityError:
        pass
    done = []
    for message_id in ids:
        try:
            with transaction.atomic(using=alias):
                rows.filter(id=message_id).update(deployment=own)
            done.append(message_id)
        except IntegrityError:
            left.append(message_id)
    return done
