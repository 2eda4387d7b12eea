"""Locks: fencing refuses a stale worker's settle, renewal keeps long jobs owned, and
renewal runs on its own thread so a blocked event loop cannot let a lock expire."""

from __future__ import annotations

import asyncio
import threading
import time

from pydantic import BaseModel

from streamq import Queue, QueueContract, job, ops
from streamq._redis import run_calls
from streamq.app import App
from streamq.job import Job
from streamq.runtime import WorkerManager
from tests.runtime.support import (
    RecordingHooks,
    dead_entries,
    keys,
    pending,
    stream_entries,
    wait_until,
)


class Unit(BaseModel):
    n: int


class Locked(QueueContract, name="rt-locks"):
    unit = job("unit", Unit)


def sk(prefix: str):
    return keys(prefix, "rt-locks").shards[0]


async def test_stale_consumer_late_completion_is_refused_and_left_to_the_new_owner(
    managers, aredis, prefix
):
    app = App([Locked])
    started = asyncio.Event()
    release = asyncio.Event()
    saw_lost: list[bool] = []

    @app.processor(Locked, lock_duration=2, stalled_interval=30)
    async def proc(job: Job[Unit]) -> None:
        started.set()
        await release.wait()
        job.extend_lock()  # renew now: the renewal finds the job gone
        await wait_until(lambda: job.lock_lost, timeout_s=5, what="job.lock_lost")
        saw_lost.append(job.lock_lost)

    hooks = RecordingHooks()
    await Queue(Locked, aredis, prefix=prefix).add(Locked.unit, Unit(n=1))
    m = managers(app, consumer_name="A", hooks=hooks)
    await m.start()
    await asyncio.wait_for(started.wait(), 5)
    (entry,) = await pending(aredis, sk(prefix))
    assert entry.consumer == "A"

    # Consumer B takes the entry over (as after a lock expiry) while A still runs it.
    page = (
        await run_calls(
            aredis,
            [ops.reclaim(sk(prefix), "streamq", "B", min_idle_ms=0, count=10,
                         max_stalled_count=5, dead_cap=0)],
        )
    )[0]
    assert [e.entry_id for e in page.entries] == [entry.entry_id]
    release.set()
    await wait_until(lambda: hooks.counts["lock_lost"] >= 1, what="lock_lost to be counted")
    await wait_until(lambda: m.get_worker("rt-locks").local_idle(), what="A to let go")

    assert saw_lost == [True]
    assert hooks.counts["lock_lost"] == 1
    (after,) = await pending(aredis, sk(prefix))
    assert (after.entry_id, after.consumer, after.deliveries) == (entry.entry_id, "B", 2)
    # Not acknowledged, not deleted: B still has the job to finish.
    assert [eid for eid, _ in await stream_entries(aredis, sk(prefix))] == [entry.entry_id]
    assert await dead_entries(aredis, keys(prefix, "rt-locks")) == []


async def test_renewal_keeps_a_long_job_owned_and_another_manager_does_not_reclaim_it(
    managers, aredis, prefix
):
    app = App([Locked])
    lock_s = 0.6
    runs: list[str] = []
    done = asyncio.Event()

    @app.processor(Locked, lock_duration=lock_s, stalled_interval=0.1)
    async def proc(job: Job[Unit]) -> None:
        runs.append(job.id)
        await asyncio.sleep(3 * lock_s)
        done.set()

    hooks_b = RecordingHooks()
    await Queue(Locked, aredis, prefix=prefix).add(Locked.unit, Unit(n=1))
    # A's own reclaimer stays out of the way: only renewal can keep its lock.
    a = managers(app, consumer_name="A", overrides={"rt-locks": {"stalled_interval": 30}})
    await a.start()
    await wait_until(lambda: len(runs) == 1, what="the job to start")
    b = managers(app, consumer_name="B", hooks=hooks_b)
    await b.start()

    max_idle = 0
    while not done.is_set():
        for row in await pending(aredis, sk(prefix)):
            assert row.consumer == "A"
            max_idle = max(max_idle, row.idle_ms)
        await asyncio.sleep(0.03)
    await a.run_until_idle(5)

    assert max_idle < lock_s * 1000, max_idle
    assert len(runs) == 1
    assert hooks_b.counts["reclaimed"] == 0
    assert hooks_b.counts["started"] == 0


async def test_a_blocked_event_loop_does_not_starve_renewal(managers, aredis, prefix, redis_url):
    app = App([Locked])
    lock_s = 0.6
    runs: list[str] = []

    @app.processor(Locked, lock_duration=lock_s, stalled_interval=0.1)
    async def proc(job: Job[Unit]) -> None:
        runs.append(threading.current_thread().name)
        time.sleep(2 * lock_s)  # CPU-bound or sync code inside async def: the loop is stuck

    # Manager B runs in another thread with its own event loop, ready to reclaim any entry
    # whose lock lapses.
    b_ready = threading.Event()
    b_stop = threading.Event()
    b_hooks = RecordingHooks()
    b_error: list[BaseException] = []

    async def run_b() -> None:
        b = WorkerManager(redis_url=redis_url, prefix=prefix, consumer_name="B", hooks=b_hooks)
        b.register_app(app)
        await b.start()
        b_ready.set()
        try:
            while not b_stop.is_set():
                await asyncio.sleep(0.02)
        finally:
            await b.close_workers(timeout_s=1)

    def thread_b() -> None:
        try:
            asyncio.run(run_b())
        except BaseException as exc:  # surfaced by the assertion below
            b_error.append(exc)
            b_ready.set()

    tb = threading.Thread(target=thread_b, name="manager-b")
    tb.start()
    try:
        assert b_ready.wait(10)
        hooks_a = RecordingHooks()
        await Queue(Locked, aredis, prefix=prefix).add(Locked.unit, Unit(n=1))
        # B may take the job first; either way the job must run exactly once.
        a = managers(app, consumer_name="A", hooks=hooks_a)
        await a.start()
        await wait_until(lambda: len(runs) == 1, what="the job to start")
        await a.run_until_idle(10)
        await asyncio.sleep(3 * 0.1)  # three of B's reclaim rounds after the job finished
    finally:
        b_stop.set()
        tb.join(10)

    assert b_error == []
    assert len(runs) == 1, runs
    assert hooks_a.counts["reclaimed"] + b_hooks.counts["reclaimed"] == 0
    assert hooks_a.counts["lock_lost"] + b_hooks.counts["lock_lost"] == 0
    assert await pending(aredis, sk(prefix)) == []
    assert await dead_entries(aredis, keys(prefix, "rt-locks")) == []

