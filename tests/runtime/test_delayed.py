"""Delayed jobs: due on the server clock, started soon after, promoted exactly once."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from streamq import JobRequest, Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from tests.runtime.support import RecordingHooks, keys, server_ms, wait_until


class Tick(BaseModel):
    n: int


class Later(QueueContract, name="rt-delayed", shards=2):
    tick = job("tick", Tick)


PROMOTE_S = 0.2


async def test_delayed_job_starts_no_earlier_than_due_and_soon_after(managers, aredis, prefix):
    app = App([Later])
    started: dict[str, int] = {}

    @app.processor(Later, concurrency=5, lock_duration=2, promote_interval=PROMOTE_S)
    async def proc(job: Job[Tick]) -> None:
        started[job.id] = await server_ms(aredis)

    m = managers(app)
    await m.start()
    q = Queue(Later, aredis, prefix=prefix)
    delays = {"a": 150, "b": 400, "c": 700}
    for jid, ms in delays.items():
        delay = timedelta(milliseconds=ms)
        await q.for_key(jid).add(Later.tick, Tick(n=1), job_id=jid, delay=delay)
    due = {}
    for jid in delays:
        sk = keys(prefix, "rt-delayed", 2).for_key(jid)
        members = await aredis.zrange(sk.delayed, 0, -1, withscores=True)
        # Delayed records are keyed "<job id>:<random>", never the bare id.
        (score,) = [sc for m, sc in members if m.decode().startswith(f"{jid}:")]
        due[jid] = int(score)

    await wait_until(lambda: len(started) == 3, what="all delayed jobs")
    for jid in delays:
        late = started[jid] - due[jid]
        assert late >= 0, f"{jid} started {-late} ms before it was due"
        assert late < PROMOTE_S * 1000 + 150, f"{jid} started {late} ms after it was due"
    assert started["a"] < started["b"] < started["c"]


async def test_two_managers_promoting_in_parallel_run_each_delayed_job_once(
    managers, aredis, prefix
):
    app = App([Later])
    runs: list[tuple[str, int]] = []

    @app.processor(Later, concurrency=10, lock_duration=2, promote_interval=0.02)
    async def proc(job: Job[Tick]) -> None:
        runs.append((job.id, job.attempt))

    hooks = [RecordingHooks(), RecordingHooks()]
    ms = [managers(app, consumer_name=f"m{i}", hooks=hooks[i]) for i in range(2)]
    for m in ms:
        await m.start()
    rng = random.Random(7)
    n = 80
    await Queue(Later, aredis, prefix=prefix).add_bulk(
        JobRequest(Later.tick, Tick(n=i), job_id=f"d{i}", delay=rng.randrange(20, 600) / 1000)
        for i in range(n)
    )
    await wait_until(lambda: len(runs) >= n, what="every delayed job to run")
    for m in ms:
        await m.run_until_idle(5)

    counts: Counter[Any] = Counter(jid for jid, _ in runs)
    assert sorted(counts) == sorted(f"d{i}" for i in range(n))
    assert set(counts.values()) == {1}
    assert {a for _, a in runs} == {1}
    # Both promoters worked the same delayed sets; together they moved each job once.
    assert hooks[0].counts["promoted"] + hooks[1].counts["promoted"] == n
