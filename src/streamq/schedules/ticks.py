"""Ticks: when a schedule fires (an interval, or a cron expression in a time zone), and
which ticks one look of the scheduler enqueues (:func:`plan_ticks`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol
from zoneinfo import ZoneInfo

from cronsim import CronSim

__all__ = [
    "MAX_TICKS_PER_STEP",
    "Cron",
    "Every",
    "Missed",
    "Plan",
    "Timing",
    "ms_to_datetime",
    "plan_ticks",
]

Missed = Literal["skip", "once"]
"""What happens to ticks older than the grace when first seen due: ``skip`` them, or run
``once`` for all of them."""
MAX_TICKS_PER_STEP = 1000
"""The most ticks one look enqueues for one schedule (the rest on the next look)."""


def ms_to_datetime(ms: int, tz: ZoneInfo) -> datetime:
    """``ms`` since the epoch as an aware datetime in ``tz``."""
    # Through UTC: wall-clock arithmetic in the zone would lose the fold of an ambiguous hour.
    utc = datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)
    return utc.astimezone(tz)


class Timing(Protocol):
    """When a schedule fires; times are ms since the epoch."""

    def next_after(self, ms: int) -> int | None: ...

    def last_until(self, ms: int) -> int | None: ...

    def count(self, after: int, until: int, cap: int) -> int: ...


class Every:
    """Ticks at every multiple of the interval since the epoch: the same on every host."""

    __slots__ = ("ms",)

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def next_after(self, ms: int) -> int | None:
        return (ms // self.ms + 1) * self.ms

    def last_until(self, ms: int) -> int | None:
        return (ms // self.ms) * self.ms

    def count(self, after: int, until: int, cap: int) -> int:
        return max(0, min(cap, until // self.ms - after // self.ms))


class Cron:
    """Ticks of a cron expression in a time zone (cronsim: Debian cron's rules, DST included:
    a time skipped by a spring-forward runs right after the change, a fixed time repeated by
    a fall-back runs once)."""

    __slots__ = ("expr", "tz")

    def __init__(self, expr: str, tz: ZoneInfo) -> None:
        self.expr = expr
        self.tz = tz

    def _walk(self, ms: int, *, reverse: bool) -> int | None:
        try:
            tick = next(CronSim(self.expr, ms_to_datetime(ms, self.tz), reverse=reverse))
        except StopIteration:
            return None
        return int(tick.timestamp()) * 1000

    def next_after(self, ms: int) -> int | None:
        return self._walk(ms, reverse=False)

    def last_until(self, ms: int) -> int | None:
        # Backwards, cronsim includes a tick in the start's second only when the start has a
        # fraction of a second: starting at ms + 1 asks for the ticks <= ms either way. Its
        # answer is then walked forward, so that a DST quirk of the reverse walk cannot make
        # it skip a later tick.
        found = None
        for back_ms in (0, 7_200_000, 86_400_000):
            found = self._walk(ms + 1 - back_ms, reverse=True)
            if found is None or found <= ms:
                break
        if found is None or found > ms:
            return None
        for _ in range(10_000):
            later = self.next_after(found)
            if later is None or later > ms:
                break
            found = later
        return found

    def count(self, after: int, until: int, cap: int) -> int:
        n = 0
        tick = self.next_after(after)
        while tick is not None and tick <= until and n < cap:
            n += 1
            tick = self.next_after(tick)
        return n


@dataclass(frozen=True, slots=True)
class Plan:
    """What one look at a schedule decided.

    Attributes:
        enqueue: ticks (ms) to enqueue, oldest first.
        cursor: the cursor to record once they are enqueued (None: leave it).
        missed: ticks found missed (counted up to 1000).
        missed_from, missed_until: the first and the last missed tick (ms), when any.
        first_seen: the schedule had no cursor yet.
    """

    enqueue: tuple[int, ...] = ()
    cursor: int | None = None
    missed: int = 0
    missed_from: int | None = None
    missed_until: int | None = None
    first_seen: bool = False


def plan_ticks(
    timing: Timing,
    *,
    cursor: int | None,
    now_ms: int,
    grace_ms: int,
    missed: Missed,
    limit: int = MAX_TICKS_PER_STEP,
) -> Plan:
    """Decide which ticks to enqueue now (see the module docstring for the rules).

    ``cursor`` is the last tick handled (None: never seen), ``now_ms`` the Redis clock.
    """
    if cursor is None:
        last = timing.last_until(now_ms)
        return Plan(cursor=now_ms if last is None else last, first_seen=True)
    first = timing.next_after(cursor)
    if first is None or first > now_ms:
        return Plan()
    out: list[int] = []
    start, n_missed, latest = cursor, 0, None
    edge = now_ms - grace_ms
    if first <= edge:
        latest = timing.last_until(edge)
        assert latest is not None
        n_missed = timing.count(cursor, edge, MAX_TICKS_PER_STEP)
        if missed == "once":
            out.append(latest)
        start = latest
    tick = timing.next_after(start)
    while tick is not None and tick <= now_ms and len(out) < limit:
        out.append(tick)
        tick = timing.next_after(tick)
    return Plan(
        tuple(out), out[-1] if out else start, n_missed, first if n_missed else None, latest
    )
