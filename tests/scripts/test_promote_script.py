"""promote.lua: due delayed jobs move to the stream, oldest first, bounded, exactly once."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import redis.asyncio as aioredis

from streamq import ops
from streamq._redis import run_calls
from streamq.envelope import encode_fields, flat_fields
from tests.scripts.helpers import item, job_values, run1, server_ms, shard, wait_until, xrange


async def _delayed(r, sk, due_ms: dict[str, int]) -> dict[str, str]:
    """Enqueue delayed jobs through the script, then pin their due times (past or future).

    Returns each job's delayed member (the zset member and jobs hash field of its record).
    """
    members = {j: ops.delayed_member(j) for j in due_ms}
    items = [replace(item(j, delay_ms=3_600_000), member=members[j]) for j in due_ms]
    assert all(await run1(r, ops.enqueue(sk, items, dedup_window_ms=1)))
    await r.zadd(sk.delayed, {members[j]: t for j, t in due_ms.items()}, xx=True)
    return members


async def _member(r, sk, job_id: str) -> str:
    """The delayed member of the one record of ``job_id``."""
    (member,) = [m.decode() for m in await r.zrange(sk.delayed, 0, -1) if _job(m) == job_id]
    return member


def _job(member: bytes | str) -> str:
    text = member.decode() if isinstance(member, bytes) else member
    return text.rsplit(":", 1)[0]


async def test_only_due_jobs_move_oldest_first_with_due_set_to_their_score(aredis, prefix):
    sk = shard(prefix)
    now = await server_ms(aredis)
    members = await _delayed(
        aredis,
        sk,
        {"late": now - 1_000, "later": now - 10, "first": now - 5_000, "future": now + 60_000},
    )

    result = await run1(aredis, ops.promote(sk))

    assert result.moved == 3
    assert result.next_due_ms == now + 60_000
    assert now <= result.now_ms <= await server_ms(aredis)
    entries = await xrange(aredis, sk.stream)
    assert [e.fields["id"] for e in entries] == ["first", "late", "later"]
    assert [int(e.fields["due"]) for e in entries] == [now - 5_000, now - 1_000, now - 10]
    assert await aredis.zrange(sk.delayed, 0, -1) == [members["future"].encode()]
    assert await aredis.hkeys(sk.jobs) == [members["future"].encode()]


async def test_promote_is_bounded_by_its_limit_and_reports_the_next_due_time(aredis, prefix):
    sk = shard(prefix)
    now = await server_ms(aredis)
    await _delayed(aredis, sk, {f"j{i}": now - 1_000 + i for i in range(5)})

    result = await run1(aredis, ops.promote(sk, limit=2))

    assert result.moved == 2
    assert result.next_due_ms == now - 1_000 + 2  # already due: the caller should go again
    assert [e.fields["id"] for e in await xrange(aredis, sk.stream)] == ["j0", "j1"]
    assert await aredis.zcard(sk.delayed) == 3


async def test_promote_with_nothing_delayed_moves_nothing_and_reports_no_next_due(aredis, prefix):
    sk = shard(prefix)
    result = await run1(aredis, ops.promote(sk))
    assert (result.moved, result.next_due_ms) == (0, None)
    assert await aredis.exists(sk.stream) == 0


async def test_job_with_a_future_due_time_is_not_moved(aredis, prefix):
    sk = shard(prefix)
    assert await run1(aredis, ops.enqueue(sk, [item("soon", delay_ms=60_000)], dedup_window_ms=1))
    due = int(await aredis.zscore(sk.delayed, await _member(aredis, sk, "soon")))

    result = await run1(aredis, ops.promote(sk))
    assert (result.moved, result.next_due_ms) == (0, due)
    assert await aredis.xlen(sk.stream) == 0


async def test_a_delayed_job_becomes_ready_once_the_server_clock_passes_its_due_time(
    aredis, prefix
):
    sk = shard(prefix)
    assert await run1(aredis, ops.enqueue(sk, [item("d", delay_ms=40)], dedup_window_ms=1))
    due = int(await aredis.zscore(sk.delayed, await _member(aredis, sk, "d")))

    async def promoted() -> bool:
        result = await run1(aredis, ops.promote(sk))
        assert result.moved == 1 or result.now_ms < due  # never before its due time
        return result.moved == 1

    await wait_until(promoted, what="the delayed job to be promoted")
    (e,) = await xrange(aredis, sk.stream)
    assert int(e.fields["due"]) == due


async def test_orphan_zset_member_without_a_stored_job_is_dropped_not_counted(aredis, prefix):
    sk = shard(prefix)
    await aredis.zadd(sk.delayed, {"ghost": 1})
    result = await run1(aredis, ops.promote(sk))
    assert result.moved == 0
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.exists(sk.stream) == 0


async def test_racing_promoters_move_each_due_job_exactly_once_and_never_a_future_one(
    redis_server, prefix
):
    clients = [aioredis.Redis(port=redis_server.port) for _ in range(3)]
    try:
        r = clients[0]
        sk = shard(prefix)
        now = await server_ms(r)
        due = {f"due{i}": now - 10_000 + i for i in range(300)}
        future = {f"fut{i}": now + 600_000 + i for i in range(40)}
        await _delayed(r, sk, {**due, **future})

        results = await asyncio.gather(
            *(
                run_calls(c, [ops.promote(sk, limit=7), ops.promote(sk, limit=5)])
                for _ in range(20)
                for c in clients
            )
        )

        moved = sum(res.moved for pair in results for res in pair)
        assert moved == len(due)
        ids = [e.fields["id"] for e in await xrange(r, sk.stream)]
        assert sorted(ids) == sorted(due)  # each due job once, no future job
        assert ids == sorted(due, key=due.__getitem__)  # oldest first across all callers
        assert sorted(_job(m) for m in await r.zrange(sk.delayed, 0, -1)) == sorted(future)
        assert await r.hlen(sk.jobs) == len(future)
    finally:
        for c in clients:
            await c.aclose()


async def test_promoted_fields_round_trip_byte_for_byte_through_the_jobs_hash(aredis, prefix):
    sk = shard(prefix)
    payload = '{"s":"quote \\" slash / back \\\\ nl \\n","u":"héllo ✓ 🚀","e":""}'.encode()
    values = encode_fields(
        job_id="odd/id ✓",
        name="work",
        timestamp_ms=1_700_000_000_123,
        payload_json=payload,
        attempt=4,
        retry_baggage={"errors": [{"message": "tab\there"}]},
        trace_context={"traceparent": "00-abc-def-01"},
    )
    item_ = ops.EnqueueItem("odd/id ✓", values, delay_ms=3_600_000)
    assert await run1(aredis, ops.enqueue(sk, [item_], dedup_window_ms=1))
    await aredis.zadd(sk.delayed, {await _member(aredis, sk, "odd/id ✓"): 1}, xx=True)

    assert (await run1(aredis, ops.promote(sk))).moved == 1
    ((_eid, fields),) = await aredis.xrange(sk.stream)
    expected = [v if isinstance(v, bytes) else v.encode() for v in values]
    expected[0] = b"1"  # due: the score
    assert list(fields.values()) == expected


async def test_two_delayed_records_of_one_job_id_are_both_promoted(aredis, prefix):
    """A re-add after the dedup window while the first copy waits: two jobs, two entries."""
    sk = shard(prefix)
    first = ops.enqueue(sk, [item("j", dedup=True, delay_ms=3_600_000)], dedup_window_ms=1)
    assert await run1(aredis, first) == [True]
    await aredis.delete(sk.dedup("j"))  # the window is over
    second = ops.enqueue(
        sk, [item("j", dedup=True, delay_ms=3_600_000, attempt=2)], dedup_window_ms=1
    )
    assert await run1(aredis, second) == [True]
    members = [m.decode() for m in await aredis.zrange(sk.delayed, 0, -1)]
    await aredis.zadd(sk.delayed, dict.fromkeys(members, 1), xx=True)

    assert (await run1(aredis, ops.promote(sk))).moved == 2
    entries = await xrange(aredis, sk.stream)
    assert sorted((e.fields["id"], e.fields["attempt"]) for e in entries) == [
        ("j", "1"),
        ("j", "2"),
    ]
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0


async def test_a_record_keyed_by_the_bare_job_id_does_not_touch_a_newer_copy(aredis, prefix):
    """Older workers store a retry under the bare job id; the producer's copy of the same id
    has a member of its own, so neither overwrites the other and both are promoted."""
    sk = shard(prefix)
    assert await run1(aredis, ops.enqueue(sk, [item("j", delay_ms=3_600_000)], dedup_window_ms=1))
    member = await _member(aredis, sk, "j")
    await aredis.zadd(sk.delayed, {member: 1}, xx=True)
    retried = job_values("j", attempt=3)
    retried[0] = "5"
    await aredis.zadd(sk.delayed, {"j": 5})
    stored = [v.decode() if isinstance(v, bytes) else v for v in flat_fields(retried)]
    await aredis.hset(sk.jobs, "j", json.dumps(stored))

    assert (await run1(aredis, ops.promote(sk))).moved == 2
    entries = await xrange(aredis, sk.stream)
    assert [(e.fields["id"], e.fields["attempt"]) for e in entries] == [("j", "1"), ("j", "3")]
