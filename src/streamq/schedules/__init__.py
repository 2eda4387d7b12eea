"""Schedules: periodic jobs declared on the app, enqueued once per tick by the whole fleet.

Example::

    app.schedule("retention", Maintenance.retention, cron="0 3 * * *",
                 timezone="Europe/Berlin", payload=Retention(days=30), missed="skip")
    app.schedule("metering", Maintenance.meter, every=timedelta(minutes=5),
                 payload=lambda tick: Meter(at=tick.isoformat()))

How a tick becomes exactly one job, whatever the number of replicas:

* Every worker process that consumes a schedule's queue (its contract's primary lane) runs
  the :class:`Scheduler` service. Ticks are read on the Redis server's clock (``TIME``), never
  the host's, so a replica with a skewed clock enqueues neither early nor late.
* A tick's job id is ``sched:<name>:<tick, ms since the epoch>``. Every replica that finds a
  tick due adds it under that id; the dedup marker lets the first add through and makes the
  others duplicates (the contract's dedup window must be at least
  :data:`MIN_DEDUP_WINDOW_MS`).
* A cursor in Redis, the last tick handled per schedule, only ever raised (``ZADD GT``), tells
  every replica which ticks are done: one that starts or wakes late never adds them again,
  even after their dedup markers expired.

A tick is *on time* while it is at most ``grace`` old: every on-time tick is enqueued (a
scheduler that woke late catches up). Older ticks were *missed* (no scheduler ran):
``missed="skip"`` passes over them, ``missed="once"`` enqueues one job for the missed period,
under the latest missed tick's id. A schedule the fleet sees for the first time starts with
its next tick; a paused one moves its cursor on without enqueueing, so resuming never runs
the ticks of the pause.

:class:`Schedules` (asyncio) and :class:`SyncSchedules` pause, resume and list schedules;
the flags live in Redis, so the whole fleet obeys them.
"""

from streamq.schedules.admin import ScheduleInfo, Schedules, SyncSchedules
from streamq.schedules.declare import (
    MIN_DEDUP_WINDOW_MS,
    Missed,
    PayloadFactory,
    Schedule,
    SchedulerConfig,
    flag_name,
)
from streamq.schedules.service import Scheduler
from streamq.schedules.ticks import Plan, plan_ticks

__all__ = [
    "MIN_DEDUP_WINDOW_MS",
    "Missed",
    "PayloadFactory",
    "Plan",
    "Schedule",
    "ScheduleInfo",
    "Scheduler",
    "SchedulerConfig",
    "Schedules",
    "SyncSchedules",
    "flag_name",
    "plan_ticks",
]
