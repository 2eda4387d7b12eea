"""A SIGKILLed worker's tenant slots free themselves: a real process holds one, dies, and the
tenant's jobs start elsewhere within the lock duration (plus a margin for a loaded machine)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from streamq import App, Job
from streamq.keys import QueueKeys
from tests.runtime.support import wait_until
from tests.tenants.contracts import Tenanted, Work
from tests.tenants.slot_worker import LOCK_S
from tests.tenants.test_cap import add

ROOT = Path(__file__).resolve().parents[2]
MARGIN_S = 5.0
"""Beyond the lock duration: a renewal interval, a reclaim interval and a loaded scheduler."""


async def test_a_killed_workers_slot_is_freed_and_the_tenant_runs_elsewhere(
    managers: Any, aredis: aioredis.Redis, redis_url: str, prefix: str
) -> None:
    await add(aredis, prefix, "a", 2, 0.0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.tenants.slot_worker", redis_url, prefix,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        assert line.startswith(b"started"), line
        slots = QueueKeys(prefix, "tn", 2).tenant_slots("a")
        held = await aredis.zrange(slots, 0, -1)
        assert len(held) == 1
        assert held[0].startswith(b"doomed/")
    finally:
        proc.kill()
        await proc.wait()
    killed = time.monotonic()

    started: list[float] = []
    app = App([Tenanted])

    @app.processor(Tenanted, concurrency=2, tenant_concurrency=1, lock_duration=LOCK_S,
                   stalled_interval=0.2, tenant_wait=0.05)
    async def work(job: Job[Work]) -> None:
        started.append(time.monotonic())

    m = managers(app)
    await m.start()
    await wait_until(lambda: len(started) == 2, timeout_s=LOCK_S + MARGIN_S,
                     what="both of the tenant's jobs to run after the kill")
    assert started[0] - killed <= LOCK_S + MARGIN_S
