"""Graceful shutdown in-process: release of unfinished jobs, leaving the group, and pruning
of consumers that are gone."""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from streamq import Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.options import Limiter
from tests.runtime.support import (
    RecordingHooks,
    consumers,
    dead_entries,
    keys,
    pending,
    stream_entries,
    wait_until,
)


class Unit(BaseModel):
    n: int


class Shut(QueueContract, name="rt-shutdown"):
    unit = job("unit", Unit)


def sk(prefix: str):
    return keys(prefix, "rt-shutdown").shards[0]


async def test_job_running_past_shutdown_timeout_is_released_for_another_worker(
    managers, aredis, prefix
):
    app = App([Shut])
    runs: list[tuple[str, str, int]] = []
    cancelled = asyncio.Event()

    @app.processor(Shut, lock_duration=5, shutdown_timeout=0.3)
    async def proc(job: Job[Unit]) -> None:
        runs.append((job.id, job.logger.extra["queue"], job.attempt))
        if len(runs) == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    job_id = await Queue(Shut, aredis, prefix=prefix).add(Shut.unit, Unit(n=1))
    a = managers(app, consumer_name="A")
    await a.start()
    await wait_until(lambda: len(runs) == 1, what="the job to start")
    (held,) = await pending(aredis, sk(prefix))

    t0 = time.monotonic()
    await a.close_workers()
    took = time.monotonic() - t0

    assert 0.3 <= took < 2, took
    assert cancelled.is_set()
    # Back in the stream at once, same job, attempt unchanged, owned by nobody.
    assert await pending(aredis, sk(prefix)) == []
    ((eid, fields),) = await stream_entries(aredis, sk(prefix))
    assert eid != held.entry_id
    assert (fields["id"], fields["attempt"]) == (job_id, "1")
    assert "A" not in await consumers(aredis, sk(prefix))

    b = managers(app, consumer_name="B")
    await b.start()
    await b.run_until_idle(5)
    assert [(i, a) for i, _, a in runs] == [(job_id, 1), (job_id, 1)]
    assert await stream_entries(aredis, sk(prefix)) == []
    assert await dead_entries(aredis, keys(prefix, "rt-shutdown")) == []


async def test_fetched_but_not_started_entries_are_released_at_once_on_close(
    managers, aredis, prefix
):
    app = App([Shut])
    finish = asyncio.Event()
    ran: list[int] = []

    # One start per 30 s: the first job runs, the other two wait in the local buffer.
    @app.processor(Shut, concurrency=3, lock_duration=5, shutdown_timeout=10,
                   limiter=Limiter(1, 30))
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)
        await finish.wait()

    q = Queue(Shut, aredis, prefix=prefix)
    for n in range(3):
        await q.add(Shut.unit, Unit(n=n))
    a = managers(app, consumer_name="A")
    await a.start()
    w = a.get_worker("rt-shutdown")
    await wait_until(lambda: w.stats()["buffered"] == 2 and len(ran) == 1, what="2 buffered")
    assert [p.consumer for p in await pending(aredis, sk(prefix))] == ["A"] * 3

    closing = asyncio.create_task(a.close_workers())

    async def only_running_one_held() -> bool:
        return len(await pending(aredis, sk(prefix))) == 1

    await wait_until(only_running_one_held, timeout_s=2, what="buffered entries released")
    assert not closing.done()  # still waiting on the running job
    entries = await stream_entries(aredis, sk(prefix))
    assert len(entries) == 3  # the running one, and the two released ones re-added
    assert sorted(f["attempt"] for _, f in entries) == ["1", "1", "1"]

    finish.set()
    await asyncio.wait_for(closing, 5)
    assert ran == [0]
    assert await pending(aredis, sk(prefix)) == []
    assert len(await stream_entries(aredis, sk(prefix))) == 2  # the job that ran is gone


async def test_consumer_with_nothing_pending_leaves_the_group_on_close(managers, aredis, prefix):
    app = App([Shut])

    @app.processor(Shut, lock_duration=5)
    async def proc(job: Job[Unit]) -> None: ...

    await Queue(Shut, aredis, prefix=prefix).add(Shut.unit, Unit(n=1))
    a = managers(app, consumer_name="leaving")
    await a.start()
    await a.run_until_idle(5)
    assert "leaving" in await consumers(aredis, sk(prefix))
    assert await aredis.hexists(keys(prefix, "rt-shutdown").workers, "leaving")

    await a.close_workers()

    assert "leaving" not in await consumers(aredis, sk(prefix))
    assert not await aredis.hexists(keys(prefix, "rt-shutdown").workers, "leaving")


async def test_a_gone_consumer_with_nothing_pending_is_pruned(managers, aredis, prefix):
    app = App([Shut])

    @app.processor(Shut, lock_duration=0.2, stalled_interval=0.1)
    async def proc(job: Job[Unit]) -> None: ...

    await aredis.xgroup_create(sk(prefix).stream, "streamq", id="0", mkstream=True)
    await aredis.xgroup_createconsumer(sk(prefix).stream, "streamq", "ghost")
    await Queue(Shut, aredis, prefix=prefix).add(Shut.unit, Unit(n=1))
    a = managers(app, consumer_name="alive", overrides={"rt-shutdown": {"block_timeout": 5}})
    await a.start()
    await a.run_until_idle(5)  # "alive" read a job: it is a consumer of the group now

    async def ghost_gone() -> bool:
        return "ghost" not in await consumers(aredis, sk(prefix))

    # Gone: no heartbeat and idle for 3 x max(lock, stalled interval) = 600 ms.
    await wait_until(ghost_gone, timeout_s=5, what="the ghost consumer to be pruned")
    # A live consumer idle as long (blocked in its read) is kept: it heartbeats.
    await asyncio.sleep(0.8)
    assert await consumers(aredis, sk(prefix)) == {"alive": 0}


async def test_a_consumer_with_pending_entries_is_never_pruned(managers, aredis, prefix):
    app = App([Shut])

    @app.processor(Shut, lock_duration=5, stalled_interval=30)
    async def proc(job: Job[Unit]) -> None: ...

    await aredis.xgroup_create(sk(prefix).stream, "streamq", id="0", mkstream=True)
    await Queue(Shut, aredis, prefix=prefix).add(Shut.unit, Unit(n=1))
    await aredis.xreadgroup("streamq", "holder", {sk(prefix).stream: ">"}, count=1)
    await aredis.xgroup_createconsumer(sk(prefix).stream, "streamq", "empty")
    a = managers(app, consumer_name="alive")
    await a.start()
    w = a.get_worker("rt-shutdown")

    # The pruning step at its most aggressive: both counted gone, no idle threshold.
    await w.heartbeat.drop_gone({"holder", "empty"}, stale_after_ms=0)

    after = await consumers(aredis, sk(prefix))
    assert after.get("holder") == 1  # kept, with its entry still deliverable by reclaim
    assert "empty" not in after


async def test_close_is_prompt_when_nothing_runs(managers, aredis, prefix):
    app = App([Shut])

    @app.processor(Shut, lock_duration=5, stalled_interval=30, shutdown_timeout=30)
    async def proc(job: Job[Unit]) -> None: ...

    hooks = RecordingHooks()
    a = managers(app, hooks=hooks)
    await a.start()
    t0 = time.monotonic()
    await a.close_workers()
    assert time.monotonic() - t0 < 1
    assert hooks.counts["redis_error"] == 0


async def test_pruning_says_why_it_skipped_a_shard_and_goes_on(managers, aredis, prefix, caplog):
    app = App([Shut])

    @app.processor(Shut, lock_duration=5, stalled_interval=30)
    async def proc(job: Job[Unit]) -> None: ...

    a = managers(app, consumer_name="alive")
    await a.start()
    w = a.get_worker("rt-shutdown")
    real = w.ctx.client.xinfo_consumers

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug while listing consumers")

    w.ctx.client.xinfo_consumers = broken
    try:
        with caplog.at_level("DEBUG", logger="streamq.worker"):
            await w.heartbeat.drop_gone({"ghost"}, stale_after_ms=0)
    finally:
        w.ctx.client.xinfo_consumers = real
    skipped = [r for r in caplog.records if r.getMessage() == "cannot list consumers to prune"]
    assert skipped
    assert skipped[0].levelname == "WARNING"  # not Redis: a bug, said loudly
    assert skipped[0].exc_info is not None
