"""Retry policies and the backoff schedule: pure functions, no Redis, no settings.

A policy is given as a dict (in settings, per destination, or per message):

* exponential (the default)::

      {"strategy": "exponential", "base": 10, "factor": 2, "max_delay": 21600, "jitter": "equal"}

  The delay before retry *n* (n = 1 for the first retry) is
  ``min(max_delay, base * factor ** (n - 1))`` seconds, then jittered.
* fixed schedule::

      {"strategy": "schedule", "delays": [5, 30, 300]}   # or just the list [5, 30, 300]

  Retry *n* waits ``delays[n - 1]``; past the end of the list the last delay repeats.

Jitter spreads retries of messages that failed together so they do not all return at
once (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015):

* ``"full"``: uniform in ``[0, delay]``;
* ``"equal"``: ``delay / 2`` plus uniform in ``[0, delay / 2]`` (never less than half);
* ``"none"``: the delay as computed.

How many retries a message gets is ``max_retries``, kept apart from the schedule.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JITTER_MODES = ("full", "equal", "none")
STRATEGIES = ("exponential", "schedule")
MAX_DELAY_LIMIT = 30 * 24 * 3600.0  # 30 days: longer waits are almost surely a units mistake
MIN_DELAY = 0.001  # seconds: a delay is 0 or at least 1 ms (5e-324 is a typo, not a wait)
MAX_FACTOR = 100.0  # growth per retry; more reaches max_delay at the second retry anyway
MAX_SCHEDULE = 1000  # delays in a fixed schedule (MAX_RETRIES_LIMIT retries use at most that many)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before each retry.

    Attributes:
        strategy: ``"exponential"`` or ``"schedule"``.
        base: first delay in seconds (exponential).
        factor: growth per retry (exponential), >= 1.
        max_delay: cap on any single delay, in seconds (before jitter).
        jitter: one of ``"full"``, ``"equal"``, ``"none"``.
        delays: the fixed delays in seconds (schedule).
    """

    strategy: str = "exponential"
    base: float = 10.0
    factor: float = 2.0
    max_delay: float = 6 * 3600.0
    jitter: str = "equal"
    delays: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        """Validate every field, however the policy was built.

        Raises:
            ValueError: an unknown strategy or jitter; ``base``, ``max_delay`` or a delay
                not 0 or between 1 ms and 30 days, or not a finite number; ``factor``
                not between 1 and 100; a schedule with no delays or over 1,000.
        """
        if self.strategy not in STRATEGIES:
            raise ValueError(f"retry strategy must be one of {STRATEGIES}, not {_shown(self.strategy)}")
        if self.jitter not in JITTER_MODES:
            raise ValueError(f"retry jitter must be one of {JITTER_MODES}, not {_shown(self.jitter)}")
        object.__setattr__(self, "base", _seconds(self.base, "base"))
        object.__setattr__(self, "max_delay", _seconds(self.max_delay, "max_delay"))
        factor = _number(self.factor, "factor")
        if not 1 <= factor <= MAX_FACTOR:
            raise ValueError(f"retry factor must be between 1 and {MAX_FACTOR:g}, not {factor!r}")
        object.__setattr__(self, "factor", factor)
        raw = self.delays
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ValueError(f"retry delays must be a list of seconds, not {_shown(raw)}")
        if len(raw) > MAX_SCHEDULE:
            raise ValueError(f"a retry schedule has at most {MAX_SCHEDULE} delays, not {len(raw)}")
        object.__setattr__(self, "delays", tuple(_seconds(d, "delays") for d in raw))
        if self.strategy == "schedule" and not self.delays:
            raise ValueError("a retry schedule needs a non-empty list of delays in seconds")

    @classmethod
    def from_value(cls, value: Any, *, default: RetryPolicy | None = None) -> RetryPolicy:
        """Build a policy from a settings value.

        Args:
            value: a ``RetryPolicy``, a mapping as in the module docstring, a sequence of
                delays in seconds (a fixed schedule), or None for ``default``.
            default: the policy whose fields fill in keys the mapping leaves out.

        Raises:
            ValueError: unknown keys, or any value :meth:`__post_init__` refuses.
        """
        base_policy = default or cls()
        if value is None:
            return base_policy
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, (list, tuple)):
            value = {"strategy": "schedule", "delays": value}
        if not isinstance(value, Mapping):
            raise ValueError(f"retry policy must be a dict or a list of delays, not {type(value).__name__}")
        unknown = {str(k)[:40] for k in value} - {
            "strategy",
            "base",
            "factor",
            "max_delay",
            "jitter",
            "delays",
        }
        if unknown:
            raise ValueError(f"unknown retry policy keys: {', '.join(sorted(unknown))}")
        strategy = value.get("strategy", "schedule" if "delays" in value else base_policy.strategy)
        delays = value.get("delays", base_policy.delays) if strategy == "schedule" else ()
        return cls(
            strategy=strategy,
            base=value.get("base", base_policy.base),
            factor=value.get("factor", base_policy.factor),
            max_delay=value.get("max_delay", base_policy.max_delay),
            jitter=value.get("jitter", base_policy.jitter),
            delays=delays,
        )

    def to_dict(self) -> dict[str, Any]:
        """The policy as a JSON-ready dict (stored in the resend record)."""
        if self.strategy == "schedule":
            return {"strategy": "schedule", "delays": list(self.delays), "jitter": self.jitter}
        return {
            "strategy": "exponential",
            "base": self.base,
            "factor": self.factor,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
        }


def _shown(value: Any) -> str:
    """A short rendering of a refused value (never a huge or recursive repr)."""
    if isinstance(value, (str, float, bool)) or value is None:
        return repr(value)[:60]
    return f"a {type(value).__name__}"


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"retry {name} must be a number, not {_shown(value)}")
    if isinstance(value, int) and abs(value) > 10**15:  # float() of 10**400 overflows
        raise ValueError(f"retry {name} must be between 0 and {MAX_DELAY_LIMIT:.0f}, not a very large int")
    if not math.isfinite(value):
        raise ValueError(f"retry {name} must be finite, not {value!r}")
    return float(value)


def _seconds(value: Any, name: str) -> float:
    seconds = _number(value, name)
    if not (seconds == 0 or MIN_DELAY <= seconds <= MAX_DELAY_LIMIT):
        raise ValueError(
            f"retry {name} must be 0 or between {MIN_DELAY:g} and {MAX_DELAY_LIMIT:.0f} seconds, not {seconds!r}"
        )
    return seconds


def backoff_delay(policy: RetryPolicy, retry_number: int, rng: _random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retry_number`` (1 for the first retry).

    Args:
        policy: the message's retry policy.
        retry_number: 1-based count of the retry about to be scheduled.
        rng: source of jitter; ``random`` module's global generator when None.

    Returns:
        The delay in seconds, ``0 <= delay <= policy.max_delay`` for exponential policies.

    Raises:
        ValueError: ``retry_number`` below 1. Never for a valid policy and retry number.
    """
    if retry_number < 1:
        raise ValueError(f"retry_number starts at 1, not {retry_number}")
    if policy.strategy == "schedule":
        delay = policy.delays[min(retry_number, len(policy.delays)) - 1]
    elif policy.base == 0 or policy.max_delay == 0:
        delay = 0.0
    else:
        # In log space, so no retry_number can overflow a float (base >= 1 ms, factor <= 100).
        log_delay = math.log(policy.base) + (retry_number - 1) * math.log(policy.factor)
        if log_delay >= math.log(policy.max_delay):
            delay = policy.max_delay
        else:  # factor ** (n - 1) < max_delay / base <= 2.6e9 here: no overflow
            delay = min(policy.max_delay, policy.base * policy.factor ** (retry_number - 1))
    uniform = _random.uniform if rng is None else rng.uniform
    if policy.jitter == "full":
        return uniform(0, delay)
    if policy.jitter == "equal":
        return delay / 2 + uniform(0, delay / 2)
    return delay


def retry_delay(
    policy: RetryPolicy,
    retry_number: int,
    retry_after: float | None = None,
    rng: _random.Random | None = None,
) -> float:
    """The wait before a retry, honouring a receiver's ``Retry-After`` (RFC 9110 §10.2.3).

    The backoff delay is used unless the receiver asked for longer; a ``Retry-After``
    is never shortened, but is capped at 30 days.

    Returns:
        Seconds to wait.
    """
    delay = backoff_delay(policy, retry_number, rng)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > delay:
        delay = min(float(retry_after), MAX_DELAY_LIMIT)
    return delay
