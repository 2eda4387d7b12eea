"""Results: validated against the job's result model, stored with their TTL, waited for with
one blocking call; nothing kept when not asked for."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from streamq import (
    ConfigurationError,
    InvalidResult,
    JobCancelled,
    JobFailed,
    JobNotFound,
    PermanentError,
    Queue,
    ResultTimeout,
    SyncQueue,
)
from streamq.app import App
from streamq.job import Job
from tests.jobcontrol.support import FAST, Ctl, Item, Total, qkeys, tracking_keys
from tests.runtime.support import RecordingHooks, wait_until


async def test_result_is_validated_stored_and_returned_as_the_result_model(
    managers, aredis, prefix
):
    app = App([Ctl])

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> dict[str, int]:
        return {"total": job.payload.n * 2}

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=21))
    m = managers(app)
    await m.start()
    got = await q.result(job_id, timeout=10)
    assert got == Total(total=42)
    st = await q.status(job_id)
    assert (st.state, st.result_json, st.attempt) == ("completed", '{"total":42}', 1)
    assert st.to_dict()["result"] == {"total": 42}
    # The contract keeps it 5 minutes: the final record carries that TTL.
    ttl = await aredis.pttl(qkeys(prefix).shards[Ctl.shard_names().index(st.shard)]
                            .result(job_id))
    assert 290_000 < ttl <= 300_000


async def test_result_wakes_promptly_when_the_result_lands(managers, aredis, prefix):
    app = App([Ctl])
    go = asyncio.Event()

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> Total:
        await go.wait()
        return Total(total=1)

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app)
    await m.start()
    waiters = [asyncio.ensure_future(q.result(job_id, timeout=30)) for _ in range(3)]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiters)
    t0 = time.monotonic()
    go.set()
    got = await asyncio.gather(*waiters)
    # Every waiter wakes on the one record (BLMOVE keeps it), well before any timeout.
    assert got == [Total(total=1)] * 3
    assert time.monotonic() - t0 < 5


async def test_result_times_out_cleanly_and_the_job_carries_on(managers, aredis, prefix):
    app = App([Ctl])
    go = asyncio.Event()

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> Total:
        await go.wait()
        return Total(total=3)

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app)
    await m.start()
    t0 = time.monotonic()
    with pytest.raises(ResultTimeout) as err:
        await q.result(job_id, timeout=timedelta(milliseconds=300))
    assert 0.25 < time.monotonic() - t0 < 5
    assert (err.value.queue, err.value.job_id, err.value.job) == ("jc", job_id, "summed")
    go.set()
    assert await q.result(job_id, timeout=10) == Total(total=3)


async def test_result_of_a_dead_job_raises_with_its_reason(managers, aredis, prefix):
    app = App([Ctl])

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> Total:
        raise PermanentError("no such project")

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app)
    await m.start()
    with pytest.raises(JobFailed) as err:
        await q.result(job_id, timeout=10)
    assert (err.value.reason, err.value.error, err.value.job_id) == (
        "permanent", "no such project", job_id
    )


async def test_result_of_a_cancelled_job_raises_job_cancelled(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1), delay=60)
    waiter = asyncio.ensure_future(q.result(job_id, timeout=30))
    await asyncio.sleep(0.2)
    await q.cancel(job_id)
    with pytest.raises(JobCancelled):
        await asyncio.wait_for(waiter, 5)


async def test_result_of_an_untracked_or_unknown_job_raises_job_not_found(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.plain, Item(n=1))
    with pytest.raises(JobNotFound, match=job_id):
        await q.result(job_id, timeout=1)


async def test_result_of_a_job_that_keeps_nothing_is_refused_at_once(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))
    t0 = time.monotonic()
    with pytest.raises(ConfigurationError, match="keeps no result"):
        await q.result(job_id, timeout=30)
    assert time.monotonic() - t0 < 5


async def test_invalid_result_fails_the_attempt_naming_the_field(managers, aredis, prefix):
    app = App([Ctl])

    @app.processor(Ctl, attempts=1, **FAST)
    async def proc(job: Job[Any]) -> dict[str, str]:
        return {"total": "lots"}

    hooks = RecordingHooks()
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app, hooks=hooks)
    await m.start()
    with pytest.raises(JobFailed) as err:
        await q.result(job_id, timeout=10)
    assert "total" in (err.value.error or "")
    assert "Total" in (err.value.error or "")
    # The record lands in Redis a moment before the worker hears the settle's answer.
    await wait_until(lambda: len(hooks.finished) == 1, what="the reported outcome")
    (_, outcome, error), = hooks.finished
    assert outcome == "failed"
    assert isinstance(error, InvalidResult)
    assert (error.fields, error.queue, error.job, error.job_id) == (
        ["total"], "jc", "summed", job_id
    )


async def test_results_expire_and_then_the_job_is_unknown(managers, aredis, prefix):
    app = App([Ctl])

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> list[int]:
        return [job.payload.n]

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.plain, Item(n=4), keep_result=timedelta(milliseconds=400))
    m = managers(app)
    await m.start()
    assert await q.result(job_id, timeout=10) == [4]

    async def forgotten() -> bool:
        return (await q.status(job_id)).state == "unknown"

    await wait_until(forgotten, what="the record's expiry")
    await m.run_until_idle(5)
    assert await tracking_keys(aredis, prefix) == []


async def test_a_result_that_is_not_json_fails_with_a_clear_error(managers, aredis, prefix):
    app = App([Ctl])

    @app.processor(Ctl, attempts=1, **FAST)
    async def proc(job: Job[Any]) -> object:
        return object()

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.plain, Item(n=1), keep_result=60)
    m = managers(app)
    await m.start()
    with pytest.raises(JobFailed, match="not JSON"):
        await q.result(job_id, timeout=10)


def test_sync_queue_result_waits_for_the_worker(sredis, prefix, redis_url):
    q = SyncQueue(Ctl, sredis, prefix=prefix)
    job_id = q.add(Ctl.summed, Item(n=2))

    async def work() -> None:
        from streamq.runtime import WorkerManager

        app = App([Ctl])

        @app.processor(Ctl, **FAST)
        async def proc(job: Job[Any]) -> Total:
            return Total(total=job.payload.n + 1)

        m = WorkerManager(redis_url=redis_url, prefix=prefix)
        m.register_app(app)
        await m.start()
        try:
            await m.run_until_idle(10)
        finally:
            await m.close_workers(timeout_s=1)

    import threading

    t = threading.Thread(target=lambda: asyncio.run(work()))
    t.start()
    try:
        assert q.result(job_id, timeout=15) == Total(total=3)
    finally:
        t.join(20)
    for k in sredis.scan_iter(match=f"{prefix}:*"):
        sredis.delete(k)
