"""drop_consumer.lua: delete a consumer only when it has nothing pending, atomically."""

from __future__ import annotations

from streamq import ops
from tests.scripts.helpers import GROUP, delivered, make_group, pending, run1, shard


async def _consumers(r, sk) -> dict[str, int]:
    return {c["name"].decode(): c["pending"] for c in await r.xinfo_consumers(sk.stream, GROUP)}


async def test_consumer_with_nothing_pending_is_removed(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id], token="t1"))
    await aredis.xgroup_createconsumer(sk.stream, GROUP, "w2")  # w2 never got anything
    assert await _consumers(aredis, sk) == {"w1": 0, "w2": 0}

    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "w1")) is True
    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "w2")) is True
    assert await _consumers(aredis, sk) == {}


async def test_consumer_with_pending_entries_is_refused_and_keeps_them(aredis, prefix):
    sk = shard(prefix)
    a, _b = await delivered(aredis, sk, "w1", "a", "b")
    await run1(aredis, ops.complete(sk, GROUP, "w1", [a.id], token="t2"))

    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "w1")) is False
    assert await _consumers(aredis, sk) == {"w1": 1}
    assert [p.consumer for p in (await pending(aredis, sk)).values()] == ["w1"]


async def test_dropping_only_the_named_consumer_leaves_others(aredis, prefix):
    sk = shard(prefix)
    await delivered(aredis, sk, "w1", "a")
    await aredis.xgroup_createconsumer(sk.stream, GROUP, "w2")

    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "w2")) is True
    assert await _consumers(aredis, sk) == {"w1": 1}


async def test_unknown_consumer_group_or_stream_counts_as_already_gone(aredis, prefix):
    sk = shard(prefix)
    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "w1")) is True  # no stream
    await make_group(aredis, sk)
    assert await run1(aredis, ops.drop_consumer(sk, GROUP, "nobody")) is True
    assert await run1(aredis, ops.drop_consumer(sk, "other-group", "w1")) is True
