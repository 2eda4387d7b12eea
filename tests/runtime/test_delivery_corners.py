"""Delivery corners: the fetch bound, capacity-bounded reclaim, confirmed outcomes, re-sent
settles, shutdown reconciliation, a foreign group, and the smaller holes around them.

Each test names the guarantee it proves; all run against a real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from streamq import (
    Backoff,
    ForeignConsumerGroup,
    Queue,
    QueueAdmin,
    QueueContract,
    RegistrationError,
    job,
)
from streamq.app import App
from streamq.job import Job
from streamq.runtime import WorkerManager
from tests.runtime.conftest import MakeManager
from tests.runtime.support import RecordingHooks, keys, pending, stream_entries, wait_until


class Unit(BaseModel):
    n: int


class Wide(QueueContract, name="rt-wide", shards=4):
    unit = job("unit", Unit)


class Narrow(QueueContract, name="rt-narrow"):
    unit = job("unit", Unit)


async def _fill(r: aioredis.Redis, prefix: str, contract: Any, n: int) -> list[str]:
    q = Queue(contract, r, prefix=prefix)
    return [await q.add(contract.unit, Unit(n=i)) for i in range(n)]


async def _held_by(r: aioredis.Redis, prefix: str, lane: str, shards: int, who: str) -> int:
    total = 0
    for sk in keys(prefix, lane, shards).shards:
        total += sum(1 for p in await pending(r, sk) if p.consumer == who)
    return total


# -- item 2: the fetch bound -------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 2])
async def test_held_entries_never_exceed_concurrency_plus_prefetch_over_many_shards(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str, prefetch: int
) -> None:
    app = App([Wide])
    gate = asyncio.Event()
    seen: list[int] = []

    @app.processor(Wide, concurrency=1, prefetch=prefetch, lock_duration=5, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None:
        seen.append(job.payload.n)
        await gate.wait()

    await _fill(aredis, prefix, Wide, 40)  # spread over the 4 shards
    m = managers(app, consumer_name="me")
    await m.start()
    w = m.get_worker("rt-wide")
    assert w is not None
    await wait_until(lambda: len(seen) == 1, what="the first job")
    for _ in range(10):  # the reader keeps trying while the one slot is busy
        held = await _held_by(aredis, prefix, "rt-wide", 4, "me")
        assert held <= 1 + prefetch, f"{held} pending for a worker bounded at {1 + prefetch}"
        await asyncio.sleep(0.03)
    gate.set()
    await m.run_until_idle(20)
    assert sorted(seen) == list(range(40))
    assert w.stats()["peak_held"] <= 1 + prefetch


# -- item 1: reclaim claims only what it can start ---------------------------------------------
async def test_reclaim_claims_only_free_slots_and_leaves_the_rest_for_idle_workers(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    await _fill(aredis, prefix, Narrow, 30)
    # A dead worker held all 30.
    await aredis.xreadgroup("streamq", "dead", {sk.stream: ">"}, count=30)

    busy_app = App([Narrow])
    gate = asyncio.Event()
    ran: dict[str, list[int]] = {"busy": [], "idle1": [], "idle2": []}

    opts: dict[str, Any] = {"lock_duration": 0.3, "stalled_interval": 0.1, "block_timeout": 0.1}

    @busy_app.processor(Narrow, concurrency=1, **opts)
    async def busy(job: Job[Unit]) -> None:
        ran["busy"].append(job.payload.n)
        await gate.wait()

    def idle_proc(name: str) -> Any:
        async def proc(job: Job[Unit]) -> None:
            ran[name].append(job.payload.n)
            await asyncio.sleep(0.01)
        return proc

    b = managers(busy_app, consumer_name="busy")
    await b.start()
    await wait_until(lambda: len(ran["busy"]) == 1, what="the busy worker to claim one")
    await asyncio.sleep(0.4)  # several stalled intervals: it must not claim more
    assert await _held_by(aredis, prefix, "rt-narrow", 1, "busy") == 1
    assert await _held_by(aredis, prefix, "rt-narrow", 1, "dead") == 29

    for name in ("idle1", "idle2"):
        app = App([Narrow])
        app.processor(Narrow, concurrency=5, **opts)(idle_proc(name))
        await managers(app, consumer_name=name).start()
    await wait_until(lambda: len(ran["idle1"]) + len(ran["idle2"]) == 29, timeout_s=20,
                     what="the idle workers to take the rest")
    gate.set()
    await wait_until(lambda: len(ran["busy"]) + len(ran["idle1"]) + len(ran["idle2"]) == 30,
                     what="all 30 ran")
    assert ran["idle1"], "idle worker 1 took stalled work"
    assert ran["idle2"], "idle worker 2 took stalled work"
    assert sorted(ran["busy"] + ran["idle1"] + ran["idle2"]) == list(range(30))
    assert not await aredis.xlen(sk.dead)  # nobody was charged a stall for a claim


async def test_claims_that_never_started_do_not_spend_the_stall_budget(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    await _fill(aredis, prefix, Narrow, 10)
    await aredis.xreadgroup("streamq", "crashed-a", {sk.stream: ">"}, count=10)
    app = App([Narrow])
    ran: list[int] = []

    @app.processor(Narrow, concurrency=10, max_stalled_count=1, lock_duration=0.3,
                   stalled_interval=0.1)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    # Worker B (concurrency 1) would have claimed all 10 before; a claim-up-to-free-slots
    # worker claims one. Simulate B's crash after its one claim with the script directly.
    from streamq import ops
    from streamq._redis import run_calls

    await asyncio.sleep(0.35)
    page = (await run_calls(aredis, [ops.reclaim(sk, "streamq", "crashed-b", min_idle_ms=300,
                                                 count=1, max_stalled_count=1,
                                                 dead_cap=0)]))[0]
    assert len(page.entries) == 1
    m = managers(app, consumer_name="c")
    await m.start()
    await m.run_until_idle(15)
    # The one B started twice is stalled past the budget; the nine others ran here.
    assert len(ran) == 9
    dead = await aredis.xrange(sk.dead)
    assert len(dead) == 1
    assert dead[0][1][b"reason"] == b"stalled"


# -- item 3: confirmed outcomes ----------------------------------------------------------------
async def test_a_refused_complete_is_reported_lock_lost_not_completed(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])
    started, finish = asyncio.Event(), asyncio.Event()

    @app.processor(Narrow, lock_duration=5, stalled_interval=30)
    async def proc(job: Job[Unit]) -> None:
        started.set()
        await finish.wait()

    hooks = RecordingHooks()
    await _fill(aredis, prefix, Narrow, 1)
    m = managers(app, consumer_name="A", hooks=hooks)
    await m.start()
    await asyncio.wait_for(started.wait(), 5)
    sk = keys(prefix, "rt-narrow").shards[0]
    (row,) = await pending(aredis, sk)
    # B reclaims and completes the job while A still runs it (A's renewal has not run yet).
    await aredis.xclaim(sk.stream, "streamq", "B", 0, [row.entry_id])
    await aredis.xack(sk.stream, "streamq", row.entry_id)
    await aredis.xdel(sk.stream, row.entry_id)
    finish.set()
    await wait_until(lambda: bool(hooks.finished), what="A's outcome")
    assert hooks.outcomes() == {"lock_lost": 1}
    assert hooks.counts["lock_lost"] == 1


class _LoseFirstReply:
    """Wraps a client: the first pipeline runs in Redis, then its reply is 'lost'."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def pipeline(self, **kw: Any) -> Any:
        inner = self.client.pipeline(**kw)
        outer = self

        class Pipe:
            async def __aenter__(self) -> Any:
                await inner.__aenter__()
                return self

            async def __aexit__(self, *a: Any) -> Any:
                return await inner.__aexit__(*a)

            def execute_command(self, *args: Any) -> Any:
                return inner.execute_command(*args)

            async def execute(self, **kw2: Any) -> Any:
                out = await inner.execute(**kw2)
                if outer.lost == 0:
                    outer.lost += 1
                    raise RedisConnectionError("connection lost while reading the reply")
                return out

        return Pipe()

    async def execute_command(self, *args: Any, **kw: Any) -> Any:
        return await self.client.execute_command(*args, **kw)


async def test_a_settle_resent_after_a_lost_reply_is_not_reported_lock_lost(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])
    gate = asyncio.Event()

    @app.processor(Narrow, concurrency=4, lock_duration=5, stalled_interval=30)
    async def proc(job: Job[Unit]) -> None:
        await gate.wait()

    hooks = RecordingHooks()
    await _fill(aredis, prefix, Narrow, 4)
    m = managers(app, hooks=hooks)
    await m.start()
    w = m.get_worker("rt-narrow")
    assert w is not None
    await wait_until(lambda: w.active == 4, what="4 running")
    flaky = _LoseFirstReply(w.client)
    w.settler.ctx = dataclasses.replace(w.ctx, client=flaky)
    # Completes pile up while the slots free, so the settle is a pipeline of calls.
    await asyncio.sleep(0)
    gate.set()
    await wait_until(lambda: len(hooks.finished) == 4, what="4 outcomes")
    assert flaky.lost == 1, "the first flush's reply was lost after it ran"
    assert hooks.outcomes() == {"completed": 4}
    assert hooks.counts["lock_lost"] == 0
    assert not await aredis.xlen(keys(prefix, "rt-narrow").shards[0].stream)


# -- item 9: shutdown reconciles the pending list ----------------------------------------------
async def test_graceful_stop_releases_entries_a_cancelled_read_left_pending(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])

    @app.processor(Narrow, lock_duration=30, stalled_interval=30, block_timeout=5)
    async def proc(job: Job[Unit]) -> None: ...

    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    await _fill(aredis, prefix, Narrow, 3)
    # As if a read was cancelled with its reply on the wire: entries pending under "me"
    # that the worker never saw. (Another client reads them under this consumer's name,
    # before the worker starts, so the worker's own reads cannot take them first.)
    got = await aredis.xreadgroup("streamq", "me", {sk.stream: ">"}, count=3)
    assert got
    assert len(got[0][1]) >= 1
    stranded = len(got[0][1])
    m = managers(app, consumer_name="me")
    await m.start()
    await m.close_workers()
    assert [p for p in await pending(aredis, sk) if p.consumer == "me"] == []
    entries = await stream_entries(aredis, sk)
    assert len(entries) >= stranded  # handed back, not lost


# -- item 8: a second consumer group -----------------------------------------------------------
async def test_worker_refuses_to_start_beside_a_foreign_consumer_group(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])

    @app.processor(Narrow)
    async def proc(job: Job[Unit]) -> None: ...

    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "analytics", id="0", mkstream=True)
    await _fill(aredis, prefix, Narrow, 2)
    m = managers(app)
    with pytest.raises(ForeignConsumerGroup) as err:
        await m.start()
    assert "analytics" in str(err.value)
    assert sk.stream in str(err.value)
    assert err.value.groups == ["analytics"]
    assert await aredis.xlen(sk.stream) == 2  # nothing consumed, nothing deleted


# -- item 10: smaller holes --------------------------------------------------------------------
async def test_retry_record_in_the_delayed_set_keeps_unknown_fields(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])
    attempts: list[int] = []

    @app.processor(Narrow, attempts=3, backoff=Backoff.fixed(60))
    async def proc(job: Job[Unit]) -> None:
        attempts.append(job.attempt)
        raise RuntimeError("fails")

    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    from streamq.envelope import FIELD_NAMES, encode_fields

    values = encode_fields(job_id="j1", name="unit", timestamp_ms=1, payload_json=b'{"n":1}')
    fields: dict[Any, Any] = dict(zip(FIELD_NAMES, values, strict=True))
    fields["x-newer-field"] = "kept"
    await aredis.xadd(sk.stream, fields)
    m = managers(app)
    await m.start()

    async def stored() -> bool:
        return bool(await aredis.hlen(sk.jobs))

    await wait_until(stored, what="the retry record")
    (raw,) = await aredis.hvals(sk.jobs)
    assert b'"x-newer-field"' in raw
    assert b'"kept"' in raw
    assert b'"attempt"' in raw


async def test_a_freed_slot_does_not_start_a_buffered_job_of_a_paused_lane(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    app = App([Narrow])
    gate = asyncio.Event()
    ran: list[int] = []

    @app.processor(Narrow, concurrency=1, prefetch=1, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)
        await gate.wait()

    await _fill(aredis, prefix, Narrow, 3)
    m = managers(app)
    await m.start()
    w = m.get_worker("rt-narrow")
    assert w is not None
    await wait_until(lambda: ran == [0] and w.stats()["buffered"] == 1, what="1 run, 1 buffered")
    await QueueAdmin(aredis, Narrow.primary, prefix=prefix).pause()
    w.pause._until = 0.0  # the next read of the flag sees the pause (as after its cache time)
    assert await w.pause()
    gate.set()
    await wait_until(lambda: w.stats()["buffered"] == 0 and w.active == 0,
                     what="the buffered job handed back")
    await asyncio.sleep(0.3)
    assert ran == [0], "a paused lane started a buffered job"


async def test_a_reader_survives_a_non_connection_error_while_recreating_its_group(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str, caplog: Any
) -> None:
    app = App([Narrow])
    ran: list[int] = []

    @app.processor(Narrow, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    hooks = RecordingHooks()
    m = managers(app, hooks=hooks)
    await m.start()
    w = m.get_worker("rt-narrow")
    assert w is not None
    real = w.client.xgroup_create
    calls = {"n": 0}

    async def flaky_create(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ResponseError("ERR something unexpected")
        return await real(*a, **kw)

    w.client.xgroup_create = flaky_create
    sk = keys(prefix, "rt-narrow").shards[0]
    with caplog.at_level(logging.ERROR, logger="streamq.worker"):
        await aredis.delete(sk.stream)  # the group goes with it: NOGROUP on the next read
        await wait_until(lambda: calls["n"] >= 2, timeout_s=15, what="the group recreated")
    await _fill(aredis, prefix, Narrow, 2)
    await wait_until(lambda: sorted(ran) == [0, 1], timeout_s=15, what="jobs after recovery")
    assert hooks.counts["crashed:reader"] >= 1
    assert any("reader" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


async def test_a_crashed_task_is_logged_counted_and_restarted(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str, caplog: Any
) -> None:
    app = App([Narrow])

    @app.processor(Narrow, promote_interval=0.02)
    async def proc(job: Job[Unit]) -> None: ...

    hooks = RecordingHooks()
    m = managers(app, hooks=hooks)
    await m.start()
    w = m.get_worker("rt-narrow")
    assert w is not None
    real = w.promoter.once
    calls = {"n": 0}

    async def once_then_crash() -> float | None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in promotion")
        return await real()

    w.promoter.once = once_then_crash  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="streamq.worker"):
        await wait_until(lambda: calls["n"] >= 4, what="promotion to run again after the crash")
    assert hooks.counts["crashed:promoter"] == 1
    [rec] = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert "promoter" in rec.getMessage()
    assert rec.levelno == logging.ERROR
    assert rec.exc_info is not None


async def test_the_wedge_check_flags_held_jobs_that_do_not_start_even_when_the_queue_is_empty(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    from streamq.health import Monitor, RedisHealth

    app = App([Narrow])

    @app.processor(Narrow, concurrency=2, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None: ...

    m = managers(app)
    await m.start()
    w = m.get_worker("rt-narrow")
    assert w is not None
    # Wedge the dispatcher (as a bug would) and hand the reader two entries.
    w.supervisor.tasks["dispatcher"].cancel()
    await _fill(aredis, prefix, Narrow, 2)
    await wait_until(lambda: w.stats()["buffered"] == 2, what="2 buffered, none started")
    assert await aredis.xlen(keys(prefix, "rt-narrow").shards[0].stream) == 2
    mon = Monitor(m, RedisHealth(), RedisHealth(), interval_s=1, redis_timeout_s=5,
                  wedge_timeout_s=0.2)
    await mon.poll_once()  # no ready jobs: the fetched ones are delivered
    await asyncio.sleep(0.3)
    problems = mon.wedged()
    assert any("holds 2 fetched jobs" in p for p in problems), problems
    ok, _detail = mon.liveness()
    assert not ok


async def test_renewal_retries_soon_after_a_failure_not_a_full_interval_later() -> None:
    from streamq.keys import ShardKeys
    from streamq.runtime.renewal import HeldEntries, LockRenewer

    shards = (ShardKeys("p", "q", 0),)
    held = HeldEntries(shards)
    held.add(0, "1-0")
    times: list[float] = []

    class Client:
        def execute_command(self, *a: Any, **kw: Any) -> Any:
            times.append(time.monotonic())
            if len(times) == 1:
                raise RedisConnectionError("blip")
            return []

    r = LockRenewer(Client(), held, queue="q", group="g", consumer="c", interval_s=5.0,
                    on_lost=lambda i, ids: None)
    r.start()
    try:
        r.renew_now()
        deadline = time.monotonic() + 3
        while len(times) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        r.stop()
    assert len(times) >= 2, "no second renewal within 3 s of a failure (interval is 5 s)"
    assert times[1] - times[0] < 1.0


# -- item 11: registration misuse --------------------------------------------------------------
async def test_register_accepts_a_plain_function_and_refuses_a_non_callable(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    ran: list[int] = []

    async def process(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    m = WorkerManager(redis_url=redis_url, prefix=prefix)
    m.register(Narrow, process)
    with pytest.raises(RegistrationError):
        WorkerManager(redis_url=redis_url, prefix=prefix).register(Narrow, "not a function")  # type: ignore[arg-type]
    await _fill(aredis, prefix, Narrow, 2)
    async with m:
        await m.run_until_idle(5)
    assert sorted(ran) == [0, 1]


# -- item 10: the contract fingerprint at worker start -----------------------------------------
class UnitV2(BaseModel):
    n: int
    tenant: str  # required: jobs written by the old contract do not carry it


class NarrowV2(QueueContract, name="rt-narrow"):
    unit = job("unit", UnitV2)


async def test_a_worker_refuses_a_contract_incompatible_with_the_one_recorded_in_redis(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str, caplog: Any
) -> None:
    from streamq import IncompatibleContract
    from streamq.fingerprint import FINGERPRINT_FIELD, fingerprint

    await _fill(aredis, prefix, Narrow, 1)  # the producer records the old contract
    meta = keys(prefix, "rt-narrow").meta
    assert (await aredis.hget(meta, FINGERPRINT_FIELD)).decode() == fingerprint(Narrow)

    app = App([NarrowV2])

    @app.processor(NarrowV2)
    async def proc(job: Job[UnitV2]) -> None: ...

    with pytest.raises(IncompatibleContract) as err:
        await managers(app).start()
    assert "tenant" in str(err.value)
    assert await aredis.xlen(keys(prefix, "rt-narrow").shards[0].stream) == 1  # untouched

    with caplog.at_level(logging.ERROR, logger="streamq.worker"):
        m = managers(app, refuse_incompatible_contract=False)
        await m.start()
    assert any("incompatible" in r.getMessage() for r in caplog.records)
    # Started, and its own contract is the recorded one now.
    assert (await aredis.hget(meta, FINGERPRINT_FIELD)).decode() == fingerprint(NarrowV2)


async def test_a_consumer_group_added_while_running_fails_health(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    from streamq.health import Monitor, RedisHealth

    app = App([Narrow])

    @app.processor(Narrow, stalled_interval=0.05, block_timeout=0.1)
    async def proc(job: Job[Unit]) -> None: ...

    m = managers(app)
    await m.start()
    sk = keys(prefix, "rt-narrow").shards[0]
    await aredis.xgroup_create(sk.stream, "analytics", id="0")
    await wait_until(lambda: m.redis_status.refusal is not None, what="the group noticed")
    mon = Monitor(m, RedisHealth(), RedisHealth(), interval_s=1, redis_timeout_s=5,
                  wedge_timeout_s=5)
    ok, detail = mon.liveness()
    assert not ok
    assert any("analytics" in p for p in detail["problems"]), detail
