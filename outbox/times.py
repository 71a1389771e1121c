"""Times as users type them (the console's filters and the bulk commands' options)."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime

from django.utils import timezone

#: Largest epoch seconds accepted (year 9999): Redis takes any finite score, but a
#: datetime cannot show more.
MAX_EPOCH = 253402300799.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")


def parse_time(value: str, now: float | None = None) -> float:
    """Epoch seconds from what a user types for a time bound.

    Accepts epoch seconds (``1763780000``), a duration ago (``30m``, ``2h``, ``7d``,
    ``1w``), an ISO 8601 date (``2025-11-21``: midnight) or date-time
    (``2025-11-21T10:30``, as an ``<input type="datetime-local">`` sends it; without an
    offset it is in the current Django time zone).

    Raises:
        ValueError: none of these, or not a finite time between years 1 BC and 9999
            (``nan`` and ``inf`` would reach Redis as bounds it refuses).
    """
    text = value.strip()
    if not text:
        raise ValueError("empty time")
    relative = _RELATIVE.fullmatch(text.lower())
    if relative:
        return _finite(
            (time.time() if now is None else now) - float(relative.group(1)) * _UNITS[relative.group(2)],
            value,
        )
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return _finite(number, value)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ValueError(
            f"not a time: {value!r} (use 2025-11-21T10:30, 2025-11-21, 2h or epoch seconds)"
        ) from None
    try:
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment, timezone.get_current_timezone())
        return moment.timestamp()
    except (ValueError, OverflowError):  # year 1 or 9999 shifted out of range by the zone
        raise ValueError(f"not a time: {value!r} (out of range)") from None


def _finite(seconds: float, value: str) -> float:
    if not math.isfinite(seconds) or abs(seconds) > MAX_EPOCH:
        raise ValueError(f"not a time: {value!r} (use a finite number of epoch seconds up to year 9999)")
    return seconds
