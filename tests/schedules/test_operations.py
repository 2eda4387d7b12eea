"""Missed ticks after a stop, pause/resume/list, gating by config and lanes, and a scheduler
loop that survives errors and stops promptly."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from streamq import (
    App,
    ConfigurationError,
    Job,
    RegistrationError,
    SchedulerConfig,
    Schedules,
    SyncSchedules,
)
from streamq.hooks import Hooks
from streamq.schedules import Scheduler
from tests.schedules.conftest import MakeManager
from tests.schedules.support import (
    Elsewhere,
    Sched,
    Tick,
    assert_each_tick_once,
    left_in_streams,
    make_app,
    redis_ms,
    tick_of,
    wait_for,
)


class Seen:
    """A processor that records the jobs it ran."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, job: Job[Tick]) -> None:
        self.ids.append(job.id)

    @property
    def ticks(self) -> list[int]:
        return sorted(tick_of(i) for i in self.ids)


def _missed_records(caplog: pytest.LogCaptureFixture, since: float) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if getattr(r, "missed_until_ms", None) is not None and r.created >= since
    ]


# -- missed ticks --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["skip", "once"])
async def test_ticks_missed_while_no_scheduler_ran_are_skipped_or_run_once(
    managers: MakeManager,
    aredis: aioredis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    caplog.set_level(logging.INFO, logger="streamq.scheduler")
    seen = Seen()
    first = managers(make_app(seen, every=0.2, grace=0.4, missed=policy))
    await first.start()
    await wait_for(lambda: len(seen.ids) >= 2, what="ticks before the stop")
    await first.close_workers(timeout_s=1)
    # A tick enqueued just before the stop may still wait in the stream.
    before = set(seen.ticks) | {tick_of(i) for i in await left_in_streams(aredis, prefix)}
    await asyncio.sleep(1.5)  # no scheduler runs: about 7 ticks pass

    restart = time.time()
    second = managers(make_app(seen, every=0.2, grace=0.4, missed=policy))
    await second.start()
    await wait_for(lambda: len(_missed_records(caplog, restart)) >= 1, what="a missed log")
    record = _missed_records(caplog, restart)[0]
    missed_from, missed_until = record.missed_from_ms, record.missed_until_ms  # type: ignore[attr-defined]
    assert missed_from == max(before) + 200
    assert record.missed >= 3  # type: ignore[attr-defined]
    await wait_for(
        lambda: len([t for t in seen.ticks if t > missed_until]) >= 2,
        what="on-time ticks after the restart",
    )
    await second.close_workers(timeout_s=1)

    ticks = sorted([*seen.ticks, *map(tick_of, await left_in_streams(aredis, prefix))])
    in_gap = [t for t in ticks if missed_from <= t <= missed_until]
    after = [t for t in ticks if t > missed_until]
    assert in_gap == ([] if policy == "skip" else [missed_until])
    assert after[0] == missed_until + 200  # the next tick runs: nothing else was skipped
    assert_each_tick_once(after, 200)


async def test_a_schedule_seen_for_the_first_time_starts_with_its_next_tick(
    managers: MakeManager,
    aredis: aioredis.Redis,
) -> None:
    seen = Seen()
    before = await redis_ms(aredis)
    m = managers(make_app(seen, every=0.2, grace=5.0))
    await m.start()
    await wait_for(lambda: len(seen.ids) >= 1, what="a tick")
    assert seen.ticks[0] > before  # the 5 s of grace did not bring back earlier ticks


# -- pause, resume, list -------------------------------------------------------------------


async def test_pause_stops_the_fleet_and_resume_goes_on_without_the_paused_ticks(
    managers: MakeManager,
    aredis: aioredis.Redis,
    prefix: str,
) -> None:
    seen = Seen()
    app = make_app(seen, every=0.2, grace=2.0)
    schedules = Schedules(aredis, app, prefix=prefix)
    (info,) = await schedules.list()
    assert (info.name, info.queue, info.job, info.every, info.cron) == (
        "beat",
        "sched-q",
        "tick",
        timedelta(milliseconds=200),
        None,
    )
    assert (info.paused, info.enabled, info.last_run, info.missed) == (False, True, None, "skip")
    assert info.next_run is not None
    assert info.next_run.timestamp() * 1000 > await redis_ms(aredis) - 50

    replicas = [managers(make_app(seen, every=0.2, grace=2.0)) for _ in range(2)]
    for m in replicas:
        await m.start()
    await wait_for(lambda: len(seen.ids) >= 3, what="ticks before the pause")
    await schedules.pause("beat")
    await asyncio.sleep(0.5)  # a look already under way may still add its tick
    paused_at = len(seen.ids)
    await asyncio.sleep(1.2)
    assert len(seen.ids) == paused_at
    info = await schedules.get("beat")
    assert info.paused
    assert info.next_run is None
    assert info.last_run is not None
    assert int(info.last_run.timestamp() * 1000) == seen.ticks[-1]

    resumed = await redis_ms(aredis)
    await schedules.resume("beat")
    await wait_for(lambda: len(seen.ids) >= paused_at + 3, what="ticks after resume")
    new = seen.ticks[paused_at:]
    assert min(new) > resumed - 200  # the ticks of the pause did not run
    assert_each_tick_once(new, 200)
    assert not (await schedules.get("beat")).paused


def test_sync_schedules_pause_resume_and_list(sredis: redis.Redis, prefix: str) -> None:
    app = App([Sched])
    app.schedule("nightly", Sched.tick, cron="0 3 * * *", timezone="Europe/Berlin")
    app.schedule("often", Sched.other, every=60, enabled=False)
    app.scheduler_config = SchedulerConfig()
    schedules = SyncSchedules(sredis, app, prefix=prefix)
    nightly, often = schedules.list()
    assert (nightly.name, nightly.cron, nightly.timezone) == (
        "nightly",
        "0 3 * * *",
        "Europe/Berlin",
    )
    assert nightly.next_run is not None
    assert (nightly.next_run.hour, nightly.next_run.minute) == (3, 0)
    assert (often.enabled, often.next_run) == (False, None)
    schedules.pause("nightly")
    assert schedules.get("nightly").paused
    schedules.resume("nightly")
    assert not schedules.get("nightly").paused
    with pytest.raises(ConfigurationError, match="no schedule named 'ghost'"):
        schedules.pause("ghost")
    listed = SyncSchedules(
        sredis, app, prefix=prefix, config=SchedulerConfig(disabled=frozenset({"nightly"}))
    ).list()
    assert [i.enabled for i in listed] == [False, False]
    for key in sredis.scan_iter(match=f"{prefix}:*"):
        sredis.delete(key)


# -- gating --------------------------------------------------------------------------------


async def test_config_and_lanes_decide_where_a_schedule_runs(
    managers: MakeManager,
    redis_url: str,
) -> None:
    seen = Seen()
    off = make_app(seen, every=0.2)
    off.scheduler_config = SchedulerConfig(enabled=False)
    one_off = make_app(seen, every=0.2)
    one_off.schedule("second", Sched.other, every=0.2, grace=2.0)
    one_off.scheduler_config = SchedulerConfig(disabled=frozenset({"beat"}))
    not_here = make_app(seen, every=0.2, elsewhere=True)
    await managers(off).start()
    await managers(not_here, queues=[Elsewhere.queue_name]).start()
    m = managers(one_off)
    await m.start()
    await wait_for(lambda: len(seen.ids) >= 3, what="ticks of the enabled schedule")
    assert {i.split(":")[1] for i in seen.ids} == {"second"}
    assert off.scheduler is not None
    assert not_here.scheduler is not None
    assert off.scheduler.counts["enqueued"] == not_here.scheduler.counts["enqueued"] == 0

    bad = make_app(seen, every=0.2)
    assert bad.scheduler is not None
    bad.scheduler.config = SchedulerConfig(disabled=frozenset({"ghost"}))  # bypasses the check
    with pytest.raises(ConfigurationError, match="'ghost'"):
        await managers(bad).start()


async def test_one_app_cannot_run_its_scheduler_in_two_managers_of_one_process(
    managers: MakeManager,
) -> None:
    app = make_app(Seen(), every=0.2)
    await managers(app).start()
    with pytest.raises(RegistrationError, match="already runs in another WorkerManager"):
        await managers(app).start()


# -- robustness ----------------------------------------------------------------------------


class Crashes(Hooks):
    def __init__(self) -> None:
        self.tasks: list[str] = []

    def task_crashed(self, queue: str | None, task: str) -> None:
        self.tasks.append(task)


async def test_a_failing_payload_function_is_logged_retried_and_blocks_no_other_schedule(
    managers: MakeManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="streamq.scheduler")
    seen = Seen()
    calls: list[int] = []

    def flaky(tick: Any) -> Tick:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("database down")
        return Tick(at=tick.isoformat())

    app = make_app(seen, every=0.3, grace=3.0, payload=flaky)
    app.schedule("steady", Sched.other, every=0.2, grace=2.0)
    hooks = Crashes()
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_for(lambda: any(i.startswith("sched:beat:") for i in seen.ids), what="beat")
    await wait_for(
        lambda: sum(i.startswith("sched:steady:") for i in seen.ids) >= 3, what="steady ticks"
    )
    beat = sorted(tick_of(i) for i in seen.ids if i.startswith("sched:beat:"))
    assert_each_tick_once(beat, 300)
    assert app.scheduler is not None
    assert app.scheduler.counts["errors"] == 2
    assert hooks.tasks == ["scheduler", "scheduler"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert "database down" in str(errors[0].exc_info)
    assert any(
        r.levelno == logging.INFO and "enqueued tick" in r.getMessage() for r in caplog.records
    )


async def test_redis_errors_and_bugs_in_the_loop_are_reported_and_it_goes_on(
    managers: MakeManager,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from streamq.schedules.service import _Run

    real = _Run._read
    failures = [redis.ConnectionError("connection reset"), ValueError("a bug")]

    async def read(self: Any, g: Any) -> Any:
        if failures:
            raise failures.pop(0)
        return await real(self, g)

    monkeypatch.setattr(_Run, "_read", read)
    seen = Seen()
    hooks = Crashes()
    app = make_app(seen, every=0.2, grace=2.0)
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_for(lambda: len(seen.ids) >= 2, what="ticks after the errors")
    assert m.redis_status.outages == 1  # the connection error went to the Redis status
    assert m.redis_status.down_since is None  # ...and the next look ended the outage
    assert hooks.tasks == ["scheduler"]  # the bug was counted
    assert any("scheduler task crashed" in r.getMessage() for r in caplog.records)


async def test_close_stops_a_scheduler_sleeping_until_a_distant_tick_at_once(
    managers: MakeManager,
) -> None:
    app = App([Sched])

    @app.processor(Sched)
    async def process(job: Job[Tick]) -> None: ...

    app.schedule("yearly", Sched.tick, cron="0 0 1 1 *")
    m = managers(app)
    await m.start()
    assert isinstance(app.scheduler, Scheduler)
    await asyncio.sleep(0.1)
    began = time.monotonic()
    await app.scheduler.close()
    assert time.monotonic() - began < 0.5
