"""``Queue.cancel``: waiting and delayed jobs are removed atomically, running ones are asked
to stop and end ``cancelled`` (acked, removed, never retried or dead-lettered), and a cancel
racing with the start neither loses a job nor runs it twice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from streamq import Backoff, JobCancelled, Queue, SyncQueue
from streamq.app import App
from streamq.hooks import CompositeHooks
from streamq.job import Job
from streamq.metrics import PrometheusHooks
from tests.jobcontrol.support import FAST, Ctl, Item, qkeys
from tests.runtime.support import RecordingHooks, pending, wait_until


async def _drained(r: Any, prefix: str) -> bool:
    for sk in qkeys(prefix).shards:
        if await r.xlen(sk.stream) or await r.zcard(sk.delayed) or await pending(r, sk):
            return False
    return True


async def test_cancel_removes_a_waiting_job_so_it_never_runs(managers, aredis, prefix):
    app = App([Ctl])
    ran: list[int] = []

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> None:
        ran.append(job.payload.n)

    q = Queue(Ctl, aredis, prefix=prefix)
    doomed = await q.add(Ctl.tracked, Item(n=1), keep_result=timedelta(minutes=1))
    kept = await q.add(Ctl.tracked, Item(n=2))

    done = await q.cancel(doomed)
    assert (done.outcome, done.detail, done.queue) == ("removed", "waiting", "jc")
    st = await q.status(doomed)
    assert (st.state, st.reason) == ("cancelled", "cancelled")
    m = managers(app)
    await m.start()
    await wait_until(lambda: ran == [2], what="the other job")
    await m.run_until_idle(5)
    assert ran == [2]
    assert (await q.cancel(doomed)).outcome == "finished"
    assert (await q.status(kept)).state == "unknown"
    assert (await q.cancel(kept)).outcome == "unknown"


async def test_cancel_removes_a_delayed_job_and_its_record(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1), delay=timedelta(minutes=5))

    done = await q.cancel(job_id)
    assert (done.outcome, done.detail) == ("removed", "delayed")
    for sk in qkeys(prefix).shards:
        assert await aredis.zcard(sk.delayed) == 0
        assert await aredis.hlen(sk.jobs) == 0
        assert await aredis.hlen(sk.tracked) == 0
    # Tracked without keep_result: no final record either.
    assert (await q.status(job_id)).state == "unknown"


async def test_cancel_of_a_running_async_job_cancels_it_and_reports_cancelled(
    managers, aredis, prefix
):
    app = App([Ctl])
    started = asyncio.Event()
    cleaned_up = asyncio.Event()
    runs = 0

    @app.processor(Ctl, attempts=3, **FAST)
    async def proc(job: Job[Any]) -> None:
        nonlocal runs
        runs += 1
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            assert job.cancel_requested
            cleaned_up.set()
            raise

    registry = CollectorRegistry()
    hooks = RecordingHooks()
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app, hooks=CompositeHooks([hooks, PrometheusHooks(registry)]))
    await m.start()
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()

    done = await q.cancel(job_id)
    assert (done.outcome, done.detail) == ("requested", m.consumer)
    assert (await q.status(job_id)).cancel_requested
    await asyncio.wait_for(cleaned_up.wait(), 10)

    async def cancelled() -> bool:
        return (await q.status(job_id)).state == "cancelled"

    await wait_until(cancelled, what="the cancelled record")
    assert time.monotonic() - t0 < 8  # seen with a renewal (every 0.5 s), not a lock expiry
    await m.run_until_idle(5)
    assert runs == 1
    assert [o for _, o, _ in hooks.finished] == ["cancelled"]
    assert hooks.dead == []
    assert await _drained(aredis, prefix)
    assert registry.get_sample_value(
        "streamq_jobs_cancelled_total", {"queue": "jc", "shard": hooks.finished[0][0].shard,
                                         "job": "summed"}) == 1


async def test_cancel_of_a_running_sync_job_sets_cancel_requested(managers, aredis, prefix):
    app = App([Ctl])
    started = threading.Event()
    seen = threading.Event()

    @app.processor(Ctl, **FAST)
    def proc(job: Job[Any]) -> None:
        started.set()
        deadline = time.monotonic() + 30
        while not job.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.set()
        raise RuntimeError("stopped on request")

    hooks = RecordingHooks()
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1), keep_result=60)
    m = managers(app, hooks=hooks)
    await m.start()
    await asyncio.to_thread(started.wait, 10)
    assert (await q.cancel(job_id)).outcome == "requested"
    assert await asyncio.to_thread(seen.wait, 10)
    await m.run_until_idle(5)
    st = await q.status(job_id)
    # It raised after the request: cancelled, not retried and not dead-lettered.
    assert (st.state, st.reason) == ("cancelled", "cancelled")
    assert [o for _, o, _ in hooks.finished] == ["cancelled"]
    assert await _drained(aredis, prefix)


async def test_a_job_that_completes_despite_a_cancel_request_is_completed(
    managers, aredis, prefix
):
    app = App([Ctl])
    started = threading.Event()
    go = threading.Event()

    @app.processor(Ctl, **FAST)
    def proc(job: Job[Any]) -> dict[str, int]:
        started.set()
        go.wait(10)
        return {"total": 5}

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app)
    await m.start()
    await asyncio.to_thread(started.wait, 10)
    assert (await q.cancel(job_id)).outcome == "requested"
    go.set()
    assert (await q.result(job_id, timeout=10)).total == 5
    assert (await q.status(job_id)).state == "completed"


async def test_cancel_racing_with_start_neither_loses_nor_runs_a_job_twice(
    managers, aredis, prefix
):
    app = App([Ctl])
    runs: Counter[str] = Counter()

    @app.processor(Ctl, concurrency=8, attempts=1, **FAST)
    async def proc(job: Job[Any]) -> dict[str, int]:
        runs[job.id] += 1
        await asyncio.sleep(0.002 * (job.payload.n % 5))
        return {"total": job.payload.n}

    q = Queue(Ctl, aredis, prefix=prefix)
    ids = [await q.add(Ctl.summed, Item(n=i)) for i in range(120)]
    m = managers(app)
    await m.start()
    outcomes = {}
    for job_id in ids[::2]:
        outcomes[job_id] = (await q.cancel(job_id)).outcome
    await m.run_until_idle(20)

    for job_id in ids:
        st = await q.status(job_id)
        assert runs[job_id] <= 1, job_id
        if job_id not in outcomes:
            assert (st.state, runs[job_id]) == ("completed", 1)
        elif outcomes[job_id] == "removed":
            assert (st.state, runs[job_id]) == ("cancelled", 0)
        elif outcomes[job_id] == "requested":
            # Ran; ended cancelled if the request landed in time, completed otherwise.
            assert st.state in ("cancelled", "completed")
            assert runs[job_id] == 1
        else:
            assert (outcomes[job_id], st.state, runs[job_id]) == ("finished", "completed", 1)
    assert await _drained(aredis, prefix)
    assert sum(1 for o in outcomes.values() if o == "removed") > 0


def test_sync_queue_cancel_removes_a_delayed_job(sredis, prefix):
    q = SyncQueue(Ctl, sredis, prefix=prefix)
    job_id = q.add(Ctl.summed, Item(n=1), delay=timedelta(minutes=1))
    assert q.cancel(job_id).outcome == "removed"
    assert q.status(job_id).state == "cancelled"
    with pytest.raises(JobCancelled) as err:
        q.result(job_id, timeout=1)
    assert (err.value.queue, err.value.job_id) == ("jc", job_id)


async def test_cancelled_running_job_is_not_retried_even_when_it_fails(
    managers, aredis, prefix
):
    app = App([Ctl])
    started = asyncio.Event()
    runs = 0

    @app.processor(Ctl, attempts=5, backoff=Backoff.fixed(0.01), **FAST)
    async def proc(job: Job[Any]) -> None:
        nonlocal runs
        runs += 1
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            raise ValueError("cleanup failed")

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1), keep_result=60)
    m = managers(app)
    await m.start()
    await asyncio.wait_for(started.wait(), 10)
    await q.cancel(job_id)

    async def final() -> bool:
        return (await q.status(job_id)).is_final

    await wait_until(final, what="the job's end")
    await m.run_until_idle(5)
    assert ((await q.status(job_id)).state, runs) == ("cancelled", 1)
