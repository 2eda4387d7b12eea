"""complete.lua: XACK + XDEL only for the entries still pending for this consumer."""

from __future__ import annotations

from streamq import ops
from tests.scripts.helpers import GROUP, delivered, pending, run1, shard, steal


async def test_owner_complete_acks_and_deletes_the_entry(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id])) == []
    assert await pending(aredis, sk) == {}
    assert await aredis.xlen(sk.stream) == 0


async def test_complete_by_another_consumer_is_refused_and_entry_left_pending(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, ops.complete(sk, GROUP, "w2", [e.id])) == [e.id]
    p = await pending(aredis, sk)
    assert (p[e.id].consumer, p[e.id].deliveries) == ("w1", 1)
    assert await aredis.xlen(sk.stream) == 1


async def test_stale_worker_complete_after_reclaim_is_refused_and_entry_stays_pending_for_new_owner(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await steal(aredis, sk, "w2") == [e.id]

    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id])) == [e.id]
    p = await pending(aredis, sk)
    assert (p[e.id].consumer, p[e.id].deliveries) == ("w2", 2)
    assert await aredis.xlen(sk.stream) == 1
    # The new owner can still settle it.
    assert await run1(aredis, ops.complete(sk, GROUP, "w2", [e.id])) == []
    assert await pending(aredis, sk) == {}
    assert await aredis.xlen(sk.stream) == 0


async def test_complete_batch_settles_owned_ids_and_reports_only_the_lost_ones(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [a.id, b.id, c.id])) == [b.id]
    assert list(await pending(aredis, sk)) == [b.id]
    assert [x[0].decode() for x in await aredis.xrange(sk.stream)] == [b.id]


async def test_completing_twice_or_an_unknown_id_reports_it_without_error(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id])) == []

    reply = await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id, "0-1", "not-an-id"]))
    assert reply == [e.id, "0-1", "not-an-id"]


async def test_complete_of_an_entry_never_read_is_refused_and_keeps_it_in_the_stream(
    aredis, prefix
):
    sk = shard(prefix)
    await delivered(aredis, sk, "w1", "j1")
    unread = (await aredis.xadd(sk.stream, {"id": "x"})).decode()

    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [unread])) == [unread]
    assert await aredis.xlen(sk.stream) == 2
