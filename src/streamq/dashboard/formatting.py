"""How the pages write figures: ages, times (UTC), rates and JSON payloads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

__all__ = ["age", "pretty", "rate", "when"]


def age(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h10m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return "0s" if seconds <= 0 else "<1s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def when(value: int | datetime | None) -> str:
    """ms since the epoch as ``YYYY-MM-DD HH:MM:SS UTC``; a datetime in its own zone."""
    if value is None:
        return "-"
    if isinstance(value, int):
        value = datetime.fromtimestamp(value / 1000, tz=UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S %Z")


def rate(value: float | None) -> str:
    """Jobs per minute: one decimal below 10."""
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def pretty(value: Any) -> str:
    """Indented, key-sorted JSON."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
