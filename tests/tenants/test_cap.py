"""The per-tenant concurrency cap: at most K jobs of one tenant run at once across workers,
waits spend no attempt, a killed worker's slots free themselves, and one tenant's flood does
not hold back another tenant."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamq import App, Job, JobRequest, Queue, RegistrationError
from streamq.keys import QueueKeys
from streamq.options import Batch
from tests.runtime.support import RecordingHooks, wait_until
from tests.tenants.contracts import NoTenant, Tenanted, Work


class CapHooks(RecordingHooks):
    def tenant_cap_waited(self, queue: str, shard: str, job_name: str) -> None:
        with self._lock:
            self.counts["cap_wait"] += 1


class Running:
    """Jobs running now per tenant, their peak, and each run's attempt."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.attempts: list[int] = []
        self.started: dict[int, float] = {}
        self.done = 0
        self.lock = threading.Lock()

    def enter(self, job: Job[Work]) -> None:
        with self.lock:
            t = job.payload.project_id
            self.now[t] += 1
            self.peak[t] = max(self.peak[t], self.now[t])
            self.attempts.append(job.attempt)
            self.started.setdefault(job.payload.n, time.monotonic())

    def leave(self, job: Job[Work]) -> None:
        with self.lock:
            self.now[job.payload.project_id] -= 1
            self.done += 1


def capped_app(running: Running, *, cap: int, concurrency: int, lock_s: float = 5) -> App:
    app = App([Tenanted])

    @app.processor(Tenanted, concurrency=concurrency, tenant_concurrency=cap,
                   lock_duration=lock_s, tenant_wait=0.05, attempts=1)
    async def work(job: Job[Work]) -> None:
        running.enter(job)
        try:
            await asyncio.sleep(job.payload.sleep_s)
        finally:
            running.leave(job)

    return app


async def add(r: Any, prefix: str, tenant: str, n: int, sleep_s: float, first: int = 0) -> None:
    await Queue(Tenanted, r, prefix=prefix).add_bulk(
        JobRequest(Tenanted.work, Work(project_id=tenant, n=first + i, sleep_s=sleep_s))
        for i in range(n)
    )


async def test_tenant_cap_holds_across_two_workers_and_waits_spend_no_attempt(
    managers: Any, aredis: aioredis.Redis, prefix: str
) -> None:
    running = Running()
    hooks = CapHooks()
    cap = 2
    m1 = managers(capped_app(running, cap=cap, concurrency=4), hooks=hooks)
    m2 = managers(capped_app(running, cap=cap, concurrency=4), hooks=hooks)
    await add(aredis, prefix, "a", 16, 0.05)
    await add(aredis, prefix, "b", 8, 0.05, first=100)
    slots = QueueKeys(prefix, "tn", 2).tenant_slots("a")
    sampled: list[int] = []

    async def sample() -> None:
        while True:
            sampled.append(int(await aredis.zcard(slots)))
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    await m1.start()
    await m2.start()
    await wait_until(lambda: running.done == 24, timeout_s=30, what="every job done")
    sampler.cancel()

    assert running.peak["a"] == cap
    assert running.peak["b"] <= cap
    assert max(sampled) <= cap
    # Waiting for a slot spent no attempt: every run was attempt 1 (attempts=1 would have
    # dead-lettered a job charged for a wait), and the waits were counted.
    assert running.attempts == [1] * 24
    assert hooks.counts["cap_wait"] > 0
    await wait_until(lambda: hooks.outcomes() == Counter({"completed": 24}), timeout_s=10,
                     what="every completion confirmed")

    async def given_back() -> bool:
        return await aredis.exists(slots) == 0

    await wait_until(given_back, timeout_s=5, what="every slot given back")


async def test_a_flooding_tenant_does_not_hold_back_another_tenants_job(
    managers: Any, aredis: aioredis.Redis, prefix: str
) -> None:
    # Tenant "flood" queues 200 jobs of 0.5 s ahead of one job of tenant "small". Without a
    # cap, 4 slots would clear the flood in about 25 s before "small" ran; with the cap
    # (2 per tenant), "small" starts within BOUND_S of its add.
    BOUND_S = 5.0
    running = Running()
    m = managers(capped_app(running, cap=2, concurrency=4))
    await add(aredis, prefix, "flood", 200, 0.5)
    await m.start()
    await wait_until(lambda: running.now["flood"] == 2, timeout_s=10, what="the flood runs")
    added = time.monotonic()
    await add(aredis, prefix, "small", 1, 0.0, first=1000)
    await wait_until(lambda: 1000 in running.started, timeout_s=BOUND_S,
                     what="the other tenant's job to start")
    waited = running.started[1000] - added
    assert waited < BOUND_S
    assert running.peak["flood"] == 2


async def test_a_killed_workers_tenant_slots_free_themselves_within_the_lock_duration(
    managers: Any, aredis: aioredis.Redis, prefix: str
) -> None:
    # What a SIGKILLed worker leaves: a slot held under its name, never renewed nor given
    # back (tests/tenants/test_kill.py does it with a real process).
    from streamq import ops
    from streamq._redis import run_calls

    lock_s = 1.0
    qk = QueueKeys(prefix, "tn", 2)
    grant = (await run_calls(aredis, [ops.tenant_slot_acquire(
        qk, "a", cap=1, lease_ms=int(lock_s * 1000), holder="dead-worker/tn/0/1-0")]))[0]
    assert grant.granted
    taken_at = time.monotonic()
    running = Running()
    m = managers(capped_app(running, cap=1, concurrency=2, lock_s=lock_s))
    await add(aredis, prefix, "a", 1, 0.0)
    await m.start()
    await wait_until(lambda: running.done == 1, timeout_s=lock_s + 5, what="the job to run")
    assert running.started[0] - taken_at >= lock_s * 0.9  # it waited for the dead lease


def test_tenant_concurrency_needs_a_tenant_field_and_a_job_per_slot() -> None:
    from streamq.runtime import WorkerManager

    app = App([NoTenant])

    @app.processor(NoTenant, tenant_concurrency=2)
    async def work(job: Job[Work]) -> None: ...

    m = WorkerManager(redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(RegistrationError, match="tenant_field") as err:
        m.register_app(app)
    assert err.value.queue == "tn-notenant"

    batched = App([Tenanted])

    @batched.processor(Tenanted, batch=Batch(max_size=10), tenant_concurrency=2)
    async def many(jobs: list[Job[Work]]) -> None: ...

    with pytest.raises(RegistrationError, match="batch"):
        WorkerManager(redis_url="redis://127.0.0.1:1/0").register_app(batched)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_malformed_tenant_concurrency_is_refused(bad: Any) -> None:
    from streamq import ConfigurationError, WorkerOptions

    with pytest.raises(ConfigurationError, match="tenant_concurrency"):
        WorkerOptions(tenant_concurrency=bad)


async def test_a_failing_slot_flusher_is_logged_counted_and_its_jobs_answered(
    aredis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from streamq.envelope import FIELD_NAMES, decode_entry, encode_fields
    from streamq.keys import QueueKeys as Keys
    from streamq.options import WorkerOptions
    from streamq.runtime.context import LaneContext
    from streamq.runtime.tenancy import TenantGate

    crashes: list[tuple[str | None, str]] = []

    class Crashes(RecordingHooks):
        def task_crashed(self, queue: str | None, task: str) -> None:
            crashes.append((queue, task))

    lane = Tenanted.primary
    ctx = LaneContext(lane=lane, keys=Keys(prefix, lane.name, lane.shards), group="g",
                      consumer="c", options=WorkerOptions(tenant_concurrency=1),
                      hooks=Crashes(), client=aredis)
    gate = TenantGate(ctx, closing=lambda: False)

    async def broken(*_: Any) -> None:
        raise RuntimeError("a bug in the flusher")

    gate._send = broken  # type: ignore[method-assign]
    values = encode_fields(job_id="j", name="work", timestamp_ms=1, payload_json=b"{}")
    raw = decode_entry(b"1-0", dict(zip(FIELD_NAMES, values, strict=True)))
    # The job waiting for its slot is answered (refused: it waits and tries again) ...
    slot = await asyncio.wait_for(gate.enter(ctx.shards[0], raw, Work(project_id="t")), 5)
    assert slot is None
    # ... and the failure is said and counted, not left to a lost task.
    assert crashes == [(lane.name, "tenant-slots")]
    assert "tenant slot requests failed" in caplog.text
