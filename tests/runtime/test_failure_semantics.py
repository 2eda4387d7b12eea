"""DESIGN.md §6, one test per row: what happens to a job for each way its run can end."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import (
    Backoff,
    JobTimeout,
    PermanentError,
    Queue,
    QueueContract,
    RateLimited,
    Retry,
    job,
)
from streamq.app import App
from streamq.envelope import FIELD_NAMES
from streamq.job import Job
from tests.runtime.support import (
    RecordingHooks,
    dead_entries,
    keys,
    pending,
    server_ms,
    wait_until,
)


class Item(BaseModel):
    n: int


class Note(BaseModel):
    text: str


class Fail(QueueContract, name="rt-fail"):
    item = job("item", Item)
    note = job("note", Note)


FAST: dict[str, Any] = {"lock_duration": 2, "promote_interval": 0.02}


def qk(prefix: str):
    return keys(prefix, "rt-fail")


async def drained(r: aioredis.Redis, prefix: str) -> bool:
    sk = qk(prefix).shards[0]
    return (
        await r.xlen(sk.stream) == 0
        and await r.zcard(sk.delayed) == 0
        and await pending(r, sk) == []
    )


async def test_exception_is_retried_with_backoff_until_attempts_then_dead_lettered(
    managers, aredis, prefix
):
    app = App([Fail])
    runs: list[tuple[int, int]] = []

    @app.processor(Fail, attempts=3, backoff=Backoff.fixed(0.1), **FAST)
    async def proc(job: Job[Any]) -> None:
        runs.append((job.attempt, await server_ms(aredis)))
        raise ValueError(f"bad thing {job.payload.n}")

    hooks = RecordingHooks()
    job_id = await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=42), job_id="j-42")
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: hooks.counts["dead:error"] == 1, what="the dead letter")
    await m.run_until_idle(5)

    assert [a for a, _ in runs] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(runs)]
    assert all(g >= 100 for g in gaps), gaps
    (dead,) = await dead_entries(aredis, qk(prefix))
    assert dead["reason"] == "error"
    assert dead["error_type"] == "ValueError"
    assert dead["error"] == "bad thing 42"
    tb = dead["traceback"].splitlines()
    assert 1 < len(tb) <= 8
    assert tb[-1] == "ValueError: bad thing 42"
    assert any('raise ValueError(f"bad thing' in line for line in tb)
    assert dead["attempts"] == "3"
    assert dead["worker"] == m.consumer
    assert dead["queue"] == "rt-fail"
    assert abs(int(dead["failed_at"]) - runs[-1][1]) < 2000
    # The original envelope travels with it: the job's id, name, payload and last attempt.
    assert (dead["id"], dead["name"], dead["attempt"]) == (job_id, "item", "3")
    assert json.loads(dead["payload"]) == {"n": 42}
    assert set(FIELD_NAMES) <= set(dead)
    assert [e["attempt"] for e in json.loads(dead["baggage"])["errors"]] == [1, 2]
    assert [o for _, o, _ in hooks.finished] == ["retried", "retried", "failed"]
    assert await drained(aredis, prefix)


async def test_permanent_error_is_dead_lettered_at_once_after_one_run(managers, aredis, prefix):
    app = App([Fail])
    runs = 0

    @app.processor(Fail, attempts=5, **FAST)
    async def proc(job: Job[Any]) -> None:
        nonlocal runs
        runs += 1
        raise PermanentError("project was deleted")

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: hooks.counts["dead:permanent"] == 1, what="the dead letter")
    await m.run_until_idle(5)

    assert runs == 1
    (dead,) = await dead_entries(aredis, qk(prefix))
    assert (dead["reason"], dead["error_type"], dead["error"], dead["attempts"]) == (
        "permanent", "PermanentError", "project was deleted", "1"
    )
    assert dead["attempt"] == "1"
    assert dead["baggage"] == ""
    assert await drained(aredis, prefix)


def raw_entry(**overrides: str) -> dict[str, str]:
    """A hand-written stream entry, as a foreign or broken producer would write it."""
    fields = {
        "due": "", "id": "raw-1", "name": "item", "ts": "1", "attempt": "1",
        "payload": '{"n": 1}', "baggage": "", "trace": "",
    }
    fields.update(overrides)
    return fields


async def run_poison(managers, aredis, prefix, *entries: dict[str, str]):
    """Write ``entries`` raw, then one valid job; run until the valid one ran."""
    app = App([Fail])
    ran: list[Any] = []

    @app.processor(Fail, attempts=3, **FAST)
    async def proc(job: Job[Any]) -> None:
        ran.append(job.payload)

    sk = qk(prefix).shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    for e in entries:
        await aredis.xadd(sk.stream, e)
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=99))
    hooks = RecordingHooks()
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(5)
    return ran, hooks, await dead_entries(aredis, qk(prefix))


async def test_invalid_payload_is_dead_lettered_never_run_and_the_worker_goes_on(
    managers, aredis, prefix
):
    ran, hooks, dead = await run_poison(
        managers, aredis, prefix,
        raw_entry(id="bad-json", payload="{not json"),
        raw_entry(id="bad-type", payload='{"n": "not a number"}'),
        raw_entry(id="bad-shape", name="note", payload='{"n": 1}'),
    )

    assert ran == [Item(n=99)]
    assert [(d["id"], d["reason"], d["error_type"], d["attempts"]) for d in dead] == [
        ("bad-json", "invalid_payload", "InvalidPayload", "0"),
        ("bad-type", "invalid_payload", "InvalidPayload", "0"),
        ("bad-shape", "invalid_payload", "InvalidPayload", "0"),
    ]
    assert "field(s) n" in dead[1]["error"]
    assert "field(s) text" in dead[2]["error"]
    assert dead[0]["payload"] == "{not json"
    assert hooks.counts["dead:invalid_payload"] == 3
    assert await drained(aredis, prefix)


async def test_unknown_job_name_is_dead_lettered_never_run(managers, aredis, prefix):
    ran, hooks, dead = await run_poison(
        managers, aredis, prefix, raw_entry(id="ghost", name="from-a-newer-producer")
    )

    assert ran == [Item(n=99)]
    (d,) = dead
    assert (d["id"], d["name"], d["reason"], d["attempts"]) == (
        "ghost", "from-a-newer-producer", "unknown_job", "0"
    )
    assert "no processor for job 'from-a-newer-producer'" in d["error"]
    assert hooks.counts["dead:unknown_job"] == 1
    assert await drained(aredis, prefix)


async def test_declared_job_without_a_processor_is_dead_lettered_as_unknown(
    managers, aredis, prefix
):
    app = App([Fail])
    ran: list[int] = []

    @app.processor(Fail.item, **FAST)
    async def only_items(job: Job[Item]) -> None:
        ran.append(job.payload.n)

    q = Queue(Fail, aredis, prefix=prefix)
    await q.add(Fail.note, Note(text="nobody handles me"), job_id="n1")
    await q.add(Fail.item, Item(n=1))
    m = managers(app)
    await m.start()
    await m.run_until_idle(5)

    assert ran == [1]
    (d,) = await dead_entries(aredis, qk(prefix))
    assert (d["id"], d["reason"]) == ("n1", "unknown_job")


async def test_entry_missing_envelope_fields_is_dead_lettered_as_invalid_payload(
    managers, aredis, prefix
):
    broken = raw_entry(id="no-ts")
    del broken["ts"]
    ran, _hooks, dead = await run_poison(
        managers, aredis, prefix, {"hello": "world"}, broken, raw_entry(id="", name="item")
    )

    assert ran == [Item(n=99)]
    assert [d["reason"] for d in dead] == ["invalid_payload"] * 3
    assert dead[0]["hello"] == "world"  # the foreign entry is kept as it was written
    assert "field 'id' is missing" in dead[0]["error"]
    assert "field 'ts' is missing" in dead[1]["error"]
    assert "field 'id' is missing" in dead[2]["error"]
    assert await drained(aredis, prefix)


@pytest.mark.parametrize("control", [Retry, RateLimited])
async def test_retry_and_rate_limited_re_delay_the_job_without_spending_an_attempt(
    managers, aredis, prefix, control
):
    app = App([Fail])
    runs: list[tuple[int, int, Any]] = []

    # One attempt only: a spent attempt would dead-letter the job.
    @app.processor(Fail, attempts=1, **FAST)
    async def proc(job: Job[Any]) -> None:
        runs.append((job.attempt, await server_ms(aredis), job.retry_baggage))
        if len(runs) < 3:
            raise control(0.3)

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: len(runs) == 3, what="three runs")
    await m.run_until_idle(5)

    assert [a for a, _, _ in runs] == [1, 1, 1]
    assert [b for _, _, b in runs] == [None, None, None]
    starts = [t for _, t, _ in runs]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(300 <= g < 300 + 500 for g in gaps), gaps
    assert [o for _, o, _ in hooks.finished] == ["delayed", "delayed", "completed"]
    assert await dead_entries(aredis, qk(prefix)) == []
    assert await drained(aredis, prefix)


async def test_async_job_timeout_cancels_the_run_and_dead_letters_as_timeout(
    managers, aredis, prefix
):
    app = App([Fail])
    cancelled: list[int] = []
    baggage: list[Any] = []

    @app.processor(Fail, attempts=2, timeout=0.2, backoff=Backoff.fixed(0.02), **FAST)
    async def proc(job: Job[Any]) -> None:
        baggage.append(job.retry_baggage)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.attempt)
            raise

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: hooks.counts["dead:timeout"] == 1, what="the timeout dead letter")

    assert cancelled == [1, 2]
    assert [(o, type(e)) for _, o, e in hooks.finished] == [
        ("retried", JobTimeout), ("failed", JobTimeout)
    ]
    assert baggage[1]["errors"][0]["type"] == "JobTimeout"
    (d,) = await dead_entries(aredis, qk(prefix))
    assert (d["reason"], d["error_type"], d["attempts"]) == ("timeout", "JobTimeout", "2")


async def test_sync_job_timeout_abandons_the_thread_and_dead_letters_as_timeout(
    managers, aredis, prefix
):
    app = App([Fail])
    started: list[int] = []
    finished: list[int] = []
    release = threading.Event()

    @app.processor(Fail, attempts=2, timeout=0.2, backoff=Backoff.fixed(0.02), **FAST)
    def proc(job: Job[Any]) -> None:
        started.append(job.attempt)
        release.wait(10)  # a sync call that cannot be interrupted
        finished.append(job.attempt)

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    try:
        await wait_until(lambda: hooks.counts["dead:timeout"] == 1, what="the dead letter")
        # Both attempts timed out while their threads were still blocked: abandoned, not
        # waited for.
        assert started == [1, 2]
        assert finished == []
        assert [o for _, o, _ in hooks.finished] == ["retried", "failed"]
        (d,) = await dead_entries(aredis, qk(prefix))
        assert (d["reason"], d["error_type"]) == ("timeout", "JobTimeout")
        assert "abandoned" in d["error"]
    finally:
        release.set()
    await wait_until(lambda: len(finished) == 2, what="abandoned threads to end")
    await asyncio.sleep(0.05)
    # Their late return changed nothing.
    assert len(await dead_entries(aredis, qk(prefix))) == 1
    assert await drained(aredis, prefix)


async def test_a_timeout_error_raised_by_the_processor_is_an_ordinary_error(
    managers, aredis, prefix
):
    app = App([Fail])

    @app.processor(Fail, attempts=1, timeout=5, **FAST)
    async def proc(job: Job[Any]) -> None:
        raise TimeoutError("upstream took too long")

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: len(hooks.dead) == 1, what="the dead letter")

    (d,) = await dead_entries(aredis, qk(prefix))
    assert (d["reason"], d["error_type"], d["error"]) == (
        "error", "TimeoutError", "upstream took too long"
    )


# -- backoff policies -----------------------------------------------------------------------


async def failure_gaps(managers, aredis, prefix, backoff: Any, attempts: int) -> list[int]:
    """Run one always-failing job; ms (server clock) from each failure to the next run."""
    app = App([Fail])
    marks: list[tuple[str, int]] = []

    @app.processor(Fail, attempts=attempts, backoff=backoff, **FAST)
    async def proc(job: Job[Any]) -> None:
        marks.append(("start", await server_ms(aredis)))
        marks.append(("fail", await server_ms(aredis)))
        raise RuntimeError("again")

    hooks = RecordingHooks()
    await Queue(Fail, aredis, prefix=prefix).add(Fail.item, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: len(hooks.dead) == 1, what="the dead letter")
    fails = [t for k, t in marks if k == "fail"]
    starts = [t for k, t in marks if k == "start"]
    return [s - f for f, s in zip(fails, starts[1:], strict=False)]


SLACK_MS = 250  # promote interval (20 ms) plus scheduling


async def test_fixed_backoff_waits_the_same_delay_before_every_attempt(managers, aredis, prefix):
    gaps = await failure_gaps(managers, aredis, prefix, Backoff.fixed(0.15), attempts=3)
    assert len(gaps) == 2
    assert all(150 <= g < 150 + SLACK_MS for g in gaps), gaps


async def test_exponential_backoff_doubles_within_its_jitter_bounds(managers, aredis, prefix):
    policy = Backoff.exponential(0.1, jitter=0.5)
    gaps = await failure_gaps(managers, aredis, prefix, policy, attempts=3)
    assert len(gaps) == 2
    assert 50 <= gaps[0] < 150 + SLACK_MS, gaps
    assert 100 <= gaps[1] < 300 + SLACK_MS, gaps
    # The policy itself: base * 2**(attempt-1), +/- jitter, capped.
    samples = [policy.delay_for(3) for _ in range(300)]
    assert min(samples) >= 200
    assert max(samples) <= 600
    assert len(set(samples)) > 10
    capped = Backoff.exponential(0.1, max_delay=0.5, jitter=0)
    assert [capped.delay_for(a) for a in range(1, 6)] == [100, 200, 400, 500, 500]


async def test_callable_backoff_gets_the_failed_attempt_number(managers, aredis, prefix):
    asked: list[int] = []

    def policy(attempt: int) -> float:
        asked.append(attempt)
        return 0.1 * attempt

    gaps = await failure_gaps(managers, aredis, prefix, policy, attempts=3)
    assert asked == [1, 2]
    assert 100 <= gaps[0] < 100 + SLACK_MS, gaps
    assert 200 <= gaps[1] < 200 + SLACK_MS, gaps


async def test_sync_job_waits_for_a_thread_rather_than_time_out_without_running(
    managers, aredis, prefix
):
    app = App([Fail])
    release = threading.Event()
    ran: list[int] = []

    # Concurrency 1 gives a pool of 5 threads: five hung jobs take them all.
    @app.processor(Fail, concurrency=1, attempts=1, timeout=0.1, **FAST)
    def proc(job: Job[Any]) -> None:
        if job.payload.n < 5:
            release.wait(10)
        else:
            ran.append(job.payload.n)

    hooks = RecordingHooks()
    q = Queue(Fail, aredis, prefix=prefix)
    for n in range(6):
        await q.add(Fail.item, Item(n=n))
    m = managers(app, hooks=hooks)
    await m.start()
    try:
        await wait_until(lambda: hooks.counts["dead:timeout"] == 5, what="five abandoned jobs")
        await asyncio.sleep(0.3)  # three of its timeouts: it must not fail before it runs
        assert hooks.counts["dead:timeout"] == 5
        assert ran == []
    finally:
        release.set()
    await m.run_until_idle(5)
    assert ran == [5]
    assert len(await dead_entries(aredis, qk(prefix))) == 5
