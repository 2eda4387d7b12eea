"""Queue depth polling, Redis reachability and liveness of a worker process.

Depth is read for the queues this process consumes only, with the same steps as
:meth:`streamq.QueueAdmin.depth` (:func:`streamq.admin.depth_steps`): one snapshot per queue
per poll, plus one ``XRANGE`` per shard that has ready jobs:

- ``in_flight`` = the group's pending count (``XPENDING``): delivered, not settled;
- ``ready`` = ``XLEN - in_flight``: a settled job is acknowledged *and* deleted, so the stream
  holds exactly the jobs ready or in flight;
- ``oldest_ready_age_s`` = server now minus the time part of the first entry after the group's
  ``last-delivered-id`` (``XRANGE (<id> + COUNT 1``): entries after it were never delivered,
  and promoted, retried or released jobs are re-added at the tail with a fresh id, so the id
  time is when the job became ready;
- ``delayed`` = ``ZCARD`` of the delayed set (delayed and retrying jobs), ``dead`` = ``XLEN``
  of the dead-letter stream, ``consumers`` = the group's consumer count.

The queue-wide aggregate (``shard="all"``) sums the counts and takes the largest age and
consumer count (one consumer usually reads every shard, so consumers are not summed).

Liveness (``/healthz``) fails when Redis has been unreachable longer than a timeout, or when a
consumed queue has had ready jobs for longer than the wedge timeout while this process started
none: the silently wedged worker (a stuck dispatcher, every concurrency slot blocked). A
paused queue is never wedged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamq._redis import map_error
from streamq.admin import QueueDepth, ShardDepth, depth_steps
from streamq.driver import drive
from streamq.hooks import Hooks
from streamq.runtime.worker import stop_tasks

if TYPE_CHECKING:
    from streamq.runtime.manager import WorkerManager
    from streamq.runtime.worker import Worker

__all__ = ["ALL_SHARDS", "Monitor", "RedisHealth", "read_depths"]

_log = logging.getLogger("streamq.health")

ALL_SHARDS = "all"

Clock = Callable[[], float]


def aggregate(depth: QueueDepth) -> ShardDepth:
    """The queue-wide reading: counts summed, the largest age and consumer count."""
    return ShardDepth(
        shard=ALL_SHARDS, ready=depth.ready, in_flight=depth.in_flight, delayed=depth.delayed,
        dead=depth.dead, oldest_ready_age_s=depth.oldest_ready_age_s,
        consumers=depth.consumers,
    )


class RedisHealth(Hooks):
    """Whether Redis is reachable: failures from the runtime (``redis_error``) and the poller,
    successes from the poller. Unreachable time counts from the first failure since the last
    success."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.failing_since: float | None = None
        self.last_ok: float | None = None
        self.last_error: str | None = None

    def redis_error(self, queue: str | None, error: BaseException) -> None:
        self.failed(error)

    def ok(self) -> None:
        self.failing_since = None
        self.last_ok = self.clock()

    def failed(self, error: BaseException) -> None:
        self.last_error = f"{type(error).__name__}: {error}"[:300]
        if self.failing_since is None:
            self.failing_since = self.clock()

    def unreachable_for(self) -> float:
        """Seconds since Redis started failing; 0 while it answers."""
        return 0.0 if self.failing_since is None else self.clock() - self.failing_since


async def read_depths(w: Worker) -> QueueDepth:
    """Depth of ``w``'s lane, read as :meth:`streamq.QueueAdmin.depth` reads it.

    Raises whatever the Redis client raises (the caller counts it as a failure).
    """
    return await drive(w.client, w.name, depth_steps(w.client, w.keys, w.group))


@dataclass(slots=True)
class _WedgeWatch:
    ready: int = 0
    ready_since: float | None = None
    paused: bool = False


class Monitor:
    """Polls depth, tracks Redis reachability, measures event-loop lag, judges liveness.

    Args:
        manager: the started (or starting) worker manager whose queues are watched.
        hooks: receives ``queue_depth`` and ``event_loop_lag`` readings.
        health: the Redis reachability tracker (also fed by the runtime's ``redis_error``).
        interval_s: seconds between polls.
        redis_timeout_s: liveness fails once Redis has been unreachable this long.
        wedge_timeout_s: liveness fails once ready jobs waited this long with none started.
    """

    def __init__(
        self,
        manager: WorkerManager,
        hooks: Hooks,
        health: RedisHealth,
        *,
        interval_s: float,
        redis_timeout_s: float,
        wedge_timeout_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self.manager = manager
        self.hooks = hooks
        self.health = health
        self.interval_s = interval_s
        self.redis_timeout_s = redis_timeout_s
        self.wedge_timeout_s = wedge_timeout_s
        self.clock = clock
        self.polls = 0
        self._watch: dict[str, _WedgeWatch] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._poll_loop(), name="streamq-depth-poller"),
            loop.create_task(self._lag_loop(), name="streamq-loop-lag"),
        ]

    async def close(self) -> None:
        # A single cancel() may be swallowed by a Redis call in poll_once (see stop_tasks).
        await stop_tasks(self._tasks)
        self._tasks = []

    async def _poll_loop(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def _lag_loop(self) -> None:
        interval = min(self.interval_s, 1.0)
        while True:
            t0 = self.clock()
            await asyncio.sleep(interval)
            self.hooks.event_loop_lag(max(0.0, self.clock() - t0 - interval))

    async def poll_once(self) -> None:
        """Read every consumed queue's depth once and publish it."""
        workers = self.manager.workers
        try:
            if not workers:
                return
            for w in workers:
                self._publish(w, await read_depths(w))
            self.health.ok()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.health.failed(exc)
            if map_error(exc) is None:
                # Not Redis: a bug. Say so loudly; the loop goes on polling.
                self.hooks.task_crashed(None, "depth-poller")
                _log.error("depth poll failed", exc_info=exc)
            else:
                _log.debug("depth poll failed", extra={"error": repr(exc)})
        finally:
            self.polls += 1

    def _publish(self, w: Worker, depth: QueueDepth) -> None:
        for d in depth.shards:
            self._emit(w.name, d.shard, d)
        total = aggregate(depth)
        paused = depth.paused
        self._emit(w.name, ALL_SHARDS, total)
        watch = self._watch.setdefault(w.name, _WedgeWatch())
        watch.ready, watch.paused = total.ready, paused
        if total.ready and not paused:
            if watch.ready_since is None:
                watch.ready_since = self.clock()
        else:
            watch.ready_since = None

    def _emit(self, queue: str, shard: str, d: ShardDepth) -> None:
        self.hooks.queue_depth(
            queue,
            shard,
            ready=d.ready,
            delayed=d.delayed,
            in_flight=d.in_flight,
            dead=d.dead,
            oldest_ready_age_s=d.oldest_ready_age_s,
            consumers=d.consumers,
        )

    # -- judgements ------------------------------------------------------------------------
    def wedged(self) -> list[str]:
        """One problem per queue that has ready jobs but started none for the wedge timeout."""
        now = self.clock()
        problems = []
        for w in self.manager.workers:
            watch = self._watch.get(w.name)
            if watch is None or watch.ready_since is None or w.closing:
                continue
            idle = now - max(watch.ready_since, w.last_started)
            if idle > self.wedge_timeout_s:
                problems.append(
                    f"queue {w.name!r} has {watch.ready} ready jobs but this worker started "
                    f"none for {idle:.1f} s (active {w.active}/{w.options.concurrency})"
                )
        for w in self.manager.workers:
            # Held but not progressing: fetched entries wait while slots are free. This
            # catches a stuck dispatcher even when peers drained the queue (no ready jobs).
            stuck = w.wedged_for(now)
            if stuck > self.wedge_timeout_s:
                problems.append(
                    f"queue {w.name!r}: this worker holds {w.stats()['buffered']} fetched jobs "
                    f"and has free slots but started none for {stuck:.1f} s"
                )
        return problems

    def redis_problems(self) -> list[str]:
        problems = []
        down = self.health.unreachable_for()
        if down > self.redis_timeout_s:
            problems.append(f"Redis unreachable for {down:.1f} s ({self.health.last_error})")
        status = self.manager.redis_status
        if status.refusal is not None:
            # Retrying cannot fix it: fail at once and say what Redis said.
            problems.append(f"Redis refuses the worker's calls: {status.refusal}")
        out = status.unreachable_for()
        if out > self.redis_timeout_s and down <= self.redis_timeout_s:
            problems.append(f"Redis calls of the runtime failing for {out:.1f} s "
                            f"({status.last_error})")
        return problems

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        problems = self.redis_problems() + self.wedged()
        return not problems, {"problems": problems, **self._summary()}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        problems = []
        if not self.manager.started or not self.manager.workers:
            problems.append("workers not started")
        if self.health.failing_since is not None:
            problems.append(f"Redis unreachable ({self.health.last_error})")
        elif self.health.last_ok is None:
            problems.append("Redis not reached yet")
        return not problems, {"problems": problems, **self._summary()}

    def _summary(self) -> dict[str, Any]:
        now = self.clock()
        queues = {}
        for w in self.manager.workers:
            watch = self._watch.get(w.name, _WedgeWatch())
            queues[w.name] = {
                **w.stats(),
                "ready": watch.ready,
                "paused": watch.paused,
                "since_last_start_s": round(now - w.last_started, 3),
            }
        return {"queues": queues, "redis_unreachable_s": round(self.health.unreachable_for(), 3)}
