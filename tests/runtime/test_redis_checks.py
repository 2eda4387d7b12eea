"""What the worker checks of, and survives in, its Redis: an eviction policy that could drop
queue keys, and a consumer group that vanished under it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import Queue, QueueContract, RedisUnavailable, UnsafeRedisConfig, job
from streamq.app import App
from streamq.job import Job
from streamq.runtime import WorkerManager
from tests.runtime.support import RecordingHooks, keys, wait_until
from tests.support.redis_server import RedisServer, find_binary


class Unit(BaseModel):
    n: int


class Checked(QueueContract, name="rt-checks"):
    unit = job("unit", Unit)


def app_with(ran: list[int]) -> App:
    app = App([Checked])

    @app.processor(Checked, lock_duration=2, block_timeout=0.2, promote_interval=0.05)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    return app


@pytest.fixture(scope="module")
def lru_redis() -> Iterator[RedisServer]:
    """A Redis that may evict any key under memory pressure."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    server = RedisServer(binary, extra=["--maxmemory-policy", "allkeys-lru"]).start()
    yield server
    server.stop(kill=True)


async def test_start_refuses_a_redis_that_may_evict_queue_keys(lru_redis, prefix):
    m = WorkerManager(redis_url=lru_redis.url, prefix=prefix)
    m.register_app(app_with([]))

    with pytest.raises(UnsafeRedisConfig, match="'allkeys-lru'") as err:
        await m.start()
    assert "noeviction" in str(err.value)
    assert m.get_worker("rt-checks") is None


async def test_allow_unsafe_eviction_starts_with_a_warning(lru_redis, prefix, caplog):
    ran: list[int] = []
    m = WorkerManager(redis_url=lru_redis.url, prefix=prefix, allow_unsafe_eviction=True)
    m.register_app(app_with(ran))
    with caplog.at_level(logging.WARNING, logger="streamq.worker"):
        await m.start()
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("allkeys-lru" in w and "starting anyway" in w for w in warnings), warnings
        r = aioredis.Redis(port=lru_redis.port)
        try:
            await Queue(Checked, r, prefix=prefix).add(Checked.unit, Unit(n=1))
            await m.run_until_idle(5)
        finally:
            await r.aclose()
        assert ran == [1]
    finally:
        await m.close_workers(timeout_s=1)


async def test_worker_recreates_a_consumer_group_deleted_under_it(managers, aredis, prefix):
    ran: list[int] = []
    hooks = RecordingHooks()
    m = managers(app_with(ran), hooks=hooks)
    await m.start()
    q = Queue(Checked, aredis, prefix=prefix)
    await q.add(Checked.unit, Unit(n=1))
    await wait_until(lambda: ran == [1], what="the first job")

    stream = keys(prefix, "rt-checks").shards[0].stream
    await aredis.delete(stream)  # the group goes with the key
    await q.add(Checked.unit, Unit(n=2))

    await wait_until(lambda: ran == [1, 2], what="the job added after the group vanished")
    groups = await aredis.xinfo_groups(stream)
    assert [g["name"] for g in groups] == [b"streamq"]
    await q.add(Checked.unit, Unit(n=3))
    await wait_until(lambda: ran == [1, 2, 3], what="the worker to keep consuming")


async def test_start_against_a_dead_redis_raises_redis_unavailable_and_close_after_it_is_clean(
    prefix: str,
) -> None:
    from tests.support.redis_server import free_port

    app = App([Checked])

    @app.processor(Checked)
    async def noop(job: Job[Unit]) -> None:
        return None

    manager = WorkerManager(redis_url=f"redis://127.0.0.1:{free_port()}/0", prefix=prefix)
    manager.register_app(app)
    with pytest.raises(RedisUnavailable) as raised:
        await manager.start()
    await manager.close_workers()
    assert isinstance(raised.value, RedisUnavailable)
    assert "unreachable" in str(raised.value)
