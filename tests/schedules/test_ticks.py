"""Tick computation, the missed-tick policy and schedule declarations (no Redis)."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import (
    App,
    ConfigurationError,
    JobDefaults,
    QueueContract,
    RegistrationError,
    Schedule,
    SchedulerConfig,
    job,
)
from streamq.contracts import JobSpec
from streamq.keys import QueueKeys
from streamq.schedules import Scheduler, flag_name, plan_ticks
from tests.schedules.support import Sched, Tick

BERLIN = "Europe/Berlin"


def ms(*args: int, tz: Any = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc]


def utc(ms_: int) -> datetime:
    return datetime.fromtimestamp(ms_ / 1000, tz=UTC)


def cron(expr: str, tz: str = "UTC") -> Schedule[Tick]:
    return Schedule("c", Sched.tick, cron=expr, timezone=tz)


def every(value: Any, **kw: Any) -> Schedule[Tick]:
    return Schedule("e", Sched.tick, every=value, **kw)


def forward(s: Schedule[Any], start: int, until: int) -> list[int]:
    out, t = [], s.next_after(start)
    while t is not None and t <= until:
        out.append(t)
        t = s.next_after(t)
    return out


# -- ticks ---------------------------------------------------------------------------------


def test_interval_ticks_fall_on_multiples_of_the_interval_since_the_epoch() -> None:
    s = every(timedelta(minutes=5))
    at = ms(2024, 5, 1, 10, 2, 30)
    assert s.next_after(at) == ms(2024, 5, 1, 10, 5)
    assert s.last_until(at) == ms(2024, 5, 1, 10, 0)
    assert s.next_after(ms(2024, 5, 1, 10, 5)) == ms(2024, 5, 1, 10, 10)  # strictly after
    assert s.last_until(ms(2024, 5, 1, 10, 5)) == ms(2024, 5, 1, 10, 5)  # at or before
    assert every(0.2).next_after(1_000_050) == 1_000_200


def test_cron_ticks_follow_the_time_zone_summer_and_winter() -> None:
    s = cron("0 3 * * *", BERLIN)
    assert utc(s.next_after(ms(2024, 7, 1)) or 0) == datetime(2024, 7, 1, 1, 0, tzinfo=UTC)
    assert utc(s.next_after(ms(2024, 1, 10)) or 0) == datetime(2024, 1, 10, 2, 0, tzinfo=UTC)
    tick = s.tick_datetime(ms(2024, 7, 1, 1, 0))
    assert (tick.hour, tick.utcoffset()) == (3, timedelta(hours=2))


def test_cron_on_the_spring_forward_day_runs_a_skipped_time_right_after_the_change() -> None:
    s = cron("30 2 * * *", BERLIN)  # 02:30 does not exist on 2024-03-31 in Berlin
    ticks = forward(s, ms(2024, 3, 30, 12), ms(2024, 4, 1, 12))
    assert [utc(t) for t in ticks] == [
        datetime(2024, 3, 31, 1, 0, tzinfo=UTC),  # 03:00 CEST, right after the change
        datetime(2024, 4, 1, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]


def test_cron_on_the_fall_back_day_runs_a_fixed_time_once_and_hourly_ticks_in_order() -> None:
    daily = cron("30 2 * * *", BERLIN)  # 02:30 happens twice on 2024-10-27 in Berlin
    ticks = forward(daily, ms(2024, 10, 26, 12), ms(2024, 10, 28, 12))
    assert [utc(t) for t in ticks] == [
        datetime(2024, 10, 27, 0, 30, tzinfo=UTC),
        datetime(2024, 10, 28, 1, 30, tzinfo=UTC),
    ]
    half_hourly = cron("*/30 * * * *", BERLIN)
    ticks = forward(half_hourly, ms(2024, 10, 26, 23), ms(2024, 10, 27, 3))
    assert ticks == sorted(set(ticks))
    assert all(b - a == 1_800_000 for a, b in itertools.pairwise(ticks))
    assert len({half_hourly.job_id(t) for t in ticks}) == len(ticks)


@pytest.mark.parametrize("expr", ["30 2 * * *", "*/30 * * * *", "0 * * * *", "15 1-3 * * *"])
@pytest.mark.parametrize("day", [(2024, 3, 31), (2024, 10, 27)])
def test_the_latest_tick_before_a_time_agrees_with_walking_forward_across_dst(
    expr: str, day: tuple[int, int, int]
) -> None:
    s = cron(expr, BERLIN)
    start = ms(*day) - 30 * 3_600_000
    ticks = forward(s, start, start + 60 * 3_600_000)
    assert len(ticks) >= 3
    rng = random.Random(7)
    points = [*ticks, *(t - 1 for t in ticks[1:])]
    points += [rng.randrange(ticks[0], ticks[-1]) for _ in range(200)]
    for at in points:
        expected = max(t for t in ticks if t <= at)
        assert s.last_until(at) == expected, (expr, utc(at))


def test_job_ids_are_the_schedule_name_and_the_tick() -> None:
    s = Schedule("nightly-export", Sched.tick, every=60)
    assert s.job_id(1_700_000_040_000) == "sched:nightly-export:1700000040000"
    assert s.flag_name == "SCHEDULE_NIGHTLY_EXPORT_IS_ENABLED" == flag_name("nightly-export")


# -- the missed-tick policy ----------------------------------------------------------------

E = every(1)  # ticks every 1000 ms


def plan(cursor: int | None, now: int, *, grace: int = 500, missed: str = "skip") -> Any:
    return plan_ticks(
        E._timing,
        cursor=cursor,
        now_ms=now,
        grace_ms=grace,  # type: ignore[arg-type]
        missed=missed,
    )  # type: ignore[arg-type]


def test_a_schedule_seen_the_first_time_starts_with_its_next_tick() -> None:
    p = plan(None, 10_300)
    assert (p.enqueue, p.cursor, p.first_seen) == ((), 10_000, True)


def test_nothing_is_due_before_the_next_tick() -> None:
    assert plan(10_000, 10_999).enqueue == ()
    assert plan(10_000, 10_999).cursor is None
    assert plan(12_000, 10_500).enqueue == ()  # a cursor ahead of the clock waits for it


def test_an_on_time_tick_is_enqueued_and_a_late_loop_catches_up_within_grace() -> None:
    assert plan(10_000, 11_002).enqueue == (11_000,)
    p = plan(10_000, 13_100, grace=2_500)
    assert (p.enqueue, p.cursor, p.missed) == ((11_000, 12_000, 13_000), 13_000, 0)


def test_missed_skip_passes_over_ticks_older_than_grace() -> None:
    p = plan(10_000, 20_300, grace=200, missed="skip")
    assert p.enqueue == ()
    assert (p.cursor, p.missed, p.missed_from, p.missed_until) == (20_000, 10, 11_000, 20_000)
    p = plan(10_000, 20_300, grace=500, missed="skip")
    assert p.enqueue == (20_000,)  # 300 ms late: still on time
    assert (p.cursor, p.missed, p.missed_until) == (20_000, 9, 19_000)


def test_missed_once_runs_one_job_for_the_missed_period_under_its_latest_tick() -> None:
    p = plan(10_000, 20_300, grace=200, missed="once")
    assert (p.enqueue, p.cursor, p.missed) == ((20_000,), 20_000, 10)
    p = plan(10_000, 20_300, grace=500, missed="once")
    assert (p.enqueue, p.cursor, p.missed) == ((19_000, 20_000), 20_000, 9)


def test_catch_up_is_bounded_per_look() -> None:
    p = plan_ticks(
        E._timing,
        cursor=0,
        now_ms=10_000,
        grace_ms=60_000,
        missed="skip",  # type: ignore[arg-type]
        limit=4,
    )
    assert (p.enqueue, p.cursor) == ((1_000, 2_000, 3_000, 4_000), 4_000)


# -- payloads ------------------------------------------------------------------------------


async def test_a_static_payload_or_mapping_is_checked_at_declaration() -> None:
    assert await every(1, payload=Tick(at="x")).payload_for(0) == Tick(at="x")
    assert await every(1, payload={"at": "y"}).payload_for(0) == Tick(at="y")
    assert await every(1).payload_for(0) == Tick()

    class Other(BaseModel):
        at: str = ""

    with pytest.raises(ConfigurationError, match="takes Tick"):
        every(1, payload=Other())
    with pytest.raises(ConfigurationError, match="invalid payload"):
        every(1, payload={"at": ["not", "a", "string"]})


async def test_a_payload_factory_gets_the_tick_sync_or_async_or_nothing() -> None:
    s = every(60, timezone=BERLIN, payload=lambda tick: Tick(at=tick.isoformat()))
    assert await s.payload_for(ms(2024, 7, 1, 1)) == Tick(at="2024-07-01T03:00:00+02:00")

    async def later(tick: datetime) -> Tick:
        return Tick(at=str(tick.minute))

    assert await every(60, payload=later).payload_for(ms(2024, 7, 1, 1, 5)) == Tick(at="5")
    assert await every(60, payload=lambda: Tick(at="z")).payload_for(0) == Tick(at="z")
    with pytest.raises(ConfigurationError, match="takes the tick"):
        every(60, payload=lambda a, b: Tick())


# -- declarations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({}, "exactly one of cron= and every="),
        ({"cron": "0 3 * * *", "every": 60}, "exactly one"),
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 0.05}, "at least 100 ms"),
        ({"every": 60, "missed": "all"}, "'skip' or 'once'"),
        ({"every": 60, "payload": 42}, "payload must be"),
    ],
)
def test_malformed_schedules_are_refused_at_declaration(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Schedule("s", Sched.tick, **kw)


def test_names_jobs_and_dedup_windows_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="name 'Bad_Name' is invalid"):
        Schedule("Bad_Name", Sched.tick, every=60)
    with pytest.raises(ConfigurationError, match="not a job of a queue contract"):
        Schedule("s", JobSpec("loose", Tick), every=60)

    class Short(QueueContract, name="sched-short", defaults=JobDefaults(dedup_window=1)):
        tick = job("tick", Tick)

    with pytest.raises(ConfigurationError, match="dedup window of 1000 ms"):
        Schedule("s", Short.tick, every=60)


def test_default_grace_is_30_s_but_never_more_than_the_interval() -> None:
    assert every(5).grace_ms == 5_000
    assert every(3600).grace_ms == 30_000
    assert cron("* * * * *").grace_ms == 30_000
    assert every(5, grace=timedelta(seconds=12)).grace_ms == 12_000


def test_app_schedule_adds_one_scheduler_service_and_refuses_a_taken_name() -> None:
    app = App([Sched])
    assert app.scheduler is None
    assert app.schedules == {}
    a = app.schedule("a", Sched.tick, every=60)
    app.schedule("b", Sched.other, cron="0 3 * * *", timezone=BERLIN)
    assert isinstance(app.scheduler, Scheduler)
    assert app.services.count(app.scheduler) == 1
    assert len(app.services) == 1
    assert app.schedules == {"a": a, "b": app.schedules["b"]}
    with pytest.raises(RegistrationError, match="already declared"):
        app.schedule("a", Sched.tick, every=30)


def test_the_scheduler_config_refuses_names_not_declared() -> None:
    app = App([Sched])
    with pytest.raises(ConfigurationError, match="'ghost'"):
        app.scheduler_config = SchedulerConfig(disabled=frozenset({"ghost"}))
    app.schedule("a", Sched.tick, every=60)
    app.scheduler_config = SchedulerConfig(disabled=frozenset({"a"}))
    assert app.scheduler_config.disabled == {"a"}
    assert not app.scheduler_config.allows("a")
    assert SchedulerConfig().allows("a")
    assert not SchedulerConfig(enabled=False).allows("a")


def test_schedule_state_keys_share_the_queue_hash_tag() -> None:
    qk = QueueKeys("p", "sched-q", 4)
    assert qk.schedules == "p:{sched-q}:schedules"
    assert qk.schedule_ticks == "p:{sched-q}:schedule-ticks"
    assert {k.split(":")[1] for k in (qk.meta, qk.schedules, qk.schedule_ticks)} == {"{sched-q}"}
