"""A lock renewal that fails reaches the hooks (metrics and liveness), not just a log line."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq import Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.testing import free_port
from tests.runtime.conftest import MakeManager
from tests.runtime.support import RecordingHooks, wait_until


class Unit(BaseModel):
    n: int


class Renewed(QueueContract, name="rt-renew-errors"):
    unit = job("unit", Unit)


async def test_failed_renewal_is_reported_to_the_hooks_as_a_redis_error(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    release = asyncio.Event()
    app = App([Renewed])

    @app.processor(Renewed, lock_duration=0.4, block_timeout=0.1)
    async def hold(job: Job[Unit]) -> None:
        await release.wait()

    hooks = RecordingHooks()
    manager = managers(app, hooks=hooks)
    await manager.start()
    worker = manager.get_worker("rt-renew-errors")
    assert worker is not None
    await Queue(Renewed, aredis, prefix=prefix).add(Renewed.unit, Unit(n=1))
    await wait_until(lambda: worker.active == 1, what="the job to start")
    before = hooks.counts["redis_error"]
    # The renewal thread's own connection now points at a port nobody listens on.
    worker.renewer.client = redis.Redis(
        port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    await wait_until(lambda: hooks.counts["redis_error"] > before, what="a reported error")
    release.set()
