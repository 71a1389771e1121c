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

    @classmethod
    def from_value(cls, value: Any, *, default: RetryPolicy | None = None) -> RetryPolicy:
        """Build a policy from a settings value.

        Args:
            value: a ``RetryPolicy``, a mapping as in the module docstring, a sequence of
                delays in seconds (a fixed schedule), or None for ``default``.
            default: the policy whose fields fill in keys the mapping leaves out.

        Raises:
            ValueError: unknown keys, wrong types, negative or non-finite numbers,
                an empty schedule, or delays over 30 days.
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
        unknown = set(value) - {"strategy", "base", "factor", "max_delay", "jitter", "delays"}
        if unknown:
            raise ValueError(f"unknown retry policy keys: {', '.join(sorted(unknown))}")
        strategy = value.get("strategy", "schedule" if "delays" in value else base_policy.strategy)
        if strategy not in STRATEGIES:
            raise ValueError(f"retry strategy must be one of {STRATEGIES}, not {strategy!r}")
        jitter = value.get("jitter", base_policy.jitter)
        if jitter not in JITTER_MODES:
            raise ValueError(f"retry jitter must be one of {JITTER_MODES}, not {jitter!r}")
        base = _seconds(value.get("base", base_policy.base), "base")
        factor = _number(value.get("factor", base_policy.factor), "factor")
        if factor < 1:
            raise ValueError(f"retry factor must be >= 1, not {factor}")
        max_delay = _seconds(value.get("max_delay", base_policy.max_delay), "max_delay")
        delays: tuple[float, ...] = ()
        if strategy == "schedule":
            raw = value.get("delays", base_policy.delays)
            if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or not raw:
                raise ValueError("a retry schedule needs a non-empty list of delays in seconds")
            delays = tuple(_seconds(d, "delays") for d in raw)
        return cls(strategy=strategy, base=base, factor=factor, max_delay=max_delay, jitter=jitter, delays=delays)

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


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"retry {name} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"retry {name} must be finite, not {value!r}")
    return float(value)


def _seconds(value: Any, name: str) -> float:
    seconds = _number(value, name)
    if seconds < 0 or seconds > MAX_DELAY_LIMIT:
        raise ValueError(f"retry {name} must be between 0 and {MAX_DELAY_LIMIT:.0f} seconds, not {value!r}")
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
        ValueError: ``retry_number`` below 1.
    """
    if retry_number < 1:
        raise ValueError(f"retry_number starts at 1, not {retry_number}")
    if policy.strategy == "schedule":
        delay = policy.delays[min(retry_number, len(policy.delays)) - 1]
    else:
        # Compare in log space so a large retry_number cannot overflow a float.
        exponent = retry_number - 1
        if policy.base == 0:
            delay = 0.0
        elif policy.factor > 1 and exponent * math.log(policy.factor) > math.log(policy.max_delay / policy.base + 1):
            delay = policy.max_delay
        else:
            delay = min(policy.max_delay, policy.base * policy.factor**exponent)
    rng = rng or _random
    if policy.jitter == "full":
        return rng.uniform(0, delay)
    if policy.jitter == "equal":
        return delay / 2 + rng.uniform(0, delay / 2)
    return delay


def retry_delay(
    policy: RetryPolicy, retry_number: int, retry_after: float | None = None, rng: _random.Random | None = None
) -> float:
    """The wait before a retry, honouring a receiver's ``Retry-After`` (RFC 9110 §10.2.3).

    The backoff delay is used unless the receiver asked for longer; a ``Retry-After``
    is never shortened, but is capped at 30 days.

    Returns:
        Seconds to wait.
    """
    delay = backoff_delay(policy, retry_number, rng)
    if retry_after is not None and retry_after > delay:
        delay = min(float(retry_after), MAX_DELAY_LIMIT)
    return delay
