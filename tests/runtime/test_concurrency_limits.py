"""Concurrency, the global rate limiter, and batching (no per-job round trip)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import JobRequest, Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.keys import QueueKeys
from streamq.options import Limiter
from tests.runtime.support import server_ms, wait_until


class Unit(BaseModel):
    n: int


class Busy(QueueContract, name="rt-busy", shards=2):
    unit = job("unit", Unit)


class Flat(QueueContract, name="rt-flat"):
    unit = job("unit", Unit)


async def add(aredis: Any, prefix: str, n: int, contract: Any = Busy) -> None:
    await Queue(contract, aredis, prefix=prefix).add_bulk(
        JobRequest(contract.unit, Unit(n=i)) for i in range(n)
    )


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_concurrency_caps_simultaneous_runs_exactly(managers, aredis, prefix, kind):
    app = App([Busy])
    limit = 4
    in_flight = 0
    peak = 0
    done = 0

    def enter() -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)

    def leave() -> None:
        nonlocal in_flight, done
        in_flight -= 1
        done += 1

    if kind == "async":

        @app.processor(Busy, concurrency=limit, lock_duration=2)
        async def proc(job: Job[Unit]) -> None:
            enter()
            await asyncio.sleep(0.02)
            leave()

    else:
        lock = threading.Lock()

        @app.processor(Busy, concurrency=limit, lock_duration=2)
        def proc(job: Job[Unit]) -> None:
            with lock:
                enter()
            time.sleep(0.02)
            with lock:
                leave()

    await add(aredis, prefix, 40)
    m = managers(app)
    await m.start()
    await m.run_until_idle(10)

    assert done == 40
    assert peak == limit


async def test_global_limiter_across_two_managers_never_exceeds_max_per_window(
    managers, aredis, prefix
):
    app = App([Busy])
    max_jobs, window_ms = 5, 400
    offset_ms = await server_ms(aredis) - time.time() * 1000  # server clock, same host
    starts: list[float] = []
    by: Counter[str] = Counter()

    limiter = Limiter(max_jobs, window_ms / 1000)

    @app.processor(Busy, concurrency=10, lock_duration=2, limiter=limiter)
    async def proc(job: Job[Unit]) -> None:
        starts.append(time.time() * 1000 + offset_ms)
        by[job.shard] += 1

    n = 22
    await add(aredis, prefix, n)
    ms = [managers(app, consumer_name=f"lim{i}") for i in range(2)]
    await asyncio.gather(*(m.start() for m in ms))
    await wait_until(lambda: len(starts) == n, timeout_s=15, what="every job to start")

    per_window = Counter(int(t // window_ms) for t in starts)
    assert max(per_window.values()) <= max_jobs, per_window
    # The limit is what paced the run: 22 jobs need at least 5 windows at 5 per window.
    assert len(per_window) >= 5
    assert sum(by.values()) == n


async def test_fetch_and_settle_are_batched_not_one_round_trip_per_job(managers, aredis, prefix):
    app = App([Flat])
    ran = 0

    @app.processor(Flat, concurrency=50, lock_duration=5)
    async def proc(job: Job[Unit]) -> None:
        nonlocal ran
        ran += 1

    jobs = 500
    await add(aredis, prefix, jobs, Flat)
    m = managers(app)

    async def calls() -> dict[str, int]:
        stats = await aredis.info("commandstats")
        return {
            cmd: int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0))
            for cmd in ("xreadgroup", "evalsha", "xack")
        }

    before = await calls()
    await m.start()
    await m.run_until_idle(20)
    after = await calls()
    delta = {k: after[k] - before[k] for k in after}

    assert ran == jobs
    # Every job was acknowledged (inside the scripts, which ack a flush's ids in one XACK):
    # nothing is left pending in the group.
    stream = QueueKeys(prefix, Flat.queue_name, 1).shards[0].stream
    assert (await aredis.xpending(stream, "streamq"))["pending"] == 0
    assert delta["xack"] >= 1
    # Measured: about 11 reads and 14 script calls for 500 jobs (fetch COUNT = free slots,
    # completions of a flush in one fenced call, plus the promoter's periodic calls).
    assert delta["xreadgroup"] < jobs / 10, delta
    assert delta["evalsha"] < jobs / 10, delta
