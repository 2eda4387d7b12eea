"""Pausing, resuming and listing schedules: :class:`Schedules` (asyncio) and its synchronous
twin :class:`SyncSchedules`; every operation is written once, as steps either client drives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from streamq._redis import map_error
from streamq.driver import Cmds, Steps, cmd, drive, drive_sync, is_cluster, text
from streamq.errors import ConfigurationError
from streamq.keys import DEFAULT_PREFIX, QueueKeys
from streamq.schedules.declare import Missed, Schedule, SchedulerConfig
from streamq.schedules.service import Scheduler

__all__ = ["ScheduleInfo", "Schedules", "SyncSchedules"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as the fleet sees it.

    Attributes:
        name, queue, job: the schedule, its queue (primary lane) and job name.
        cron, every: its timing (one of the two is None).
        timezone: the cron expression's time zone (and the ticks' datetimes).
        missed: its missed-tick policy.
        paused: paused in Redis (the whole fleet skips its ticks).
        enabled: enabled in code and by the config given to :class:`Schedules`.
        last_run: the last tick enqueued (None: never).
        next_run: the next tick that will be enqueued (None while paused or disabled).
    """

    name: str
    queue: str
    job: str
    cron: str | None
    every: timedelta | None
    timezone: str
    missed: Missed
    paused: bool
    enabled: bool
    last_run: datetime | None
    next_run: datetime | None


_Infos = list[ScheduleInfo]
_Names = list[str]  # the admin classes' list() method hides the builtin in their scope


class _AppLike(Protocol):
    scheduler: Scheduler | None


def _server_ms(reply: Any) -> int:
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


class _SchedulesCore:
    """State and steps shared by :class:`Schedules` and :class:`SyncSchedules`."""

    def __init__(
        self, client: Any, app: _AppLike | Scheduler, *, prefix: str, config: SchedulerConfig | None
    ) -> None:
        scheduler = app if isinstance(app, Scheduler) else app.scheduler
        self.client = client
        self.schedules: dict[str, Schedule[Any]] = dict(scheduler.schedules) if scheduler else {}
        self.config = config or (scheduler.config if scheduler else SchedulerConfig())
        self.prefix = prefix
        self.cluster = is_cluster(client)

    def time_call(self, key: str) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The client method that reads the clock of ``key``'s node, and its arguments: a
        keyless TIME goes to any node of a cluster."""
        if self.cluster:
            return self.client.time, {"target_nodes": self.client.get_node_from_key(key)}
        return self.client.time, {}

    def get(self, name: str) -> Schedule[Any]:
        s = self.schedules.get(name)
        if s is None:
            declared = ", ".join(sorted(self.schedules)) or "none"
            raise ConfigurationError(f"no schedule named {name!r} (declared: {declared})")
        return s

    def keys(self, s: Schedule[Any]) -> QueueKeys:
        lane = s.contract.primary
        return QueueKeys(self.prefix, lane.name, lane.shards)

    def pause_steps(self, name: str, paused: bool) -> Steps[None]:
        s = self.get(name)
        key, field_ = self.keys(s).schedules, f"{name}:paused"
        yield Cmds([cmd("hset", key, field_, "1") if paused else cmd("hdel", key, field_)])

    def time_key(self, name: str) -> str:
        """The key whose node's clock a listing of ``name`` reads (its state hash)."""
        return self.keys(self.get(name)).schedules

    def list_steps(self, names: list[str], now_ms: Mapping[str, int]) -> Steps[list[ScheduleInfo]]:
        """``now_ms``: the Redis clock per state key (see :meth:`time_key`)."""
        schedules = [self.get(n) for n in names]
        cmds = []
        for s in schedules:
            keys = self.keys(s)
            cmds += [
                cmd("zscore", keys.schedule_ticks, s.name),
                cmd("hmget", keys.schedules, [f"{s.name}:paused", f"{s.name}:last_run"]),
            ]
        reply = yield Cmds(cmds)
        out = []
        for i, s in enumerate(schedules):
            cursor, (paused, last) = reply[2 * i : 2 * i + 2]
            out.append(self._info(s, now_ms[self.keys(s).schedules], cursor, bool(paused), last))
        return out

    def _info(
        self, s: Schedule[Any], now_ms: int, cursor: Any, paused: bool, last: Any
    ) -> ScheduleInfo:
        enabled = s.enabled and self.config.allows(s.name)
        nxt = None
        if enabled and not paused:
            nxt = s.next_after(max(now_ms, int(cursor) if cursor is not None else now_ms))
        last_ms = int(text(last)) if last else None
        return ScheduleInfo(
            name=s.name,
            queue=s.queue,
            job=s.job.name,
            cron=s.cron,
            every=s.every,
            timezone=s.timezone,
            missed=s.missed,
            paused=paused,
            enabled=enabled,
            last_run=None if last_ms is None else s.tick_datetime(last_ms),
            next_run=None if nxt is None else s.tick_datetime(nxt),
        )


class Schedules:
    """Pause, resume and list an app's schedules (asyncio); the state is in Redis, so every
    replica obeys within about a second.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` client.
        app: the app (or its ``Scheduler``) that declares the schedules.
        prefix: key prefix shared with the workers.
        config: the workers' :class:`SchedulerConfig`, for ``enabled`` in listings
            (default: the app's scheduler's).

    Example::

        schedules = Schedules(client, app)
        await schedules.pause("retention")
        for info in await schedules.list():
            print(info.name, info.paused, info.last_run, info.next_run)
    """

    def __init__(
        self,
        client: Any,
        app: _AppLike | Scheduler,
        *,
        prefix: str = DEFAULT_PREFIX,
        config: SchedulerConfig | None = None,
    ) -> None:
        self._core = _SchedulesCore(client, app, prefix=prefix, config=config)

    async def pause(self, name: str) -> None:
        """Pause schedule ``name`` fleet-wide: its ticks pass without a job until resumed."""
        await self._drive(self._core.pause_steps(name, True))

    async def resume(self, name: str) -> None:
        """Resume schedule ``name`` with its next tick (the paused ones do not run)."""
        await self._drive(self._core.pause_steps(name, False))

    async def list(self) -> _Infos:
        """Every declared schedule, by name."""
        return await self._list(sorted(self._core.schedules))

    async def get(self, name: str) -> ScheduleInfo:
        """One schedule; an unknown name raises ``ConfigurationError``."""
        return (await self._list([name]))[0]

    async def _list(self, names: _Names) -> _Infos:
        now: dict[str, int] = {}
        try:
            for key in {self._core.time_key(n) for n in names}:
                method, kwargs = self._core.time_call(key)
                now[key] = _server_ms(await method(**kwargs))
        except Exception as exc:
            raise (map_error(exc, queue="schedules") or exc) from exc
        return await self._drive(self._core.list_steps(names, now))

    async def _drive(self, steps: Steps[_T]) -> _T:
        return await drive(self._core.client, "schedules", steps)


class SyncSchedules:
    """The synchronous twin of :class:`Schedules` (takes a ``redis.Redis`` client)."""

    def __init__(
        self,
        client: Any,
        app: _AppLike | Scheduler,
        *,
        prefix: str = DEFAULT_PREFIX,
        config: SchedulerConfig | None = None,
    ) -> None:
        self._core = _SchedulesCore(client, app, prefix=prefix, config=config)

    def pause(self, name: str) -> None:
        """See :meth:`Schedules.pause`."""
        drive_sync(self._core.client, "schedules", self._core.pause_steps(name, True))

    def resume(self, name: str) -> None:
        """See :meth:`Schedules.resume`."""
        drive_sync(self._core.client, "schedules", self._core.pause_steps(name, False))

    def list(self) -> _Infos:
        """See :meth:`Schedules.list`."""
        return self._list(sorted(self._core.schedules))

    def get(self, name: str) -> ScheduleInfo:
        """See :meth:`Schedules.get`."""
        return self._list([name])[0]

    def _list(self, names: _Names) -> _Infos:
        now: dict[str, int] = {}
        try:
            for key in {self._core.time_key(n) for n in names}:
                method, kwargs = self._core.time_call(key)
                now[key] = _server_ms(method(**kwargs))
        except Exception as exc:
            raise (map_error(exc, queue="schedules") or exc) from exc
        return drive_sync(self._core.client, "schedules", self._core.list_steps(names, now))
