"""Batch processors: lists of jobs gathered up to max_size for at most max_wait, each job
settled on its own (attempts, backoff, dead letter, lock), against a real Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import (
    Backoff,
    Batch,
    JobRequest,
    PermanentError,
    Queue,
    QueueContract,
    RegistrationError,
    Retry,
    job,
)
from streamq.app import App
from streamq.job import Job
from tests.runtime.conftest import MakeManager
from tests.runtime.support import RecordingHooks, dead_entries, keys, pending, wait_until


class Row(BaseModel):
    n: int


class Other(BaseModel):
    s: str


class Rows(QueueContract, name="rt-batch"):
    row = job("row", Row)


async def _add(r: aioredis.Redis, prefix: str, ns: range | list[int]) -> list[str]:
    return await Queue(Rows, r, prefix=prefix).add_bulk([JobRequest(Rows.row, Row(n=n))
                                                         for n in ns])


async def test_jobs_are_gathered_into_batches_of_at_most_max_size(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    sizes: list[int] = []
    seen: list[int] = []

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.2))
    async def proc(jobs: list[Job[Row]]) -> None:
        sizes.append(len(jobs))
        seen.extend(j.payload.n for j in jobs)

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(25))
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(10)
    assert sorted(seen) == list(range(25))
    assert max(sizes) == 10
    assert sum(sizes) == 25
    assert len(sizes) <= 4
    assert hooks.outcomes() == {"completed": 25}


async def test_a_partial_batch_starts_after_max_wait(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    calls: list[tuple[float, int]] = []

    @app.processor(Rows, batch=Batch(max_size=100, max_wait=0.15), block_timeout=0.05)
    async def proc(jobs: list[Job[Row]]) -> None:
        calls.append((time.monotonic(), len(jobs)))

    m = managers(app)
    await m.start()
    t0 = time.monotonic()
    await _add(aredis, prefix, range(3))
    await wait_until(lambda: sum(n for _, n in calls) == 3, what="the 3 jobs")
    assert calls[0][1] == 3, calls
    assert calls[0][0] - t0 >= 0.1  # waited for company...
    assert calls[0][0] - t0 < 3.0  # ...but not for a full batch


async def test_per_job_outcomes_retry_dead_letter_delay_and_complete_in_one_batch(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    runs: list[tuple[int, int]] = []

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.05), attempts=3,
                   backoff=Backoff.fixed(0.05), promote_interval=0.02)
    async def proc(jobs: list[Job[Row]]) -> None:
        for j in jobs:
            runs.append((j.payload.n, j.attempt))
            if j.payload.n == 1 and j.attempt == 1:
                j.fail(RuntimeError("row 1 failed once"))
            elif j.payload.n == 2:
                j.fail(PermanentError("row 2 can never be written"))
            elif j.payload.n == 3 and runs.count((3, 1)) == 1:
                j.fail(Retry(0.05))  # the first run of job 3 asks for a delay

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(5))
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(15)
    out = hooks.outcomes()
    assert out["completed"] == 4  # 0, 4, then 1 (attempt 2) and 3 (after its delay)
    assert out["retried"] == 1
    assert out["delayed"] == 1
    assert out["failed"] == 1
    assert (1, 2) in runs  # retried as attempt 2
    assert [r for r in runs if r[0] == 3] == [(3, 1), (3, 1)]  # Retry spends no attempt
    dead = await dead_entries(aredis, keys(prefix, "rt-batch"))
    assert [(d["reason"], d["id"]) for d in dead] == [("permanent", dead[0]["id"])]
    assert hooks.dead == [("rt-batch", "row", "permanent")]


async def test_a_raising_batch_processor_fails_every_job_by_its_own_attempts(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    calls = 0

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.05), attempts=2,
                   backoff=Backoff.fixed(0.02), promote_interval=0.02)
    def proc(jobs: list[Job[Row]]) -> None:  # sync: runs in the thread pool
        nonlocal calls
        calls += 1
        if all(j.attempt == 1 for j in jobs):
            raise ConnectionError("the store is down")

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(4))
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(15)
    assert hooks.outcomes() == {"retried": 4, "completed": 4}
    assert calls >= 2


async def test_a_batch_past_its_timeout_fails_each_job_as_timeout(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.05), timeout=0.2, attempts=1)
    async def proc(jobs: list[Job[Row]]) -> None:
        await asyncio.sleep(30)

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(3))
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(10)
    assert hooks.outcomes() == {"failed": 3}
    assert sorted(d["reason"] for d in await dead_entries(aredis, keys(prefix, "rt-batch"))) == [
        "timeout"] * 3


async def test_shutdown_past_its_timeout_releases_every_job_of_a_running_batch(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    started = asyncio.Event()

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.05), shutdown_timeout=0.2,
                   lock_duration=30)
    async def proc(jobs: list[Job[Row]]) -> None:
        started.set()
        await asyncio.sleep(60)

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(4))
    m = managers(app, hooks=hooks, consumer_name="leaving")
    await m.start()
    await asyncio.wait_for(started.wait(), 5)
    await m.close_workers()
    assert hooks.outcomes() == {"released": 4}
    sk = keys(prefix, "rt-batch").shards[0]
    assert await pending(aredis, sk) == []
    assert await aredis.xlen(sk.stream) == 4  # handed back for another worker


async def test_a_job_whose_lock_is_lost_mid_batch_is_lock_lost_and_the_rest_complete(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    running, finish = asyncio.Event(), asyncio.Event()

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.1), lock_duration=30,
                   stalled_interval=30)
    async def proc(jobs: list[Job[Row]]) -> None:
        running.set()
        await finish.wait()

    hooks = RecordingHooks()
    await _add(aredis, prefix, range(3))
    m = managers(app, hooks=hooks)
    await m.start()
    await asyncio.wait_for(running.wait(), 5)
    sk = keys(prefix, "rt-batch").shards[0]
    rows = await pending(aredis, sk)
    assert len(rows) == 3
    # Another worker takes one of them over (as after a lock expiry) while the batch runs.
    await aredis.xclaim(sk.stream, "streamq", "thief", 0, [rows[0].entry_id])
    finish.set()
    await wait_until(lambda: len(hooks.finished) == 3, what="3 outcomes")
    assert hooks.outcomes() == {"completed": 2, "lock_lost": 1}
    [(row,)] = [[p for p in await pending(aredis, sk)]]
    assert row.consumer == "thief"


async def test_poison_entries_never_reach_the_batch_processor(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    got: list[int] = []

    @app.processor(Rows, batch=Batch(max_size=10, max_wait=0.1))
    async def proc(jobs: list[Job[Row]]) -> None:
        got.extend(j.payload.n for j in jobs)

    sk = keys(prefix, "rt-batch").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    await _add(aredis, prefix, [1])
    await aredis.xadd(sk.stream, {"due": "", "id": "bad", "name": "row", "payload": "{not json"})
    await _add(aredis, prefix, [2])
    hooks = RecordingHooks()
    m = managers(app, hooks=hooks)
    await m.start()
    await m.run_until_idle(10)
    assert sorted(got) == [1, 2]
    assert hooks.counts["dead:invalid_payload"] == 1


async def test_a_batch_lane_holds_at_most_concurrency_batches_plus_prefetch(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Rows])
    gate = asyncio.Event()
    sizes: list[int] = []

    @app.processor(Rows, batch=Batch(max_size=5, max_wait=0.05), concurrency=2, prefetch=3,
                   block_timeout=0.1)
    async def proc(jobs: list[Job[Row]]) -> None:
        sizes.append(len(jobs))
        await gate.wait()

    await _add(aredis, prefix, range(40))
    m = managers(app, consumer_name="me")
    await m.start()
    await wait_until(lambda: len(sizes) == 2, what="two batches running")
    await asyncio.sleep(0.3)
    sk = keys(prefix, "rt-batch").shards[0]
    assert len(await pending(aredis, sk)) <= 2 * 5 + 3
    gate.set()
    await m.run_until_idle(15)
    w = m.get_worker("rt-batch")
    assert w is not None
    assert w.stats()["peak_held"] <= 13
    assert sum(sizes) == 40


def test_a_batch_processor_must_take_a_list_of_jobs_of_the_whole_queue() -> None:
    app = App([Rows])
    with pytest.raises(RegistrationError, match=r"list\[Job"):
        @app.processor(Rows, batch=Batch(max_size=5))
        async def one(job: Job[Row]) -> None: ...

    with pytest.raises(RegistrationError, match="whole queue"):
        @app.processor(Rows.row, batch=Batch(max_size=5))
        async def per_job(jobs: list[Job[Row]]) -> None: ...

    with pytest.raises(RegistrationError, match="carries Row"):
        @app.processor(Rows, batch=Batch(max_size=5))
        async def wrong(jobs: list[Job[Other]]) -> None: ...

    @app.processor(Rows, batch=Batch(max_size=5))
    async def ok(jobs: list[Job[Row]]) -> Any: ...

    reg = app.registration("rt-batch")
    assert reg is not None
    assert reg.batch == Batch(max_size=5)
