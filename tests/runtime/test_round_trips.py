"""Batching that survives staggered completions: processors that do real I/O finish one at a
time, yet the queue's own round trips stay a small fraction of the jobs (counted, not timed)."""

from __future__ import annotations

import asyncio
import random

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import JobRequest, Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from tests.runtime.conftest import MakeManager


class Unit(BaseModel):
    n: int


class Io(QueueContract, name="rt-io"):
    unit = job("unit", Unit)


async def test_staggered_completions_share_settle_calls_and_reads_ride_along(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Io])
    rng = random.Random(7)
    done: list[int] = []

    @app.processor(Io, concurrency=10, prefetch=10)
    async def proc(job: Job[Unit]) -> None:
        await asyncio.sleep(rng.uniform(0.0005, 0.003))  # an I/O call of its own
        done.append(job.payload.n)

    jobs = 600
    q = Queue(Io, aredis, prefix=prefix)
    await q.add_bulk([JobRequest(Io.unit, Unit(n=n)) for n in range(jobs)])
    m = managers(app)
    await m.start()
    await m.run_until_idle(60)
    w = m.get_worker("rt-io")
    assert w is not None
    assert sorted(done) == list(range(jobs))
    round_trips = w.settler.flushes + sum(r.reads for r in w.readers)
    # One settle call and one read per job would be 2.0; batching brings it near 0.1.
    assert round_trips / jobs < 0.35, (w.settler.flushes, [r.reads for r in w.readers])
    assert w.settler.rides > 0
