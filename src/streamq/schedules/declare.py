"""Declaring a schedule: :class:`Schedule` (made by :meth:`streamq.App.schedule`) and the
:class:`SchedulerConfig` a worker process runs it under."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ValidationError

from streamq.contracts import JobSpec, QueueContract
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError
from streamq.keys import NAME_RE
from streamq.schedules.ticks import Cron, Every, Missed, Plan, ms_to_datetime, plan_ticks

__all__ = [
    "MIN_DEDUP_WINDOW_MS",
    "Missed",
    "PayloadFactory",
    "Schedule",
    "SchedulerConfig",
    "flag_name",
]

P = TypeVar("P", bound=BaseModel)

PayloadFactory = Callable[[datetime], P | Awaitable[P]] | Callable[[], P | Awaitable[P]]
"""Builds a tick's payload; called with the tick (a datetime in the schedule's time zone)
or with nothing, sync or async."""

MIN_DEDUP_WINDOW_MS = 60_000
"""The shortest dedup window a scheduled job's contract may have. A replica that read a tick
as due and then stalled for longer than the window before its add would add it a second time."""
MIN_EVERY_MS = 100
DEFAULT_GRACE_MS = 30_000
"""How late a tick may be seen and still run as on time, unless ``grace`` is given; never
more than an ``every`` schedule's interval."""


def flag_name(name: str) -> str:
    """The variable that enables schedule ``name`` in ``python -m worker``:
    ``SCHEDULE_<NAME>_IS_ENABLED`` (upper case, ``-`` as ``_``)."""
    return f"SCHEDULE_{name.upper().replace('-', '_')}_IS_ENABLED"


class Schedule(Generic[P]):
    """One periodic job: made by :meth:`streamq.App.schedule`, which documents the arguments.

    Raises:
        ConfigurationError: a malformed name, cron expression, interval, time zone, payload
            or policy; a job that belongs to no contract, or whose contract's dedup window
            is shorter than :data:`MIN_DEDUP_WINDOW_MS`.
    """

    def __init__(
        self,
        name: str,
        job: JobSpec[P],
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str = "UTC",
        payload: P | Mapping[str, Any] | PayloadFactory[P] | None = None,
        missed: Missed = "skip",
        grace: Duration | None = None,
        enabled: bool = True,
    ) -> None:
        if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 100:
            raise ConfigurationError(
                f"schedule name {name!r} is invalid: use lowercase letters, digits and "
                "single '-' (at most 100 characters)"
            )
        if not isinstance(job, JobSpec) or job.queue is None:
            raise ConfigurationError(
                f"schedule {name!r}: {job!r} is not a job of a queue contract "
                "(pass e.g. Maintenance.retention)"
            )
        self.name = name
        self.job: JobSpec[P] = job
        self.contract: type[QueueContract] = job.queue
        self.queue = job.queue.primary.name
        try:
            self.tz = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise self._error(f"unknown time zone {timezone!r}") from exc
        self.timezone = timezone
        self.cron = cron
        self.every: timedelta | None = None
        self._timing = self._make_timing(cron, every)
        if missed not in ("skip", "once"):
            raise self._error(f"missed must be 'skip' or 'once', got {missed!r}")
        self.missed: Missed = missed
        if grace is None:
            cap = self._timing.ms if isinstance(self._timing, Every) else DEFAULT_GRACE_MS
            self.grace_ms = min(DEFAULT_GRACE_MS, cap)
        else:
            self.grace_ms = to_ms(grace, f"schedule {name!r}: grace", minimum=0)
        self.enabled = bool(enabled)
        window = job.queue.defaults.dedup_window_ms
        if window < MIN_DEDUP_WINDOW_MS:
            raise self._error(
                f"queue {self.queue!r} has a dedup window of {window} ms; a scheduled job "
                f"needs at least {MIN_DEDUP_WINDOW_MS} ms so that replicas cannot enqueue a "
                "tick twice (JobDefaults(dedup_window=...))"
            )
        self._payload: BaseModel | None = None
        self._factory: Callable[..., Any] | None = None
        self._takes_tick = False
        self._set_payload(payload)

    def _error(self, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"schedule {self.name!r}: {why}", queue=self.queue, job=self.job.name
        )

    def _make_timing(self, cron: str | None, every: Duration | None) -> Every | Cron:
        if (cron is None) == (every is None):
            raise self._error("give exactly one of cron= and every=")
        if every is not None:
            ms = to_ms(every, f"schedule {self.name!r}: every", minimum=MIN_EVERY_MS)
            self.every = timedelta(milliseconds=ms)
            return Every(ms)
        if not isinstance(cron, str):
            raise self._error(f"cron must be a string, got {cron!r}")
        try:
            CronSim(cron, datetime.now(self.tz))
        except CronSimError as exc:
            raise self._error(f"invalid cron expression {cron!r}: {exc}") from exc
        timing = Cron(cron, self.tz)
        if timing.next_after(int(time.time() * 1000)) is None:
            raise self._error(f"cron expression {cron!r} never fires")
        return timing

    def _set_payload(self, payload: Any) -> None:
        if payload is None or isinstance(payload, BaseModel | Mapping):
            try:
                if isinstance(payload, self.job.model):
                    self._payload = payload
                elif isinstance(payload, BaseModel):
                    raise self._error(
                        f"payload is a {type(payload).__name__}, job {self.job.name!r} takes "
                        f"{self.job.model.__name__}"
                    )
                else:
                    self._payload = self.job.model.model_validate(payload or {})
            except ValidationError as exc:
                raise self._error(f"invalid payload: {exc.errors()[0]['msg']}") from exc
            return
        if not callable(payload):
            raise self._error(f"payload must be a model, a mapping or a function, got {payload!r}")
        try:
            params = list(inspect.signature(payload).parameters.values())
        except (TypeError, ValueError):
            params = []
        required = [
            p
            for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(required) > 1:
            raise self._error("a payload function takes the tick (a datetime) or nothing")
        self._factory = payload
        self._takes_tick = bool(required) or any(p.kind is p.VAR_POSITIONAL for p in params)

    @property
    def flag_name(self) -> str:
        """Its ``python -m worker`` flag: ``SCHEDULE_<NAME>_IS_ENABLED``."""
        return flag_name(self.name)

    def job_id(self, tick_ms: int) -> str:
        """The job id of the tick at ``tick_ms``: the same on every replica."""
        return f"sched:{self.name}:{tick_ms}"

    def tick_datetime(self, tick_ms: int) -> datetime:
        """A tick as an aware datetime in the schedule's time zone."""
        return ms_to_datetime(tick_ms, self.tz)

    def next_after(self, ms: int) -> int | None:
        """The first tick after ``ms`` (None when the cron expression never fires again)."""
        return self._timing.next_after(ms)

    def last_until(self, ms: int) -> int | None:
        """The latest tick at or before ``ms``."""
        return self._timing.last_until(ms)

    def plan(self, *, cursor: int | None, now_ms: int) -> Plan:
        """:func:`plan_ticks` with this schedule's timing, grace and policy."""
        return plan_ticks(
            self._timing, cursor=cursor, now_ms=now_ms, grace_ms=self.grace_ms, missed=self.missed
        )

    async def payload_for(self, tick_ms: int) -> BaseModel | Mapping[str, Any]:
        """The payload of the tick at ``tick_ms`` (a factory runs on the event loop: keep a
        sync one quick, or make it async)."""
        if self._factory is None:
            assert self._payload is not None
            return self._payload
        result = self._factory(self.tick_datetime(tick_ms)) if self._takes_tick else self._factory()
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        when = f"cron={self.cron!r}" if self.cron else f"every={self.every}"
        return f"Schedule({self.name!r}, {self.queue}/{self.job.name}, {when})"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which schedules this process runs: the entry point builds it from
    ``SCHEDULER_IS_ENABLED`` and ``SCHEDULE_<NAME>_IS_ENABLED`` (see docs/schedules.md).

    Attributes:
        enabled: run the scheduler at all.
        disabled: names of schedules not to run here (unknown names fail the start).
    """

    enabled: bool = True
    disabled: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        """Whether schedule ``name`` may run in this process."""
        return self.enabled and name not in self.disabled
