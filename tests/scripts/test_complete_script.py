"""complete.lua: XACK + XDEL only for the entries still pending for this consumer; a status per
id, and a re-sent call (same token) answers what the first send did."""

from __future__ import annotations

import asyncio

from streamq import ops
from streamq.keys import ShardKeys
from streamq.ops import SettleStatus
from tests.scripts.helpers import (
    GROUP,
    delivered,
    out_of_memory,
    own_redis,
    pending,
    run1,
    shard,
    starts,
    steal,
    token,
    wait_until,
)

APPLIED, OTHER_OWNER, GONE = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER, SettleStatus.GONE


def _complete(sk: ShardKeys, consumer: str, ids: list[str], tok: str | None = None) -> ops.Call:
    return ops.complete(sk, GROUP, consumer, ids, token=tok or token())


async def test_owner_complete_acks_and_deletes_the_entry(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, _complete(sk, "w1", [e.id])) == [APPLIED]
    assert await pending(aredis, sk) == {}
    assert await aredis.xlen(sk.stream) == 0


async def test_complete_by_another_consumer_reports_other_owner_and_leaves_entry_pending(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, _complete(sk, "w2", [e.id])) == [OTHER_OWNER]
    p = await pending(aredis, sk)
    assert (p[e.id].consumer, p[e.id].deliveries) == ("w1", 1)
    assert await aredis.xlen(sk.stream) == 1


async def test_stale_worker_complete_after_reclaim_reports_other_owner_and_new_owner_settles(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await steal(aredis, sk, "w2") == [e.id]

    assert await run1(aredis, _complete(sk, "w1", [e.id])) == [OTHER_OWNER]
    p = await pending(aredis, sk)
    assert (p[e.id].consumer, p[e.id].deliveries) == ("w2", 2)
    assert await aredis.xlen(sk.stream) == 1
    assert await run1(aredis, _complete(sk, "w2", [e.id])) == [APPLIED]
    assert await pending(aredis, sk) == {}
    assert await aredis.xlen(sk.stream) == 0


async def test_complete_batch_reports_one_status_per_id_in_order(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    reply = await run1(aredis, _complete(sk, "w1", [a.id, b.id, c.id, "0-1"]))

    assert reply == [APPLIED, OTHER_OWNER, APPLIED, GONE]
    assert list(await pending(aredis, sk)) == [b.id]
    assert [x[0].decode() for x in await aredis.xrange(sk.stream)] == [b.id]


async def test_completing_a_settled_unknown_or_malformed_id_reports_gone_without_error(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, _complete(sk, "w1", [e.id])) == [APPLIED]

    reply = await run1(aredis, _complete(sk, "w1", [e.id, "0-1", "not-an-id"]))
    assert reply == [GONE, GONE, GONE]


async def test_complete_of_an_entry_never_read_reports_gone_and_keeps_it_in_the_stream(
    aredis, prefix
):
    sk = shard(prefix)
    await delivered(aredis, sk, "w1", "j1")
    unread = (await aredis.xadd(sk.stream, {"id": "x"})).decode()

    assert await run1(aredis, _complete(sk, "w1", [unread])) == [GONE]
    assert await aredis.xlen(sk.stream) == 2


async def test_a_resent_complete_answers_applied_again_not_gone(aredis, prefix):
    # The first reply was lost (connection dropped after the script ran): the runtime sends
    # the same call again and must not read the missing entry as a lost lock.
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    tok = token()
    assert await run1(aredis, _complete(sk, "w1", [e.id], tok)) == [APPLIED]

    assert await run1(aredis, _complete(sk, "w1", [e.id], tok)) == [APPLIED]
    assert await run1(aredis, _complete(sk, "w1", [e.id])) == [GONE]  # another call


async def test_a_resent_complete_answers_its_first_reply_after_the_state_changed(aredis, prefix):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "a", "b")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])
    tok = token()
    assert await run1(aredis, _complete(sk, "w1", [a.id, b.id], tok)) == [APPLIED, OTHER_OWNER]
    assert await run1(aredis, _complete(sk, "w2", [b.id])) == [APPLIED]

    assert await run1(aredis, _complete(sk, "w1", [a.id, b.id], tok)) == [APPLIED, OTHER_OWNER]


async def test_the_memo_lives_settle_memo_ms_in_the_shard_slot_then_the_state_answers(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    tok = token()
    assert await run1(aredis, _complete(sk, "w1", [e.id], tok)) == [APPLIED]

    memo = sk.settled(tok)
    assert sk.tag in memo
    assert ops.SETTLE_MEMO_MS - 10_000 < await aredis.pttl(memo) <= ops.SETTLE_MEMO_MS
    await aredis.pexpire(memo, 1)
    await wait_until(lambda: _gone(aredis, memo), what="the memo to expire")

    assert await run1(aredis, _complete(sk, "w1", [e.id], tok)) == [GONE]


async def _gone(r, key: str) -> bool:
    return not await r.exists(key)


async def test_complete_removes_the_starts_field_of_what_it_settles_only(aredis, prefix):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "a", "b")
    await aredis.hset(sk.starts, mapping={a.id: 2, b.id: 3})
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])

    assert await run1(aredis, _complete(sk, "w1", [a.id, b.id])) == [APPLIED, OTHER_OWNER]
    assert await starts(aredis, sk) == {b.id: 3}


async def test_a_batch_over_500_ids_settles_every_one(aredis, prefix):
    sk = shard(prefix)
    entries = await delivered(aredis, sk, "w1", *[f"j{i}" for i in range(1_201)])
    await aredis.hset(sk.starts, mapping={e.id: 2 for e in entries})

    reply = await run1(aredis, _complete(sk, "w1", [e.id for e in entries]))

    assert reply == [APPLIED] * 1_201
    assert await aredis.xlen(sk.stream) == 0
    assert await pending(aredis, sk) == {}
    assert await starts(aredis, sk) == {}


async def test_complete_under_oom_still_acks_and_deletes(prefix):
    async with own_redis() as r:
        sk = shard(prefix)
        a, b = await delivered(r, sk, "w1", "a", "b")
        await r.hset(sk.starts, a.id, 2)
        await out_of_memory(r)

        assert await run1(r, _complete(sk, "w1", [a.id])) == [APPLIED]
        assert list(await pending(r, sk)) == [b.id]
        assert await r.xlen(sk.stream) == 1
        assert await starts(r, sk) == {}
        # A call that applies nothing writes only its memo, which is refused: it still answers.
        tok = token()
        assert await run1(r, _complete(sk, "w1", [a.id], tok)) == [GONE]
        assert not await r.exists(sk.settled(tok))
        assert await run1(r, _complete(sk, "w1", [b.id])) == [APPLIED]
        assert await r.xlen(sk.stream) == 0


async def test_concurrent_resends_of_one_call_answer_the_same(aredis, prefix):
    sk = shard(prefix)
    entries = await delivered(aredis, sk, "w1", *[f"j{i}" for i in range(20)])
    ids = [e.id for e in entries]
    tok = token()

    replies = await asyncio.gather(*[run1(aredis, _complete(sk, "w1", ids, tok)) for _ in range(5)])

    assert replies == [[APPLIED] * 20] * 5
