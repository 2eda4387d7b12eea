"""renew.lua: a fenced XCLAIM ... JUSTID to self that resets idle time, never steals."""

from __future__ import annotations

from streamq import ops
from tests.scripts.helpers import (
    GROUP,
    delivered,
    pending,
    run1,
    shard,
    steal,
    token,
    wait_idle,
)


def _reclaim(sk, consumer, min_idle_ms):
    return ops.reclaim(
        sk,
        GROUP,
        consumer,
        min_idle_ms=min_idle_ms,
        count=100,
        max_stalled_count=1,
        dead_cap=0,
    )


async def test_renew_resets_idle_time_and_does_not_raise_delivery_count(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await wait_idle(aredis, sk, [e.id], 60)

    assert await run1(aredis, ops.renew(sk, GROUP, "w1", [e.id])) == []
    p = (await pending(aredis, sk))[e.id]
    assert p.idle_ms < 60
    assert (p.consumer, p.deliveries) == ("w1", 1)


async def test_renewed_entry_is_not_reclaimed_by_an_idle_threshold_it_had_passed(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await wait_idle(aredis, sk, [e.id], 60)
    await run1(aredis, ops.renew(sk, GROUP, "w1", [e.id]))

    page = await run1(aredis, _reclaim(sk, "w2", 60_000))
    assert page.entries == []
    assert (await pending(aredis, sk))[e.id].consumer == "w1"


async def test_stale_worker_renew_does_not_steal_the_entry_back(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await steal(aredis, sk, "w2") == [e.id]

    assert await run1(aredis, ops.renew(sk, GROUP, "w1", [e.id])) == [e.id]
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_renew_batch_reports_completed_and_foreign_ids_and_renews_the_rest(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [b.id])
    await run1(aredis, ops.complete(sk, GROUP, "w1", [c.id], token=token()))
    await wait_idle(aredis, sk, [a.id], 30)

    assert await run1(aredis, ops.renew(sk, GROUP, "w1", [a.id, b.id, c.id])) == [b.id, c.id]
    p = await pending(aredis, sk)
    assert p[a.id].idle_ms < 30
    assert p[a.id].deliveries == 1
    assert p[b.id].consumer == "w2"
    assert c.id not in p


async def test_renew_of_an_entry_deleted_while_pending_keeps_it_pending_for_reclaim_to_record(
    aredis, prefix
):
    # XCLAIM on Redis 7 silently drops a deleted entry from the PEL: renewing it that way would
    # lose the job without a trace if its worker then died.
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await aredis.xdel(sk.stream, e.id)

    assert await run1(aredis, ops.renew(sk, GROUP, "w1", [e.id])) == []
    assert (await pending(aredis, sk))[e.id].consumer == "w1"
    page = await run1(aredis, _reclaim(sk, "w2", 0))
    assert page.lost == [e.id]
