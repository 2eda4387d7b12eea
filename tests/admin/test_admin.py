"""QueueAdmin against real Redis: exact depth per shard, pause/resume of a running worker,
consumers."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import redis
import redis.asyncio as aioredis

from streamq import Queue, QueueAdmin
from streamq.admin import QueueDepth, ShardDepth, SyncQueueAdmin
from streamq.keys import QueueKeys
from tests.admin.contracts import Adm, Solo, Task, key_for, running_worker, wait_for
from tests.admin.test_deadletters import GROUP, raw_dead, shard_keys


async def build_state(r: aioredis.Redis, prefix: str) -> None:
    """adm: 3 ready, 2 in flight, 2 delayed, 1 dead; adm-1: 1 ready, 1 delayed."""
    s0 = shard_keys(prefix, index=0)
    await raw_dead(r, s0, "dead-1")  # creates the group, leaves one dead letter
    q0 = Queue(Adm, r, prefix=prefix).for_key(key_for(Adm, 0))
    q1 = Queue(Adm, r, prefix=prefix).for_key(key_for(Adm, 1))
    for n in range(5):
        await q0.add(Adm.task, Task(n=n))
    await r.xreadgroup(GROUP, "fake-worker", {s0.stream: ">"}, count=2)
    for n in range(2):
        await q0.add(Adm.task, Task(n=10 + n), delay=timedelta(minutes=5))
    await q1.add(Adm.task, Task(n=20))
    await q1.add(Adm.task, Task(n=21), delay=timedelta(minutes=5))


def counts(depth: QueueDepth) -> QueueDepth:
    """The depth without what moves with the clock (ages) or the group (consumers)."""
    return replace(depth, shards=tuple(
        replace(d, oldest_ready_age_s=0.0, consumers=0) for d in depth.shards))


EXPECTED = QueueDepth(
    "adm",
    (
        ShardDepth("adm", ready=3, in_flight=2, delayed=2, dead=1),
        ShardDepth("adm-1", ready=1, in_flight=0, delayed=1, dead=0),
    ),
)


async def test_depth_counts_ready_in_flight_delayed_and_dead_exactly(
    prefix: str, aredis: aioredis.Redis
) -> None:
    await build_state(aredis, prefix)
    depth = await QueueAdmin(aredis, Adm, prefix=prefix).depth()
    assert counts(depth) == EXPECTED
    assert (depth.ready, depth.in_flight, depth.delayed, depth.dead) == (4, 2, 3, 1)
    # Both shards have a job waiting since the set-up: an age by the Redis clock, under a
    # minute; the group on shard 0 has its consumers, shard 1 has no group yet.
    assert all(0 < d.oldest_ready_age_s < 60 for d in depth.shards)
    assert depth.shards[0].consumers >= 1
    assert depth.shards[1].consumers == 0
    assert depth.paused is False


def test_sync_twin_reads_the_same_depth(
    prefix: str, sredis: redis.Redis, redis_server: Any
) -> None:
    import asyncio

    async def setup() -> None:
        r = aioredis.Redis(port=redis_server.port)
        try:
            await build_state(r, prefix)
        finally:
            await r.aclose()

    asyncio.run(setup())
    assert counts(SyncQueueAdmin(sredis, Adm, prefix=prefix).depth()) == EXPECTED


async def test_depth_before_any_worker_counts_every_job_ready(
    prefix: str, aredis: aioredis.Redis
) -> None:
    q = Queue(Solo, aredis, prefix=prefix)
    for n in range(3):
        await q.add(Solo.task, Task(n=n))
    depth = await QueueAdmin(aredis, Solo, prefix=prefix).depth()
    assert counts(depth).shards == (
        ShardDepth("solo", ready=3, in_flight=0, delayed=0, dead=0),)
    empty = await QueueAdmin(aredis, Adm, prefix=prefix).depth()
    assert (empty.ready, empty.in_flight, empty.delayed, empty.dead) == (0, 0, 0, 0)


async def test_pause_stops_a_running_worker_from_starting_jobs_and_resume_continues(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    admin = QueueAdmin(aredis, Adm, prefix=prefix)
    q = Queue(Adm, aredis, prefix=prefix)
    async with running_worker(redis_url, prefix) as h:
        await q.add(Adm.task, Task(n=1))
        await wait_for(lambda: _is(len(h.seen) == 1), what="the first job to run")

        await admin.pause()
        assert await admin.is_paused()
        worker = h.manager.get_worker("adm")
        assert worker is not None
        await wait_for(lambda: _is(worker.pause.value), what="the worker to see the pause")
        for n in range(2, 7):
            await q.add(Adm.task, Task(n=n))
        # The worker re-reads the flag every 0.2 s while paused: let it do so three times.
        checks: set[float] = {worker.pause._until}

        async def checked_thrice() -> bool:
            checks.add(worker.pause._until)
            return len(checks) > 3

        await wait_for(checked_thrice, what="three pause checks")
        assert h.started == [1]
        depth = await admin.depth()
        assert (depth.ready, depth.in_flight) == (5, 0)

        await admin.resume()
        assert not await admin.is_paused()
        await wait_for(lambda: _is(len(h.seen) == 6), what="the held-back jobs to run")
        await h.manager.run_until_idle(10)
    assert sorted(n for _, _, n in h.seen) == [1, 2, 3, 4, 5, 6]


async def _is(v: bool) -> bool:
    return v


async def test_pause_is_per_lane_and_stored_in_the_meta_hash(
    prefix: str, aredis: aioredis.Redis
) -> None:
    adm, solo = QueueAdmin(aredis, Adm, prefix=prefix), QueueAdmin(aredis, Solo, prefix=prefix)
    await adm.pause()
    await adm.pause()
    meta = QueueKeys(prefix, "adm", 2).meta
    assert await aredis.hget(meta, "paused") == b"1"
    assert await adm.is_paused()
    assert not await solo.is_paused()
    await adm.resume()
    assert await aredis.hget(meta, "paused") is None


async def test_consumers_lists_workers_with_what_they_hold_and_their_heartbeat(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await build_state(aredis, prefix)
    admin = QueueAdmin(aredis, Adm, prefix=prefix)
    async with running_worker(redis_url, prefix, lock_duration=30) as h:
        me = h.manager.consumer

        async def both_seen() -> bool:
            names = {c.name for c in await admin.consumers()}
            return {me, "fake-worker"} <= names and any(
                c.last_heartbeat_ms for c in await admin.consumers() if c.name == me
            )

        await wait_for(both_seen, what="the worker's heartbeat")
        found = {c.name: c for c in await admin.consumers()}
    fake = found["fake-worker"]
    assert fake.pending == 2
    assert fake.pending_by_shard == {"adm": 2}
    assert fake.idle_ms is not None
    assert fake.last_heartbeat_ms is None
    assert found[me].last_heartbeat_ms is not None
