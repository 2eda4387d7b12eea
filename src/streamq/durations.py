"""Durations in the public API: a ``timedelta`` or a number of **seconds**, everywhere.

``add(delay=...)``, ``Retry``, ``Limiter``, ``Batch``, every option and every environment
variable take one of these; milliseconds exist only inside Redis (scores, ``PX``, script
arguments) and in the names of internal fields that say ``_ms``. One converter, so a bad
value gets the same error wherever it is given.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeAlias

from streamq.errors import ConfigurationError

__all__ = ["Duration", "to_ms", "to_seconds"]

Duration: TypeAlias = timedelta | float | int
"""A duration: a ``timedelta``, or a number of seconds (``30``, ``0.5``)."""


def to_seconds(value: Duration, what: str) -> float:
    """``value`` in seconds; refuses what is not a duration (``bool``, ``str``, NaN...)."""
    if isinstance(value, bool) or not isinstance(value, timedelta | float | int):
        raise ConfigurationError(
            f"{what} must be a timedelta or a number of seconds, got {value!r}"
        )
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} must be a finite number of seconds, got {value!r}")
    return seconds


def to_ms(value: Duration, what: str, *, minimum: int | None = 0) -> int:
    """``value`` as whole milliseconds, checked against ``minimum`` (None: no check).

    Raises:
        ConfigurationError: naming ``what``: not a duration, or below ``minimum``.
    """
    ms = round(to_seconds(value, what) * 1000)
    if minimum is not None and ms < minimum:
        if minimum == 0:
            raise ConfigurationError(f"{what} must not be negative, got {value!r}")
        raise ConfigurationError(f"{what} must be at least {minimum} ms, got {value!r}")
    return ms
