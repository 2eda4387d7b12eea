"""A processor flags its job's tenant; producers then route that tenant to the secondary lane,
which the same app consumes."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamq import App, ConfigurationError, Job, Queue, QueueAdmin, RateLimited
from tests.runtime.support import wait_until
from tests.tenants.contracts import NoLane, Tenanted, Work
from tests.tenants.support import lane_lengths


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_processor_flags_a_throttled_tenant_and_its_next_jobs_take_the_secondary_lane(
    managers: Any, aredis: aioredis.Redis, prefix: str, kind: str
) -> None:
    ran: list[tuple[str, str, int]] = []
    throttled: list[int] = []  # the upstream throttles the first run of job 1 only
    app = App([Tenanted])
    if kind == "async":

        @app.processor(Tenanted, concurrency=2)
        async def work(job: Job[Work]) -> None:
            ran.append((job.queue, job.payload.project_id, job.attempt))
            if job.payload.n == 1 and not throttled:
                throttled.append(1)
                await job.flag_tenant(timedelta(minutes=5), reason="upstream 429")
                raise RateLimited(delay=0.01)
    else:

        @app.processor(Tenanted, concurrency=2)
        def work(job: Job[Work]) -> None:
            ran.append((job.queue, job.payload.project_id, job.attempt))
            if job.payload.n == 1 and not throttled:
                throttled.append(1)
                job.flag_tenant_sync(timedelta(minutes=5), reason="upstream 429")
                raise RateLimited(delay=0.01)

    m = managers(app, queues=["tn", "tn-secondary"])
    await m.start()
    queue = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=0.2)
    await queue.add(Tenanted.work, Work(project_id="p1", n=1))

    admin = QueueAdmin(aredis, Tenanted, prefix=prefix)

    async def flagged() -> bool:
        return [f.tenant for f in await admin.flagged_tenants()] == ["p1"]

    await wait_until(flagged, timeout_s=10, what="the processor's flag")
    flag = (await admin.flagged_tenants())[0]
    assert (flag.reason, flag.by) == ("upstream 429", "processor")
    await asyncio.sleep(0.2)  # the producer's staleness bound
    await queue.add(Tenanted.work, Work(project_id="p1", n=2))
    await queue.add(Tenanted.work, Work(project_id="p2", n=3))
    await wait_until(lambda: len(ran) >= 4, timeout_s=10, what="every job to run")
    assert ("tn-secondary", "p1", 1) in ran
    assert ("tn", "p2", 1) in ran
    # The throttled job itself was re-delayed (no attempt spent) and ran again.
    assert ran.count(("tn", "p1", 1)) == 2
    await m.run_until_idle(10)
    assert await lane_lengths(aredis, prefix) == (0, 0)


async def test_flagging_from_a_queue_without_a_secondary_lane_names_queue_and_job(
    managers: Any, aredis: aioredis.Redis, prefix: str
) -> None:
    errors: list[ConfigurationError] = []
    app = App([NoLane])

    @app.processor(NoLane)
    async def work(job: Job[Work]) -> None:
        try:
            await job.flag_tenant(60)
        except ConfigurationError as exc:
            errors.append(exc)

    m = managers(app)
    await m.start()
    await Queue(NoLane, aredis, prefix=prefix).add(NoLane.work, Work(project_id="p1"))
    await wait_until(lambda: bool(errors), timeout_s=10, what="the refused flag")
    assert errors[0].queue == "tn-nolane"
    assert errors[0].job == "work"
    assert errors[0].job_id
    assert "secondary" in str(errors[0])
