"""Retry backoff policies: fixed, exponential with jitter, or a callable."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeAlias

from streamq.durations import to_ms
from streamq.errors import ConfigurationError

__all__ = ["Backoff", "BackoffFn", "BackoffLike", "compute_backoff_ms"]

BackoffFn: TypeAlias = Callable[[int], "timedelta | float"]
"""A callable backoff: attempt number that just failed (1-based) -> delay (timedelta or s)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before the next attempt.

    Example::

        Backoff.exponential(timedelta(seconds=1), max_delay=timedelta(minutes=5))
        Backoff.fixed(2.5)   # seconds
    """

    kind: Literal["fixed", "exponential"]
    delay_ms: int
    max_delay_ms: int = 3_600_000
    jitter: float = 0.0

    @classmethod
    def fixed(cls, delay: timedelta | float) -> Backoff:
        return cls("fixed", to_ms(delay, "backoff delay"))

    @classmethod
    def exponential(
        cls,
        delay: timedelta | float,
        *,
        max_delay: timedelta | float = timedelta(hours=1),
        jitter: float = 0.2,
    ) -> Backoff:
        """``delay * 2**(attempt-1)``, capped at ``max_delay``, +/- ``jitter`` (a fraction)."""
        if not 0 <= jitter <= 1:
            raise ConfigurationError(f"backoff jitter must be within [0, 1], got {jitter}")
        return cls(
            "exponential", to_ms(delay, "backoff delay"), to_ms(max_delay, "max_delay"), jitter
        )

    def delay_for(self, attempt: int, rng: random.Random | None = None) -> int:
        """Milliseconds to wait after attempt ``attempt`` (1-based) failed."""
        if self.kind == "fixed":
            base = self.delay_ms
        else:
            base = min(self.max_delay_ms, self.delay_ms * 2 ** max(0, attempt - 1))
        if self.jitter:
            spread = base * self.jitter
            base = round(base + (rng or random).uniform(-spread, spread))
        return max(0, base)

    def describe(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "delay_ms": self.delay_ms,
            "max_delay_ms": self.max_delay_ms,
            "jitter": self.jitter,
        }


BackoffLike: TypeAlias = Backoff | BackoffFn


def compute_backoff_ms(backoff: BackoffLike, attempt: int) -> int:
    """The delay in ms after failed attempt ``attempt`` under a policy or a callable."""
    if isinstance(backoff, Backoff):
        return backoff.delay_for(attempt)
    return to_ms(backoff(attempt), "backoff callable result")
