"""A paused lane starts nothing new: neither fetched nor reclaimed jobs."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import Queue, QueueAdmin, QueueContract, job
from streamq.app import App
from streamq.job import Job
from tests.runtime.conftest import MakeManager
from tests.runtime.support import keys, pending, wait_until


class Unit(BaseModel):
    n: int


class Paused(QueueContract, name="rt-pause"):
    unit = job("unit", Unit)


async def test_paused_lane_leaves_a_dead_workers_jobs_pending_until_resumed(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    ran: list[int] = []
    app = App([Paused])

    @app.processor(Paused, lock_duration=0.3, stalled_interval=0.05, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    shard = keys(prefix, "rt-pause").shards[0]
    await Queue(Paused, aredis, prefix=prefix).add(Paused.unit, Unit(n=1))
    # A worker that died holding the job: delivered to "gone", never acknowledged.
    await aredis.xgroup_create(shard.stream, "streamq", id="0", mkstream=True)
    await aredis.xreadgroup("streamq", "gone", {shard.stream: ">"}, count=1)
    admin = QueueAdmin(aredis, Paused.primary, prefix=prefix)
    await admin.pause()

    manager = managers(app)
    await manager.start()
    worker = manager.get_worker("rt-pause")
    assert worker is not None
    # Proving that something does not happen takes time: the lock (0.3 s) lapses and a
    # dozen reclaim ticks (0.05 s) pass while the lane is paused.
    await asyncio.sleep(0.6)
    assert ran == []
    rows = await pending(aredis, shard)
    assert [r.consumer for r in rows] == ["gone"]

    await admin.resume()
    await wait_until(lambda: ran == [1], what="the reclaimed job to run after resume")
    await wait_until(
        lambda: aredis_len_zero(aredis, shard.stream), what="the job to be acknowledged"
    )


async def aredis_len_zero(r: aioredis.Redis, stream: str) -> bool:
    return await r.xlen(stream) == 0
