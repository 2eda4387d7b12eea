"""Each role's ACL rules (streamq.security) against a real Redis: every operation of the role
works with nothing denied (Redis's ACL LOG stays empty for the user, so even a refusal a script
swallows would show), and an operation outside the role fails naming what is missing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import (
    App,
    Backoff,
    ContractSet,
    DeadLetters,
    Job,
    JobRequest,
    PermanentError,
    Queue,
    QueueAdmin,
    QueueContract,
    RedisRefused,
    RunnerContext,
    Schedules,
    SyncQueue,
    WorkerManager,
    job,
)
from streamq.keys import QueueKeys, RunnerKeys
from tests.entrypoint.helpers import WorkerProcess, clean_env, http_get, wait_for
from tests.runtime.support import wait_until
from tests.security.conftest import MakeUser
from tests.support.redis_server import RedisServer, free_port


class Work(BaseModel):
    n: int
    mode: str = "ok"


class Sec(QueueContract, name="sec", shards=2):
    work = job("work", Work)


def user_of(url: str) -> str:
    return url.split("//", 1)[1].split(":", 1)[0]


# A worker tries ACL DRYRUN before its fallback probe, and reads maxmemory-policy when it may:
# both refusals are expected of a least-privilege worker and handled.
EXPECTED = {"command acl|dryrun", "command config|get"}


async def denials(admin: aioredis.Redis, url: str) -> list[str]:
    """What Redis refused ``url``'s user (from its ACL log), other than the expected."""
    user = user_of(url)
    out = []
    for entry in await admin.acl_log():
        if entry.get("username") == user:
            out.append(f"{entry.get('reason')} {entry.get('object')}")
    return [d for d in out if d not in EXPECTED]


async def test_the_producer_role_adds_ready_delayed_bulk_and_deduplicated_jobs(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str
) -> None:
    url = make_user("producer", prefix)
    client = aioredis.Redis.from_url(url)
    q = Queue(Sec, client, prefix=prefix)
    try:
        await q.add(Sec.work, Work(n=1))
        await q.add(Sec.work, Work(n=2), delay=60)
        first = await q.add(Sec.work, Work(n=3), job_id="once")
        again = await q.add(Sec.work, Work(n=3), job_id="once")
        ids = await q.add_bulk([JobRequest(Sec.work, Work(n=i)) for i in range(10, 20)])
        await q.for_key("tenant-a").add(Sec.work, Work(n=4))
    finally:
        await client.aclose()
    with redis.Redis.from_url(url) as sync:
        sq = SyncQueue(Sec, sync, prefix=prefix)
        sq.add(Sec.work, Work(n=5))
        sq.add(Sec.work, Work(n=6), delay=60, job_id="later")
        sq.add_bulk([JobRequest(Sec.work, Work(n=7))])
    assert first == again == "once"
    assert len(ids) == 10
    qk = QueueKeys(prefix, "sec", 2)
    ready = sum([await admin.xlen(s.stream) for s in qk.shards])
    delayed = sum([await admin.zcard(s.delayed) for s in qk.shards])
    assert (ready, delayed) == (15, 2)
    assert await denials(admin, url) == []


async def test_a_producer_cannot_read_jobs_or_dead_letters_and_the_error_names_the_command(
    make_user: MakeUser, prefix: str
) -> None:
    client = aioredis.Redis.from_url(make_user("producer", prefix))
    try:
        with pytest.raises(RedisRefused) as info:
            await DeadLetters(client, Sec, prefix=prefix).list()
        assert "NOPERM" in str(info.value)
        assert "'xrevrange' command" in str(info.value)
        with pytest.raises(RedisRefused) as info:
            await QueueAdmin(client, Sec, prefix=prefix).depth()
        assert "NOPERM" in str(info.value)
    finally:
        await client.aclose()


async def test_a_producer_of_one_prefix_cannot_add_under_another_and_the_error_names_the_key(
    make_user: MakeUser, prefix: str
) -> None:
    client = aioredis.Redis.from_url(make_user("producer", prefix))
    try:
        with pytest.raises(RedisRefused) as info:
            await Queue(Sec, client, prefix=f"{prefix}x").add(Sec.work, Work(n=1))
    finally:
        await client.aclose()
    assert f"{prefix}x:" in str(info.value)
    assert info.value.queue == "sec"


def worker_app(seen: list[tuple[int, int]], beats: list[int]) -> App[Any]:
    app = App([Sec])

    @app.processor(Sec, concurrency=4, block_timeout=0.1, promote_interval=0.05, attempts=3,
                   backoff=Backoff.fixed(0.05), lock_duration=1, stalled_interval=0.2)
    async def proc(j: Job[Work]) -> None:
        seen.append((j.payload.n, j.attempt))
        if j.payload.mode == "flaky" and j.attempt == 1:
            raise ValueError("flaky the first time")
        if j.payload.mode == "poison":
            raise PermanentError("never works")

    app.schedule("beat", Sec.work, every=0.2, payload=Work(n=-1), grace=2.0)

    @app.runner("leader", singleton=True, lease=2.0, renew_interval=0.2, every=0.1)
    async def lead(ctx: RunnerContext[Any]) -> None:
        await ctx.fenced_set(ctx.key("beat"), str(len(beats)))
        beats.append(1)

    return app


async def test_the_worker_role_processes_retries_dead_letters_reclaims_and_promotes(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str
) -> None:
    seen: list[tuple[int, int]] = []
    beats: list[int] = []
    qk = QueueKeys(prefix, "sec", 2)
    q = Queue(Sec, admin, prefix=prefix)
    # A job a crashed consumer ("ghost") read and never settled: the worker must reclaim it.
    await q.for_key("k").add(Sec.work, Work(n=100))
    shard = qk.for_key("k")
    await admin.xgroup_create(shard.stream, "streamq", id="0")
    await admin.xreadgroup("streamq", "ghost", {shard.stream: ">"}, count=1)

    url = make_user("worker", prefix)
    m = WorkerManager(redis_url=url, prefix=prefix)
    m.register_app(worker_app(seen, beats))
    try:
        await m.start()
        await q.add(Sec.work, Work(n=1))
        await q.add(Sec.work, Work(n=2, mode="flaky"))
        await q.add(Sec.work, Work(n=3, mode="poison"))
        await q.add(Sec.work, Work(n=4), delay=0.2)
        await wait_until(lambda: {n for n, _ in seen} >= {1, 2, 3, 4, 100}, timeout_s=20,
                         what="every job run")
        await wait_until(lambda: (2, 2) in seen, timeout_s=10, what="the retry")
        await wait_until(lambda: any(n == -1 for n, _ in seen), timeout_s=10,
                         what="a scheduled job")
        await wait_until(lambda: len(beats) >= 2, timeout_s=10, what="the runner's writes")
        # The ghost is gone for good: its heartbeat is ancient and it holds nothing now.
        await admin.hset(qk.workers, "ghost", 1)
        await wait_until(lambda: _no_ghost(admin, qk), timeout_s=10,
                         what="the gone consumer pruned")
        dead = await DeadLetters(admin, Sec, prefix=prefix).list()
        assert [d.payload["n"] for d in dead] == [3]
        assert await admin.get(RunnerKeys(prefix, "leader").data("beat")) is not None
        assert m.redis_status.refusal is None
    finally:
        await m.close_workers(timeout_s=2)
    assert await denials(admin, url) == []


async def _no_ghost(admin: aioredis.Redis, qk: QueueKeys) -> bool:
    for s in qk.shards:
        consumers = await admin.xinfo_consumers(s.stream, "streamq")
        if any(c["name"] in (b"ghost", "ghost") for c in consumers):
            return False
    return not await admin.hexists(qk.workers, "ghost")


async def test_the_operator_role_reads_depth_pauses_and_handles_dead_letters(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str
) -> None:
    seen: list[tuple[int, int]] = []
    m = WorkerManager(redis_url=make_user("worker", prefix), prefix=prefix)
    m.register_app(worker_app(seen, []))
    q = Queue(Sec, admin, prefix=prefix)
    url = make_user("operator", prefix)
    client = aioredis.Redis.from_url(url)
    qa = QueueAdmin(client, Sec, prefix=prefix)
    dead = DeadLetters(client, Sec, prefix=prefix)
    try:
        await m.start()
        for n in range(3):
            await q.add(Sec.work, Work(n=n, mode="poison"))
        await wait_until(lambda: {0, 1, 2} <= {n for n, _ in seen}, what="the poison jobs")
        await wait_until(lambda: _count(dead, 3), what="three dead letters")

        await qa.pause()
        assert await qa.is_paused()
        await q.add(Sec.work, Work(n=50))
        depth = await qa.depth()
        assert depth.dead == 3
        assert len(await qa.consumers()) == 1
        await qa.resume()
        assert not await qa.is_paused()
        await wait_until(lambda: 50 in [n for n, _ in seen], what="the job after resume")

        letters = await dead.list()
        assert await dead.count(by_reason=True) == {"permanent": 3}
        assert await dead.retry([letters[0].ref]) == 1
        runs = [n for n, _ in seen]
        await wait_until(lambda: len([n for n, _ in seen if n in (0, 1, 2)]) == 4,
                         what=f"the retried dead letter run (runs so far: {runs})")
        await wait_until(lambda: _count(dead, 3), what="it dead-letters again")
        assert await dead.purge([letters[1].ref]) == 1
        assert await dead.purge(all=True) == 2
        assert await dead.count() == 0

        schedules = Schedules(client, worker_app([], []), prefix=prefix)
        await schedules.pause("beat")
        assert [s.paused for s in await schedules.list()] == [True]
        await schedules.resume("beat")
    finally:
        await m.close_workers(timeout_s=2)
        await client.aclose()
    assert await denials(admin, url) == []


async def _count(dead: DeadLetters, n: int) -> bool:
    return await dead.count() == n


def test_the_operator_cli_works_with_the_operator_user(
    make_user: MakeUser, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamq.cli import main

    url = make_user("operator", prefix)
    base = ["--redis-url", url, "--prefix", prefix, "--contracts",
            "tests.security.test_acl_roles:CONTRACTS"]
    for argv in (["depth"], ["dead", "list", "sec"], ["dead", "count", "sec"],
                 ["pause", "sec"], ["resume", "sec"], ["consumers", "sec"],
                 ["dead", "purge", "sec", "--all", "--yes"]):
        assert main([*base, *argv]) == 0, (argv, capsys.readouterr())


CONTRACTS = ContractSet(Sec)


def test_python_m_worker_runs_with_the_worker_user_metrics_and_health_included(
    acl_server: RedisServer, make_user: MakeUser, prefix: str, tmp_path: Path
) -> None:
    from tests.entrypoint.sample_app import Chores, Note

    url = make_user("worker", prefix)
    port = free_port()
    env = clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                    REDIS_PREFIX=prefix, QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
                    QUEUE_CONSUMER_CHORES_IS_ENABLED="true", METRICS_PORT=str(port),
                    LOG_FORMAT="json")
    w = WorkerProcess(env, tmp_path / "worker.log")
    admin = redis.Redis(port=acl_server.port)
    try:
        w.wait_consuming(60)
        SyncQueue(Chores, admin, prefix=prefix).add(Chores.chore, Note(n=1))
        wait_for(lambda: w.logged("chore done"), 30, "the chore")
        for path in ("/metrics", "/healthz", "/readyz"):
            status, body = http_get(port, path)
            assert status == 200, (path, body)
        assert "streamq_queue_dead{" in http_get(port, "/metrics")[1]
        assert w.terminate() == 0
    finally:
        w.kill()
    user = user_of(url)
    refused = {f"{e['reason']} {e['object']}" for e in admin.acl_log()
               if e.get("username") == user}
    admin.close()
    assert refused <= EXPECTED, refused


# -- tenant flags and the per-tenant cap under the role ACLs ---------------------------------
class Tenanted(BaseModel):
    project: str
    n: int


class Tq(QueueContract, name="tq", secondary_shards=1, tenant_field="project"):
    work = job("work", Tenanted)


TENANT_CONTRACTS = ContractSet(Tq)


async def test_tenant_flags_and_caps_work_under_each_roles_acl(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamq.cli import main

    urls = {role: make_user(role, prefix) for role in ("producer", "worker", "operator")}
    ran: list[tuple[str, int, str]] = []
    app = App([Tq])

    @app.processor(Tq, block_timeout=0.1, tenant_concurrency=1, concurrency=4)
    async def proc(j: Job[Tenanted]) -> None:
        ran.append((j.payload.project, j.payload.n, j.queue))
        if j.payload.n == 1:
            await j.flag_tenant(60, reason="upstream 429")

    m = WorkerManager(redis_url=urls["worker"], prefix=prefix)
    m.register_app(app, queues=["tq", "tq-secondary"])
    producer = aioredis.Redis.from_url(urls["producer"])
    operator = aioredis.Redis.from_url(urls["operator"])
    try:
        await m.start()
        q = Queue(Tq, producer, prefix=prefix, tenant_flags_staleness=0.05)
        await q.add(Tq.work, Tenanted(project="noisy", n=1))
        await wait_until(lambda: len(ran) == 1, what="the job that flags its tenant")
        qa = QueueAdmin(operator, Tq, prefix=prefix)
        await wait_until(lambda: _flagged(qa, ["noisy"]), what="the flag")
        await qa.flag_tenant("other", 60, reason="backfill")
        await asyncio.sleep(0.2)  # past the producer's flag staleness
        for n in range(2, 5):
            await q.add(Tq.work, Tenanted(project="noisy", n=n))
        await wait_until(lambda: len(ran) == 4, what="the noisy tenant's later jobs")
        assert {lane for p, n, lane in ran if n > 1} == {"tq-secondary"}
        assert await qa.unflag_tenant("noisy")
        base = ["--redis-url", urls["operator"], "--prefix", prefix, "--contracts",
                "tests.security.test_acl_roles:TENANT_CONTRACTS"]
        assert main([*base, "tenant", "list", "tq"]) == 0, capsys.readouterr()
        assert "other" in capsys.readouterr().out
    finally:
        await m.close_workers(timeout_s=2)
        await producer.aclose()
        await operator.aclose()
    for url in urls.values():
        assert await denials(admin, url) == []


async def _flagged(qa: QueueAdmin, tenants: list[str]) -> bool:
    return [f.tenant for f in await qa.flagged_tenants()] == tenants


class Summed(BaseModel):
    total: int


class Tracked(QueueContract, name="sec-tracked"):
    add = job("add", Work, result=Summed, keep_result=60)
    slow = job("slow", Work, keep_result=60)


async def test_tracked_jobs_status_cancel_progress_and_results_work_under_each_roles_acl(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str
) -> None:
    urls = {role: make_user(role, prefix) for role in ("producer", "worker", "operator")}
    app = App([Tracked])
    slow_started = asyncio.Event()

    @app.processor(Tracked, block_timeout=0.1, concurrency=4, lock_duration=1)
    async def proc(j: Job[Work]) -> Summed | None:
        if j.name == "slow":
            await j.report_progress(0.5, {"step": "halfway"})
            slow_started.set()
            await asyncio.sleep(30)  # until cancelled
            return None
        return Summed(total=j.payload.n * 2)

    m = WorkerManager(redis_url=urls["worker"], prefix=prefix)
    m.register_app(app)
    producer = aioredis.Redis.from_url(urls["producer"])
    operator = aioredis.Redis.from_url(urls["operator"])
    try:
        await m.start()
        q = Queue(Tracked, producer, prefix=prefix)
        done = await q.add(Tracked.add, Work(n=21))
        assert (await q.result(done, timeout=10)).total == 42
        assert (await q.status(done)).state == "completed"
        slow = await q.add(Tracked.slow, Work(n=1))
        await asyncio.wait_for(slow_started.wait(), 10)
        status = await QueueAdmin(operator, Tracked, prefix=prefix).status(slow)
        assert status.state == "active"
        cancel = await QueueAdmin(operator, Tracked, prefix=prefix).cancel(slow)
        assert cancel.outcome == "requested"
        await wait_until(lambda: _state_is(q, slow, "cancelled"), timeout_s=10,
                         what="the running job cancelled")
        waiting = await q.add(Tracked.slow, Work(n=2), delay=60)
        assert (await q.cancel(waiting)).outcome == "removed"
    finally:
        await m.close_workers(timeout_s=2)
        await producer.aclose()
        await operator.aclose()
    for url in urls.values():
        assert await denials(admin, url) == []


async def _state_is(q: Queue[Any], job_id: str, state: str) -> bool:
    return (await q.status(job_id)).state == state
