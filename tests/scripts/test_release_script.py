"""release.lua: hand owned entries back at the tail (same fields, attempt unchanged), fenced;
a status per id, and a re-sent call (same token) answers what the first send did."""

from __future__ import annotations

import pytest

from streamq import ops
from streamq.envelope import FIELD_NAMES, encode_fields
from streamq.errors import RedisOutOfMemory
from streamq.keys import ShardKeys
from streamq.ops import SettleStatus
from tests.scripts.helpers import (
    GROUP,
    delivered,
    enqueue,
    make_group,
    out_of_memory,
    own_redis,
    pending,
    raw_fields,
    read,
    run1,
    shard,
    starts,
    steal,
    token,
    xrange,
)

APPLIED, OTHER_OWNER, GONE = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER, SettleStatus.GONE


def _release(sk: ShardKeys, consumer: str, ids: list[str], tok: str | None = None) -> ops.Call:
    return ops.release(sk, GROUP, consumer, ids, token=tok or token())


def _reclaim(sk: ShardKeys, consumer: str) -> ops.Call:
    return ops.reclaim(
        sk, GROUP, consumer, min_idle_ms=0, count=100, max_stalled_count=1, dead_cap=0
    )


async def test_release_readds_at_tail_with_same_fields_then_acks_and_deletes(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await enqueue(aredis, sk, "j1", "j2")
    (e1,) = await read(aredis, sk, "w1", count=1)
    assert e1.fields["due"] == ""

    assert await run1(aredis, _release(sk, "w1", [e1.id])) == [APPLIED]

    entries = await xrange(aredis, sk.stream)
    assert [e.fields["id"] for e in entries] == ["j2", "j1"]
    moved = entries[1]
    assert moved.id > entries[0].id
    assert moved.id != e1.id
    # Same fields in the same order; only the empty 'due' is filled with the original entry ms.
    assert (await raw_fields(aredis, sk.stream))[1] == list(FIELD_NAMES)
    assert moved.fields == {**e1.fields, "due": e1.id.split("-")[0]}
    assert moved.fields["attempt"] == "1"
    assert await pending(aredis, sk) == {}


async def test_release_keeps_a_due_value_that_is_already_set(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    values = encode_fields(
        job_id="j", name="n", timestamp_ms=1, payload_json="{}", attempt=3, due_ms=1234
    )
    await run1(aredis, ops.enqueue(sk, [ops.EnqueueItem("j", values)], dedup_window_ms=1))
    (e,) = await read(aredis, sk, "w1")

    assert await run1(aredis, _release(sk, "w1", [e.id])) == [APPLIED]
    (moved,) = await xrange(aredis, sk.stream)
    assert moved.fields == e.fields
    assert (moved.fields["due"], moved.fields["attempt"]) == ("1234", "3")


async def test_released_entry_is_delivered_to_another_worker_at_once(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await run1(aredis, _release(sk, "w1", [e.id]))

    (again,) = await read(aredis, sk, "w2")
    assert again.fields["id"] == "j1"
    p = (await pending(aredis, sk))[again.id]
    assert (p.consumer, p.deliveries) == ("w2", 1)


async def test_stale_worker_release_reports_other_owner_and_leaves_entry_to_new_owner(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    assert await run1(aredis, _release(sk, "w1", [e.id])) == [OTHER_OWNER]
    assert [x.id for x in await xrange(aredis, sk.stream)] == [e.id]
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_release_batch_moves_owned_entries_in_order_and_reports_each_status(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    reply = await run1(aredis, _release(sk, "w1", [a.id, b.id, c.id, "0-1"]))

    assert reply == [APPLIED, OTHER_OWNER, APPLIED, GONE]
    assert [e.fields["id"] for e in await xrange(aredis, sk.stream)] == ["b", "a", "c"]
    assert list(await pending(aredis, sk)) == [b.id]


async def test_release_of_an_entry_deleted_while_pending_reports_gone_and_leaves_it_for_reclaim(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await aredis.xdel(sk.stream, e.id)

    assert await run1(aredis, _release(sk, "w1", [e.id])) == [GONE]
    assert await aredis.xlen(sk.stream) == 0
    assert list(await pending(aredis, sk)) == [e.id]
    page = await run1(aredis, _reclaim(sk, "w2"))
    assert page.lost == [e.id]
    (dead,) = await xrange(aredis, sk.dead)
    assert (dead.fields["reason"], dead.fields["entry"]) == ("lost_payload", e.id)


async def test_a_resent_release_answers_its_first_reply_and_adds_no_second_copy(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    tok = token()
    assert await run1(aredis, _release(sk, "w1", [e.id], tok)) == [APPLIED]

    assert await run1(aredis, _release(sk, "w1", [e.id], tok)) == [APPLIED]
    assert await aredis.xlen(sk.stream) == 1
    assert await run1(aredis, _release(sk, "w1", [e.id])) == [GONE]  # another call
    assert 0 < await aredis.pttl(sk.settled(tok)) <= ops.SETTLE_MEMO_MS


async def test_release_removes_the_starts_field_so_the_new_entry_starts_afresh(aredis, prefix):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "a", "b")
    await aredis.hset(sk.starts, mapping={a.id: 2, b.id: 2})
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    assert await run1(aredis, _release(sk, "w1", [a.id, b.id])) == [APPLIED, OTHER_OWNER]
    assert await starts(aredis, sk) == {b.id: 2}


async def test_release_under_oom_fails_with_nothing_changed(prefix):
    async with own_redis() as r:
        sk = shard(prefix)
        a, b = await delivered(r, sk, "w1", "a", "b")
        await r.hset(sk.starts, a.id, 2)
        await out_of_memory(r)
        tok = token()

        with pytest.raises(RedisOutOfMemory):
            await run1(r, _release(sk, "w1", [a.id, b.id], tok))

        assert [x.id for x in await xrange(r, sk.stream)] == [a.id, b.id]
        assert {i: p.consumer for i, p in (await pending(r, sk)).items()} == {
            a.id: "w1",
            b.id: "w1",
        }
        assert await starts(r, sk) == {a.id: 2}
        assert not await r.exists(sk.settled(tok))
