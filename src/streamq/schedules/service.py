"""The scheduler service: runs in every worker process that consumes a schedule's queue and
enqueues each due tick, once across the fleet (see :mod:`streamq.schedules`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamq._redis import map_error
from streamq.driver import is_cluster
from streamq.errors import (
    ConfigurationError,
    RedisOutOfMemory,
    RedisRefused,
    RedisUnavailable,
    RegistrationError,
)
from streamq.hooks import CompositeHooks, Hooks
from streamq.keys import QueueKeys
from streamq.producer import Queue
from streamq.schedules.declare import Schedule, SchedulerConfig
from streamq.schedules.ticks import MAX_TICKS_PER_STEP

if TYPE_CHECKING:  # services import the runtime, which imports the app, which imports this
    from streamq.services import ServiceContext

__all__ = ["Scheduler"]

_log = logging.getLogger("streamq.scheduler")

MAX_SLEEP_S = 1.0
"""The longest the scheduler sleeps between two looks: pauses, resumes and other replicas'
progress are seen within about a second."""
MAX_BACKOFF_S = 5.0
CLOSE_TIMEOUT_S = 2.0


class Scheduler:
    """The service that enqueues an app's schedules; :meth:`App.schedule` makes one per app
    (``app.scheduler``) and adds it to the app's services.

    Attributes:
        schedules: name -> :class:`Schedule`.
        config: set it before the worker starts (``app.scheduler.config = ...``).
        counts: ``enqueued``, ``duplicate`` (another replica had added the tick), ``missed``
            and ``errors``, for this process.
    """

    name = "scheduler"

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.schedules: dict[str, Schedule[Any]] = {}
        self.config = config or SchedulerConfig()
        self.counts: Counter[str] = Counter()
        self._run: _Run | None = None

    def configure(self, config: SchedulerConfig) -> None:
        """Set :attr:`config`, refusing one that disables a schedule not declared.

        Raises:
            ConfigurationError: ``config.disabled`` names an undeclared schedule.
        """
        unknown = sorted(set(config.disabled) - set(self.schedules))
        if unknown:
            raise ConfigurationError(
                f"no schedule is declared as {', '.join(map(repr, unknown))} "
                f"(declared: {', '.join(sorted(self.schedules)) or 'none'})"
            )
        self.config = config

    def add(self, schedule: Schedule[Any]) -> None:
        """Add ``schedule``; a second one of the same name raises ``RegistrationError``."""
        if schedule.name in self.schedules:
            raise RegistrationError(
                f"a schedule named {schedule.name!r} is already declared", queue=schedule.queue
            )
        if self._run is not None:
            raise RegistrationError(
                "declare schedules before the worker starts", queue=schedule.queue
            )
        self.schedules[schedule.name] = schedule

    def runs_here(self, lanes: Iterable[str]) -> list[Schedule[Any]]:
        """The schedules a process consuming ``lanes`` runs under the current config."""
        lanes = set(lanes)
        return [
            s
            for s in self.schedules.values()
            if s.enabled and self.config.allows(s.name) and s.queue in lanes
        ]

    async def start(self, ctx: ServiceContext) -> None:
        if self._run is not None:
            raise RegistrationError(
                "this app's scheduler already runs in another WorkerManager of this process; "
                "give each manager an App of its own"
            )
        self.configure(self.config)  # it may have been assigned directly
        if not self.config.enabled:
            _log.info("scheduler disabled by its config; no schedule runs in this process")
            return
        chosen = self.runs_here(ctx.lanes)
        if not chosen:
            _log.info(
                "no schedule runs in this process (their queues are not consumed here, "
                "or they are disabled)",
                extra={"schedules": sorted(self.schedules)},
            )
            return
        self._run = _Run(ctx, chosen, self.counts)
        self._run.start()
        _log.info("scheduler started", extra={"schedules": [s.name for s in chosen]})

    async def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            await run.close()


class _Outcome(Hooks):
    """Learns whether an add wrote its job or met its dedup marker: the producer tells its
    hooks, not its caller."""

    def __init__(self) -> None:
        self.added: bool | None = None

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        self.added = True

    def enqueue_duplicate(self, queue: str, shard: str, job_name: str) -> None:
        self.added = False


@dataclass(slots=True)
class _Group:
    """The schedules of one queue: its state keys and a producer for it."""

    keys: QueueKeys
    queue: Queue[Any]
    schedules: list[Schedule[Any]]


class _Run:
    """One running scheduler: its loop and what it needs, for one worker process."""

    def __init__(
        self, ctx: ServiceContext, schedules: list[Schedule[Any]], counts: Counter[str]
    ) -> None:
        self.ctx = ctx
        self.counts = counts
        self.outcome = _Outcome()
        hooks = CompositeHooks([ctx.hooks, self.outcome])
        groups: dict[str, _Group] = {}
        for s in schedules:
            g = groups.get(s.queue)
            if g is None:
                lane = s.contract.primary
                g = groups[s.queue] = _Group(
                    QueueKeys(ctx.prefix, lane.name, lane.shards),
                    Queue(s.contract, ctx.client, prefix=ctx.prefix, hooks=hooks),
                    [],
                )
            g.schedules.append(s)
        self.groups = list(groups.values())
        self.cluster = is_cluster(ctx.client)
        self.closing = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.retry_at: dict[str, float] = {}
        self.failures: Counter[str] = Counter()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="scheduler")

    async def close(self) -> None:
        self.closing.set()
        task, self.task = self.task, None
        if task is None:
            return
        # A look in progress is a few round trips: let it finish, then stop it all the same.
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        backoff = 0.05
        while not self.closing.is_set():
            try:
                wait_s = await self._look()
                backoff = 0.05
            except Exception as exc:
                self._report(exc)
                wait_s = backoff * random.uniform(0.5, 1.5)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), timeout=wait_s)

    def _report(self, exc: Exception) -> None:
        mapped = map_error(exc)
        if isinstance(mapped, RedisUnavailable | RedisOutOfMemory | RedisRefused):
            self.ctx.status.error(None, exc, task="scheduler")
            return
        self.counts["errors"] += 1
        self.ctx.hooks.task_crashed(None, "scheduler")
        _log.error(
            "scheduler task crashed; restarting it", exc_info=exc, extra={"task": "scheduler"}
        )

    async def _look(self) -> float:
        """Enqueue what is due; return how long to sleep until the next tick."""
        wake_s = MAX_SLEEP_S
        for g in self.groups:
            now_ms, state = await self._read(g)
            self.ctx.status.ok()
            for s in g.schedules:
                cursor, paused = state[s.name]
                retry_in = self.retry_at.get(s.name, 0.0) - time.monotonic()
                if retry_in > 0:
                    wake_s = min(wake_s, retry_in)
                    continue
                try:
                    more = await self._handle(g, s, cursor, paused, now_ms)
                except Exception as exc:
                    self._failed(s, exc)
                    continue
                self.failures.pop(s.name, None)
                nxt = s.next_after(now_ms)
                if more:
                    wake_s = 0.0  # a catch-up longer than one look goes on at once
                elif nxt is not None:
                    wake_s = min(wake_s, (nxt - now_ms) / 1000 + 0.002)
        return max(wake_s, 0.005)

    async def _now_ms(self, key: str) -> int:
        client = self.ctx.client
        # On a cluster, the clock of the node holding the queue's schedule state.
        sec, usec = await client.time(target_nodes=client.get_node_from_key(key))
        return int(sec) * 1000 + int(usec) // 1000

    async def _read(self, g: _Group) -> tuple[int, dict[str, tuple[int | None, bool]]]:
        names = [s.name for s in g.schedules]
        pipe = self.ctx.client.pipeline(transaction=False)
        if not self.cluster:
            pipe.time()
        pipe.zmscore(g.keys.schedule_ticks, names)
        pipe.hmget(g.keys.schedules, [f"{n}:paused" for n in names])
        reply = await pipe.execute()
        if self.cluster:
            now_ms = await self._now_ms(g.keys.schedules)
        else:
            sec, usec = reply.pop(0)
            now_ms = int(sec) * 1000 + int(usec) // 1000
        cursors, paused = reply
        return now_ms, {
            n: (None if c is None else int(c), bool(p))
            for n, c, p in zip(names, cursors, paused, strict=True)
        }

    async def _handle(
        self, g: _Group, s: Schedule[Any], cursor: int | None, paused: bool, now_ms: int
    ) -> bool:
        """Look at one schedule; True when more ticks than one look takes are due."""
        if paused:
            # The ticks of a pause are handled without a job: resuming never runs them.
            last = s.last_until(now_ms)
            if last is not None and (cursor is None or last > cursor):
                await self._advance(g, s, last, ran=False)
            return False
        plan = s.plan(cursor=cursor, now_ms=now_ms)
        if plan.first_seen:
            _log.debug(
                "schedule %r seen for the first time; it starts with its next tick",
                s.name,
                extra={"schedule": s.name, "queue": s.queue},
            )
        if plan.missed and plan.missed_from is not None and plan.missed_until is not None:
            self.counts["missed"] += plan.missed
            _log.info(
                "schedule %r: %s%d tick(s) from %s to %s were missed (no scheduler ran); %s",
                s.name,
                "at least " if plan.missed >= MAX_TICKS_PER_STEP else "",
                plan.missed,
                s.tick_datetime(plan.missed_from).isoformat(),
                s.tick_datetime(plan.missed_until).isoformat(),
                "running once for them" if s.missed == "once" else "skipped",
                extra={
                    "schedule": s.name,
                    "queue": s.queue,
                    "missed": plan.missed,
                    "missed_from_ms": plan.missed_from,
                    "missed_until_ms": plan.missed_until,
                },
            )
        for tick in plan.enqueue:
            await self._enqueue(g, s, tick)
        if plan.cursor is not None:
            await self._advance(g, s, plan.cursor, ran=bool(plan.enqueue))
        return len(plan.enqueue) >= MAX_TICKS_PER_STEP

    async def _enqueue(self, g: _Group, s: Schedule[Any], tick: int) -> None:
        payload = await s.payload_for(tick)
        job_id = s.job_id(tick)
        self.outcome.added = None
        await g.queue.add(s.job, payload, job_id=job_id)
        extra = {"schedule": s.name, "queue": s.queue, "job_id": job_id, "tick_ms": tick}
        at = s.tick_datetime(tick).isoformat()
        if self.outcome.added is False:
            self.counts["duplicate"] += 1
            _log.debug(
                "schedule %r: tick %s was already enqueued by another replica",
                s.name,
                at,
                extra=extra,
            )
        else:
            self.counts["enqueued"] += 1
            _log.info("schedule %r: enqueued tick %s as job %s", s.name, at, job_id, extra=extra)

    async def _advance(self, g: _Group, s: Schedule[Any], tick: int, *, ran: bool) -> None:
        pipe = self.ctx.client.pipeline(transaction=False)
        pipe.zadd(g.keys.schedule_ticks, {s.name: tick}, gt=True)
        if ran:
            pipe.hset(g.keys.schedules, f"{s.name}:last_run", tick)
        await pipe.execute()

    def _failed(self, s: Schedule[Any], exc: Exception) -> None:
        if isinstance(map_error(exc), RedisUnavailable | RedisOutOfMemory | RedisRefused):
            raise exc
        self.failures[s.name] += 1
        delay = min(0.1 * 2 ** (self.failures[s.name] - 1), MAX_BACKOFF_S)
        self.retry_at[s.name] = time.monotonic() + delay
        self.counts["errors"] += 1
        self.ctx.hooks.task_crashed(s.queue, "scheduler")
        _log.error(
            "schedule %r: could not enqueue its tick; trying again in %.1f s",
            s.name,
            delay,
            exc_info=exc,
            extra={"schedule": s.name, "queue": s.queue},
        )
