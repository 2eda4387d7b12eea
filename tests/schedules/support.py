"""Contracts, apps and helpers shared by the schedule tests (and their replica processes)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import App, Job, QueueContract, job
from streamq.keys import QueueKeys


class Tick(BaseModel):
    at: str = ""


class Sched(QueueContract, name="sched-q", shards=2):
    tick = job("tick", Tick)
    other = job("other", Tick)


class Elsewhere(QueueContract, name="sched-elsewhere"):
    tick = job("tick", Tick)


Record = Callable[[Job[Tick]], Awaitable[None]]


def make_app(
    record: Record,
    *,
    name: str = "beat",
    every: float | timedelta = 0.2,
    grace: float | None = 2.0,
    missed: str = "skip",
    payload: Any = None,
    elsewhere: bool = False,
) -> App[Any]:
    """An app consuming ``sched-q`` with ``record`` and one schedule of ``Sched.tick``."""
    app = App([Sched, Elsewhere])

    @app.processor(Sched)
    async def process(j: Job[Tick]) -> None:
        await record(j)

    if elsewhere:

        @app.processor(Elsewhere)
        async def other(j: Job[Tick]) -> None: ...

    if payload is None:

        def payload(tick: Any) -> Tick:
            return Tick(at=tick.isoformat())

    app.schedule(
        name,
        Sched.tick,
        every=every,
        grace=grace,
        missed=missed,  # type: ignore[arg-type]
        payload=payload,
    )
    return app


def tick_of(job_id: str) -> int:
    """The tick (ms) in a scheduled job's id ``sched:<name>:<ms>``."""
    return int(job_id.rsplit(":", 1)[1])


async def redis_ms(client: aioredis.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def left_in_streams(client: aioredis.Redis, prefix: str) -> list[str]:
    """Ids of the jobs still in ``sched-q``'s streams (enqueued, never completed)."""
    ids = []
    for shard in QueueKeys(prefix, Sched.queue_name, Sched.shards).shards:
        for _, fields in await client.xrange(shard.stream):
            ids.append(fields[b"id"].decode())
    return ids


async def wait_for(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)


def assert_each_tick_once(ticks: list[int], every_ms: int) -> None:
    """No tick twice, and no gap: every tick from the first to the last is there."""
    assert len(ticks) == len(set(ticks)), f"duplicate ticks: {sorted(ticks)}"
    ordered = sorted(ticks)
    gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != every_ms]
    assert not gaps, f"ticks skipped between {gaps}"
