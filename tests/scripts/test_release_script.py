"""release.lua: hand owned entries back at the tail (same fields, attempt unchanged), fenced."""

from __future__ import annotations

from streamq import ops
from streamq.envelope import FIELD_NAMES, encode_fields
from tests.scripts.helpers import (
    GROUP,
    delivered,
    enqueue,
    make_group,
    pending,
    raw_fields,
    read,
    run1,
    shard,
    steal,
    xrange,
)


async def test_release_readds_at_tail_with_same_fields_then_acks_and_deletes(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await enqueue(aredis, sk, "j1", "j2")
    (e1,) = await read(aredis, sk, "w1", count=1)
    assert e1.fields["due"] == ""

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [e1.id])) == []

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

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [e.id])) == []
    (moved,) = await xrange(aredis, sk.stream)
    assert moved.fields == e.fields
    assert (moved.fields["due"], moved.fields["attempt"]) == ("1234", "3")


async def test_released_entry_is_delivered_to_another_worker_at_once(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await run1(aredis, ops.release(sk, GROUP, "w1", [e.id]))

    (again,) = await read(aredis, sk, "w2")
    assert again.fields["id"] == "j1"
    p = (await pending(aredis, sk))[again.id]
    assert (p.consumer, p.deliveries) == ("w2", 1)


async def test_stale_worker_release_is_refused_and_leaves_entry_to_new_owner(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [e.id])) == [e.id]
    assert [x.id for x in await xrange(aredis, sk.stream)] == [e.id]
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_release_batch_moves_owned_entries_in_order_and_reports_the_rest(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [a.id, b.id, c.id])) == [b.id]
    assert [e.fields["id"] for e in await xrange(aredis, sk.stream)] == ["b", "a", "c"]
    assert list(await pending(aredis, sk)) == [b.id]


async def test_release_of_an_entry_deleted_while_pending_leaves_it_for_reclaim_to_record(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await aredis.xdel(sk.stream, e.id)

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [e.id])) == []
    assert await aredis.xlen(sk.stream) == 0
    assert list(await pending(aredis, sk)) == [e.id]
    page = await run1(aredis, ops.reclaim(sk, GROUP, "w2", min_idle_ms=0))
    assert page.lost == [e.id]
    (dead,) = await xrange(aredis, sk.dead)
    assert (dead.fields["reason"], dead.fields["entry"]) == ("lost_payload", e.id)
