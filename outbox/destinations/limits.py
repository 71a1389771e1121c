"""Per-destination protection settings, parsed and checked once: the circuit breaker
(``BREAKER``), the rate limit (``RATE_LIMIT``), the concurrency cap across workers
(``MAX_CONCURRENCY``) and ``DISABLE_AFTER``.

Each parser takes the raw setting value and the place it came from (for the error
text) and returns a frozen value object, or raises ``ValueError`` saying what is wrong;
:func:`outbox.destinations._build` turns that into ``ImproperlyConfigured`` (and the
system check ``outbox.E002``; the global defaults as ``outbox.E001``). The Lua scripts
get these values as JSON (:func:`outbox.destinations.config.breaker_config_json`,
:func:`outbox.destinations.config.limits_json`), computed once per worker run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

BREAKER_KEYS = ("FAILURES", "FAILURE_RATE", "MIN_ATTEMPTS", "WINDOW", "COOLDOWN", "MAX_COOLDOWN")
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*(?:\.\d+)?)\s*([smh])\s*$")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class BreakerConfig:
    """A destination's circuit breaker.

    It opens after ``failures`` consecutive failed attempts, or when more than
    ``failure_rate`` of the attempts in the last ``window`` seconds failed and there were
    at least ``min_attempts`` of them. While open, one probe is let through after
    ``cooldown`` seconds; the cool-down doubles while probes fail, up to ``max_cooldown``.

    Attributes:
        failures: consecutive failures that open it (>= 1).
        failure_rate: share of failed attempts (0 < rate <= 1) that opens it.
        min_attempts: attempts in the window before the rate counts (>= 1).
        window: seconds of the sliding window (whole minutes are read, >= 60).
        cooldown: seconds before the first probe (> 0).
        max_cooldown: longest cool-down in seconds (>= cooldown).
    """

    failures: int = 5
    failure_rate: float = 0.5
    min_attempts: int = 20
    window: int = 300
    cooldown: float = 15.0
    max_cooldown: float = 600.0

    def __str__(self) -> str:
        """For pages: when it opens and how long it waits, in words."""
        return (
            f"opens after {self.failures} consecutive failures, or over {self.failure_rate:.0%} of "
            f"at least {self.min_attempts} attempts in {self.window:g} s; probes after "
            f"{self.cooldown:g} s, doubling up to {self.max_cooldown:g} s"
        )

    @classmethod
    def parse(cls, value: Any, default: Any, where: str) -> BreakerConfig | None:
        """A :class:`BreakerConfig` from a ``BREAKER`` setting over the global default.

        ``False`` (or None) turns the breaker off (returns None); a dict overrides keys
        of ``default`` (itself a dict, or False).

        Raises:
            ValueError: an unknown key or a value out of range.
        """
        if value is False or value is None:
            return None
        if value is True:
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a dict of {', '.join(BREAKER_KEYS)} or False, not {value!r}")
        unknown = set(value) - set(BREAKER_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        merged = {**(default if isinstance(default, dict) else {}), **value}
        data = {k: merged[k] for k in BREAKER_KEYS if k in merged}
        f = data.get("FAILURES", cls.failures)
        if isinstance(f, bool) or not isinstance(f, int) or f < 1:
            raise ValueError(f"{where}['FAILURES'] must be an integer >= 1, not {f!r}")
        rate = data.get("FAILURE_RATE", cls.failure_rate)
        if not _number(rate) or not 0 < rate <= 1:
            raise ValueError(f"{where}['FAILURE_RATE'] must be a number above 0 and at most 1, not {rate!r}")
        m = data.get("MIN_ATTEMPTS", cls.min_attempts)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"{where}['MIN_ATTEMPTS'] must be an integer >= 1, not {m!r}")
        w = data.get("WINDOW", cls.window)
        if not _number(w) or w < 60:
            raise ValueError(f"{where}['WINDOW'] must be seconds >= 60 (whole minutes are read), not {w!r}")
        c = data.get("COOLDOWN", cls.cooldown)
        if not _number(c) or c <= 0:
            raise ValueError(f"{where}['COOLDOWN'] must be seconds above 0, not {c!r}")
        mc = data.get("MAX_COOLDOWN", cls.max_cooldown)
        if not _number(mc) or mc < c:
            raise ValueError(f"{where}['MAX_COOLDOWN'] must be seconds >= COOLDOWN ({c!r}), not {mc!r}")
        return cls(f, float(rate), m, int(w), float(c), float(mc))


@dataclass(frozen=True)
class RateLimit:
    """A rate limit enforced across all workers with GCRA (see ``lua/claim.lua``).

    ``rate`` attempts per ``per`` seconds, up to ``burst`` at once. GCRA, the generic cell
    rate algorithm (ITU-T I.371, as described by Brandur Leach, "Rate Limiting, Cells, and
    GCRA", and implemented by redis-cell), keeps one theoretical arrival time per
    destination: it spaces attempts by the emission interval ``per / rate`` and
    tolerates ``burst - 1`` of them early.

    Attributes:
        rate: attempts per period (> 0).
        per: the period in seconds (> 0).
        burst: attempts allowed at once (>= 1).
    """

    rate: float
    per: float = 1.0
    burst: int = 1

    def __str__(self) -> str:
        """For pages: ``100 per 1 s (burst 10)``."""
        return f"{self.rate:g} per {self.per:g} s" + (f" (burst {self.burst})" if self.burst > 1 else "")

    @property
    def interval(self) -> float:
        """The emission interval T in seconds: one attempt per T on average."""
        return self.per / self.rate

    @property
    def tolerance(self) -> float:
        """The delay variation tolerance tau in seconds: how far ahead of schedule a burst may run."""
        return self.interval * (self.burst - 1)

    @classmethod
    def parse(cls, value: Any, where: str) -> RateLimit | None:
        """A :class:`RateLimit` from ``"100/s"``, ``"6000/m"``, ``"10/5s"`` or
        ``{"RATE": 100, "PER": 1.0, "BURST": 10}``; None for None.

        Raises:
            ValueError: anything else.
        """
        if value is None:
            return None
        if isinstance(value, str):
            match = RATE_PATTERN.match(value)
            if not match:
                raise ValueError(f"{where} must look like '100/s', '6000/m' or '10/5s', not {value!r}")
            rate, count, unit = float(match.group(1)), match.group(2), match.group(3)
            per = (float(count) if count else 1.0) * RATE_UNITS[unit]
            if rate <= 0 or per <= 0:
                raise ValueError(f"{where} must allow a rate above 0, not {value!r}")
            return cls(rate, per, 1)
        if isinstance(value, dict):
            unknown = set(value) - {"RATE", "PER", "BURST"}
            if unknown or "RATE" not in value:
                raise ValueError(f"{where} must be a dict with RATE (and optional PER, BURST), not {value!r}")
            rate, per, burst = value["RATE"], value.get("PER", 1.0), value.get("BURST", 1)
            if not _number(rate) or rate <= 0:
                raise ValueError(f"{where}['RATE'] must be a number above 0, not {rate!r}")
            if not _number(per) or per <= 0:
                raise ValueError(f"{where}['PER'] must be seconds above 0, not {per!r}")
            if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
                raise ValueError(f"{where}['BURST'] must be an integer >= 1, not {burst!r}")
            return cls(float(rate), float(per), burst)
        raise ValueError(f"{where} must be None, a string like '100/s' or a dict, not {value!r}")


def parse_max_concurrency(value: Any, where: str) -> int | None:
    """``MAX_CONCURRENCY``: None or an integer >= 1.

    Raises:
        ValueError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be None or an integer >= 1, not {value!r}")
    return int(value)


def parse_disable_after(value: Any, where: str) -> float | None:
    """``DISABLE_AFTER``: None (never) or seconds above 0.

    Raises:
        ValueError: anything else.
    """
    if value is None:
        return None
    if not _number(value) or value <= 0:
        raise ValueError(f"{where} must be None or seconds above 0, not {value!r}")
    return float(value)
