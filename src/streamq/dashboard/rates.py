"""Job rates of the last minutes, sampled by the dashboard process from Redis's own counters.

Redis keeps, per stream, the number of entries ever added (``XINFO STREAM``'s
``entries-added``, Redis 7.0+), whatever was deleted since. A settled job is acknowledged
*and* deleted, so per shard:

* **in** = entries added to the stream: new jobs, due delayed jobs, retries, released jobs;
* **out** = entries added minus the stream's length: entries that left the stream, i.e. runs
  that settled (completed, retried, dead-lettered or handed back at shutdown);
* **dead** = entries added to the dead-letter stream.

:class:`RateSampler` reads these counters for every lane every ``interval_s`` (one pipelined
round trip per lane) and keeps the samples of the last ``window_s``; a rate is the growth
between the oldest and the newest sample kept, per minute. The counters live in Redis, so a
restarted dashboard shows rates again after two samples, and several dashboards agree. A
counter that went down (a stream deleted and re-created) starts the window afresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from streamq.contracts import Lane
from streamq.driver import Cmds, Steps, cmd, drive, text
from streamq.keys import QueueKeys
from streamq.runtime.worker import stop_tasks

__all__ = ["Counters", "RateSampler", "Rates"]

_log = logging.getLogger("streamq.dashboard")


@dataclass(frozen=True, slots=True)
class Counters:
    """A lane's cumulative counters, all shards summed (see the module docstring)."""

    added: int
    removed: int
    dead_added: int


@dataclass(frozen=True, slots=True)
class Rates:
    """Jobs per minute over ``window_s`` seconds (the span of the samples used)."""

    in_per_min: float
    out_per_min: float
    dead_per_min: float
    window_s: float


def _info_field(reply: Any, name: str) -> int | None:
    if isinstance(reply, ResponseError) and "no such key" in str(reply).lower():
        return 0
    if isinstance(reply, Exception):
        raise reply
    fields = {text(k): v for k, v in (reply or {}).items()}
    value = fields.get(name)
    return None if value is None else int(value)


def counters_steps(keys: QueueKeys) -> Steps[Counters | None]:
    """Read a lane's counters; None when Redis does not count entries added (before 7.0)."""
    cmds = []
    for s in keys.shards:
        cmds += [cmd("xinfo_stream", s.stream), cmd("xinfo_stream", s.dead)]
    reply = yield Cmds(cmds, raise_on_error=False)
    added = removed = dead = 0
    for i in range(len(keys.shards)):
        stream, dead_stream = reply[2 * i], reply[2 * i + 1]
        a = _info_field(stream, "entries-added")
        d = _info_field(dead_stream, "entries-added")
        if a is None or d is None:
            return None
        length = _info_field(stream, "length") or 0
        added += a
        removed += a - length
        dead += d
    return Counters(added, removed, dead)


class RateSampler:
    """Samples every lane's counters on a task of its own; :meth:`rates` answers from memory.

    Args:
        client: an asyncio Redis client.
        lanes: the lanes to sample.
        prefix: the key prefix.
        interval_s: seconds between samples.
        window_s: how far back rates look.
    """

    def __init__(
        self,
        client: Any,
        lanes: list[Lane],
        *,
        prefix: str,
        interval_s: float = 10.0,
        window_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = {lane.name: QueueKeys(prefix, lane.name, lane.shards) for lane in lanes}
        self.interval_s = interval_s
        self.window_s = window_s
        self.clock = clock
        self.samples: dict[str, deque[tuple[float, Counters]]] = {n: deque() for n in self.keys}
        self.unsupported = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sampling on the running loop (again after :meth:`close`); idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="streamq-dashboard-rates"
            )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # One cancel() can be swallowed by a Redis call (see stop_tasks).
            await stop_tasks([task])

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an outage: the pages say so; keep sampling
                _log.warning("rate sample failed", extra={"error": repr(exc)[:300]})
            await asyncio.sleep(self.interval_s)

    async def sample_once(self) -> None:
        """Read every lane's counters once and keep them."""
        for name, keys in self.keys.items():
            counters = await drive(self.client, name, counters_steps(keys))
            if counters is None:
                self.unsupported = True
                return
            self.add(name, self.clock(), counters)

    def add(self, lane: str, at: float, counters: Counters) -> None:
        samples = self.samples[lane]
        if samples and (
            counters.added < samples[-1][1].added or counters.dead_added < samples[-1][1].dead_added
        ):
            samples.clear()
        samples.append((at, counters))
        while len(samples) > 2 and at - samples[1][0] >= self.window_s:
            samples.popleft()

    def rates(self, lane: str) -> Rates | None:
        """The lane's rates, or None until two samples are a second or more apart."""
        samples = self.samples.get(lane)
        if not samples or len(samples) < 2:
            return None
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        span = t1 - t0
        if span < 1.0:
            return None
        per_min = 60.0 / span
        return Rates(
            in_per_min=(c1.added - c0.added) * per_min,
            out_per_min=(c1.removed - c0.removed) * per_min,
            dead_per_min=(c1.dead_added - c0.dead_added) * per_min,
            window_s=span,
        )
