"""enqueue.lua: immediate XADD, delayed ZADD + HSET on the server clock, dedup markers, bulk
batches, and all-or-nothing under OOM."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from streamq import ops
from streamq._redis import run_calls
from streamq.envelope import FIELD_NAMES
from streamq.errors import RedisOutOfMemory
from tests.scripts.helpers import (
    enqueue,
    item,
    job_values,
    make_group,
    pending,
    raw_fields,
    read,
    run1,
    server_ms,
    shard,
    token,
    wait_until,
    xrange,
)
from tests.support.redis_server import RedisServer, find_binary


async def delayed_records(r, sk) -> list[tuple[str, int, list[str]]]:
    """Every delayed record of the shard, soonest first: member, due score, stored fields."""
    out = []
    for member, score in await r.zrange(sk.delayed, 0, -1, withscores=True):
        out.append((member.decode(), int(score), json.loads(await r.hget(sk.jobs, member))))
    assert await r.hlen(sk.jobs) == len(out)  # one hash field per zset member, no orphan
    return out


def job_of(member: str) -> str:
    """The job id a delayed member was drawn for (``<job_id>:<token>``)."""
    job_id, sep, token = member.rpartition(":")
    assert sep, member
    assert len(token) == 16, member
    return job_id


async def test_immediate_job_is_xadded_with_every_field_name_in_order(aredis, prefix):
    sk = shard(prefix)
    assert await enqueue(aredis, sk, "j1") == [True]

    assert await raw_fields(aredis, sk.stream) == [list(FIELD_NAMES)]
    (entry,) = await xrange(aredis, sk.stream)
    values = [v.decode() if isinstance(v, bytes) else v for v in job_values("j1")]
    assert list(entry.fields.values()) == values
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0


async def test_delayed_job_goes_to_zset_and_hash_with_due_time_from_server_clock(aredis, prefix):
    sk = shard(prefix)
    before = await server_ms(aredis)
    assert await run1(aredis, ops.enqueue(sk, [item("d1", delay_ms=5_000)], dedup_window_ms=1))
    after = await server_ms(aredis)

    assert await aredis.xlen(sk.stream) == 0
    ((member, score, stored),) = await delayed_records(aredis, sk)
    assert job_of(member) == "d1"  # keyed by a token of its own, never the bare id
    assert before + 5_000 <= score <= after + 5_000
    assert stored[0::2] == list(FIELD_NAMES)
    assert stored[1] == str(score)  # 'due' is the score
    assert stored[3] == "d1"


async def test_second_add_with_same_id_in_window_returns_false_and_adds_nothing(aredis, prefix):
    sk = shard(prefix)
    call = ops.enqueue(sk, [item("same", dedup=True)], dedup_window_ms=60_000)
    assert await run1(aredis, call) == [True]
    assert await run1(aredis, call) == [False]

    assert await aredis.xlen(sk.stream) == 1
    ttl = await aredis.pttl(sk.dedup("same"))
    assert 0 < ttl <= 60_000


async def test_duplicate_delayed_add_does_not_touch_zset_or_hash(aredis, prefix):
    sk = shard(prefix)
    first = ops.enqueue(sk, [item("d", dedup=True, delay_ms=60_000)], dedup_window_ms=60_000)
    assert await run1(aredis, first) == [True]
    records = await delayed_records(aredis, sk)
    again = ops.enqueue(sk, [item("d", dedup=True, delay_ms=1_000)], dedup_window_ms=60_000)
    assert await run1(aredis, again) == [False]

    assert await delayed_records(aredis, sk) == records
    assert await aredis.xlen(sk.stream) == 0


async def test_dedup_marker_expires_after_its_window_and_the_id_can_be_added_again(aredis, prefix):
    sk = shard(prefix)
    call = ops.enqueue(sk, [item("short", dedup=True)], dedup_window_ms=30)
    assert await run1(aredis, call) == [True]

    async def marker_gone() -> bool:
        return not await aredis.exists(sk.dedup("short"))

    await wait_until(marker_gone, what="dedup marker expiry")
    assert await run1(aredis, call) == [True]
    assert await aredis.xlen(sk.stream) == 2


async def test_re_add_after_the_window_while_the_first_copy_waits_keeps_both_delayed_jobs(
    aredis, prefix
):
    sk = shard(prefix)
    first = ops.enqueue(sk, [item("j", dedup=True, delay_ms=60_000)], dedup_window_ms=30)
    assert await run1(aredis, first) == [True]

    async def marker_gone() -> bool:
        return not await aredis.exists(sk.dedup("j"))

    await wait_until(marker_gone, what="dedup marker expiry")
    second = ops.enqueue(
        sk, [item("j", dedup=True, delay_ms=90_000, attempt=2)], dedup_window_ms=30
    )
    assert await run1(aredis, second) == [True]

    records = await delayed_records(aredis, sk)
    assert [job_of(m) for m, _due, _f in records] == ["j", "j"]
    assert records[0][0] != records[1][0]
    # Each record is the add that wrote it, not the later one written over the first.
    assert [f[f.index("attempt") + 1] for _m, _due, f in records] == ["1", "2"]


async def test_delayed_adds_of_one_id_without_dedup_are_separate_records(aredis, prefix):
    sk = shard(prefix)
    call = ops.enqueue(
        sk, [item("x", delay_ms=5_000), item("x", delay_ms=5_000)], dedup_window_ms=1
    )
    assert await run1(aredis, call) == [True, True]
    assert [job_of(m) for m, _due, _f in await delayed_records(aredis, sk)] == ["x", "x"]


async def test_a_given_member_keys_the_record_and_a_re_sent_call_writes_it_once(aredis, prefix):
    sk = shard(prefix)
    member = ops.delayed_member("r")
    call = ops.enqueue(sk, [replace(item("r", delay_ms=5_000), member=member)], dedup_window_ms=1)
    assert await run1(aredis, call) == [True]
    assert await run1(aredis, call) == [True]  # the first reply was lost: sent again

    ((stored_member, _due, fields),) = await delayed_records(aredis, sk)
    assert stored_member == member
    assert fields[3] == "r"


def test_delayed_members_are_the_job_id_and_a_fresh_token() -> None:
    members = {ops.delayed_member("a:b") for _ in range(1000)}
    assert len(members) == 1000
    assert all(m.startswith("a:b:") and job_of(m) == "a:b" for m in members)


async def test_bulk_batch_mixes_dedup_plain_and_delayed_jobs_in_one_call(aredis, prefix):
    sk = shard(prefix)
    assert await run1(aredis, ops.enqueue(sk, [item("old", dedup=True)], dedup_window_ms=60_000))
    batch = [
        item("a", dedup=True),
        item("b"),
        item("c", dedup=True, delay_ms=60_000),
        item("a", dedup=True),  # duplicate inside the batch
        item("d", delay_ms=60_000),
        item("old", dedup=True),  # duplicate of an earlier add
        item("b"),  # no dedup: a second entry
    ]
    reply = await run1(aredis, ops.enqueue(sk, batch, dedup_window_ms=60_000))

    assert reply == [True, True, True, False, True, False, True]
    ids = [e.fields["id"] for e in await xrange(aredis, sk.stream)]
    assert ids == ["old", "a", "b", "b"]
    assert sorted(job_of(m) for m, _due, _f in await delayed_records(aredis, sk)) == ["c", "d"]
    for jid in ("a", "c", "old"):
        assert await aredis.exists(sk.dedup(jid))
    for jid in ("b", "d"):
        assert not await aredis.exists(sk.dedup(jid))


async def test_one_pipeline_runs_calls_for_several_shards(aredis, prefix):
    s0, s1 = shard(prefix, index=0), shard(prefix, index=1)
    replies = await run_calls(
        aredis,
        [
            ops.enqueue(s0, [item("x")], dedup_window_ms=1),
            ops.enqueue(s1, [item("y"), item("z")], dedup_window_ms=1),
        ],
    )
    assert replies == [[True], [True, True]]
    assert await aredis.xlen(s0.stream) == 1
    assert await aredis.xlen(s1.stream) == 2


def test_enqueue_wrapper_refuses_values_of_the_wrong_length(prefix):
    bad = ops.EnqueueItem("x", ["only", "three", "values"])
    with pytest.raises(ValueError, match="field values"):
        ops.enqueue(shard(prefix), [bad], dedup_window_ms=1)


# --- out of memory ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oom_server() -> Iterator[RedisServer]:
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    server = RedisServer(
        binary, extra=["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]
    ).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
async def oom_redis(oom_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=oom_server.port)
    yield client
    await client.aclose()


async def _headroom(r: aioredis.Redis, nbytes: int) -> None:
    """Move maxmemory to just above what is in use: an empty Redis 7 already uses ~0.95 MB, so
    a fixed 1 MB leaves too little room to set up the stream the test then drains."""
    used = int((await r.info("memory"))["used_memory"])
    await r.config_set("maxmemory", used + nbytes)


async def _fill(r: aioredis.Redis, prefix: str) -> None:
    """Write filler until Redis refuses with OOM, then pin maxmemory a little below what is
    used: right at the limit, used memory jitters (client buffers) around it by a few KB."""
    chunk = b"x" * 16_384
    for i in range(10_000):
        try:
            await r.set(f"{prefix}:fill:{i}", chunk)
        except OutOfMemoryError:
            break
    else:
        raise AssertionError("redis never reached maxmemory")
    used = int((await r.info("memory"))["used_memory"])
    await r.config_set("maxmemory", used - 64 * 1024)


async def test_enqueue_under_oom_raises_and_writes_nothing_while_workers_keep_draining(
    oom_redis, prefix
):
    r = oom_redis
    sk = shard(prefix)
    await _headroom(r, 256 * 1024)
    await make_group(r, sk)
    await enqueue(r, sk, "done-me", "stalled")
    e1, e2 = await read(r, sk, "w1")
    await _fill(r, prefix)

    for it in (item("new", dedup=True), item("new2", dedup=True, delay_ms=1_000), item("p")):
        with pytest.raises(RedisOutOfMemory):
            await run1(r, ops.enqueue(sk, [it], dedup_window_ms=60_000))
    with pytest.raises(RedisOutOfMemory):
        await run1(r, ops.enqueue(sk, [item("m1", dedup=True), item("m2")], dedup_window_ms=60_000))
    assert not await r.exists(sk.dedup("new"))
    assert not await r.exists(sk.dedup("new2"))
    assert not await r.exists(sk.dedup("m1"))
    assert await r.xlen(sk.stream) == 2
    assert await r.zcard(sk.delayed) == 0
    assert await r.hlen(sk.jobs) == 0

    # Draining still works: complete (XACK + XDEL) and reclaim (XAUTOCLAIM).
    applied = [ops.SettleStatus.APPLIED]
    assert await run1(r, ops.complete(sk, "g", "w1", [e1.id], token=token())) == applied
    assert await r.xlen(sk.stream) == 1
    reclaim = ops.reclaim(sk, "g", "w2", min_idle_ms=0, count=10, max_stalled_count=5, dead_cap=0)
    page = await run1(r, reclaim)
    assert [e.entry_id for e in page.entries] == [e2.id]
    assert (await pending(r, sk))[e2.id].consumer == "w2"
    assert await run1(r, ops.complete(sk, "g", "w2", [e2.id], token=token())) == applied
    assert await r.xlen(sk.stream) == 0
    assert await pending(r, sk) == {}


async def test_a_full_bulk_batch_of_500_jobs_runs_in_one_call(aredis, prefix):
    sk = shard(prefix)
    items = [
        item(f"j{i}", dedup=i % 2 == 0, delay_ms=60_000 if i % 5 == 0 else 0) for i in range(500)
    ]
    assert await run1(aredis, ops.enqueue(sk, items, dedup_window_ms=60_000)) == [True] * 500
    assert await aredis.xlen(sk.stream) == 400
    assert await aredis.zcard(sk.delayed) == 100


async def test_plain_xadd_fast_path_writes_exactly_the_entry_the_script_writes(aredis, prefix):
    """A single ready add without job_id skips the script; workers must not tell them apart."""
    by_script, by_xadd = shard(prefix, index=0), shard(prefix, index=1)
    await run1(aredis, ops.enqueue(by_script, [item("same")], dedup_window_ms=1000))
    await run1(aredis, ops.enqueue_ready(by_xadd, item("same")))

    assert await raw_fields(aredis, by_script.stream) == await raw_fields(aredis, by_xadd.stream)
    (a,) = await xrange(aredis, by_script.stream)
    (b,) = await xrange(aredis, by_xadd.stream)
    assert a.fields == b.fields


def test_plain_xadd_fast_path_refuses_jobs_that_need_the_script() -> None:
    sk = shard("p")
    for needs_script in (item("d", dedup=True), item("l", delay_ms=5)):
        with pytest.raises(ValueError, match="needs the enqueue script"):
            ops.enqueue_ready(sk, needs_script)


@pytest.mark.parametrize("which", ["stream", "delayed", "jobs"])
async def test_a_key_of_another_type_is_refused_before_any_write(
    aredis: aioredis.Redis, prefix: str, which: str
) -> None:
    sk = shard(prefix)
    await aredis.set(getattr(sk, which), "not a queue key")
    call = ops.enqueue(sk, [item("d", dedup=True), item("l", delay_ms=60_000)],
                       dedup_window_ms=60_000)
    with pytest.raises(Exception, match="WRONGTYPE") as info:
        await run1(aredis, call)
    assert f"shard's {which} key" in str(info.value)
    # Nothing half-written: no dedup marker without its job, no delayed record.
    assert await aredis.exists(sk.dedup("d")) == 0
    others = {"stream", "delayed", "jobs"} - {which}
    for name in others:
        assert await aredis.exists(getattr(sk, name)) == 0, name
