"""limiter.lua: a fixed window on the server clock, shared by every caller, with refunds."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import redis.asyncio as aioredis

from streamq import ops
from tests.scripts.helpers import queue_keys, run1, server_ms, wait_until

MINUTE = 60_000


def _take(qk, want: int, *, max_jobs: int = 10, window_ms: int = MINUTE):
    return ops.limiter(qk, max_jobs=max_jobs, window_ms=window_ms, want=want)


def _refund(qk, n: int, window_start: int, *, max_jobs: int = 10, window_ms: int = MINUTE):
    return ops.limiter(
        qk, max_jobs=max_jobs, window_ms=window_ms, want=-n, refund_window=window_start
    )


async def test_limiter_grants_at_most_max_per_window_across_callers(redis_server, prefix):
    qk = queue_keys(prefix)
    clients = [aioredis.Redis(port=redis_server.port) for _ in range(3)]
    try:
        grants = await asyncio.gather(
            *(run1(c, _take(qk, want)) for _ in range(10) for c in clients for want in (1, 2, 3))
        )
    finally:
        for c in clients:
            await c.aclose()

    per_window: dict[int, int] = defaultdict(int)
    for g in grants:
        assert g.granted >= 0
        per_window[g.window_start_ms] += g.granted
    assert all(total <= 10 for total in per_window.values())
    assert max(per_window.values()) == 10  # demand (180) exceeds supply: a window fills up


async def test_window_is_aligned_on_the_server_clock_and_the_key_expires(aredis, prefix):
    qk = queue_keys(prefix)
    before = await server_ms(aredis)
    g = await run1(aredis, _take(qk, 1))
    after = await server_ms(aredis)

    assert g.granted == 1
    assert g.window_start_ms % MINUTE == 0
    assert before - MINUTE < g.window_start_ms <= after
    assert 0 < g.window_left_ms <= MINUTE
    assert g.window_start_ms + MINUTE - after <= g.window_left_ms
    assert 0 < await aredis.pttl(qk.limiter) <= 2 * MINUTE


async def test_a_partial_grant_takes_only_the_tokens_left(aredis, prefix):
    qk = queue_keys(prefix)
    for _ in range(3):  # redo if the window happened to roll over mid-test
        first = await run1(aredis, _take(qk, 7))
        second = await run1(aredis, _take(qk, 7))
        third = await run1(aredis, _take(qk, 1))
        if first.window_start_ms == third.window_start_ms:
            break
    assert (first.granted, second.granted, third.granted) == (7, 3, 0)


async def test_refund_within_the_same_window_gives_tokens_back(aredis, prefix):
    qk = queue_keys(prefix)
    for _ in range(3):
        full = await run1(aredis, _take(qk, 10))
        refund = await run1(aredis, _refund(qk, 4, full.window_start_ms))
        again = await run1(aredis, _take(qk, 10))
        if full.window_start_ms == again.window_start_ms:
            break
    assert (full.granted, refund.granted, again.granted) == (10, 0, 4)


async def test_refund_never_takes_the_count_below_zero(aredis, prefix):
    qk = queue_keys(prefix)
    for _ in range(3):
        g = await run1(aredis, _take(qk, 2))
        await run1(aredis, _refund(qk, 50, g.window_start_ms))
        again = await run1(aredis, _take(qk, 50))
        if g.window_start_ms == again.window_start_ms:
            break
    assert again.granted == 10


async def test_refund_for_an_old_window_is_ignored(aredis, prefix):
    qk = queue_keys(prefix)
    for _ in range(3):
        full = await run1(aredis, _take(qk, 10))
        await run1(aredis, _refund(qk, 5, full.window_start_ms - MINUTE))
        again = await run1(aredis, _take(qk, 1))
        if full.window_start_ms == again.window_start_ms:
            break
    assert (full.granted, again.granted) == (10, 0)


async def test_refund_after_the_window_rolled_over_does_not_inflate_the_new_window(aredis, prefix):
    opts = {"max_jobs": 3, "window_ms": 200}
    for attempt in range(3):  # redo if the new window also rolls over before the last take
        qk = queue_keys(f"{prefix}-{attempt}")
        old = await run1(aredis, _take(qk, 3, **opts))
        assert old.granted == 3

        async def rolled(qk=qk, old=old) -> bool:
            peek = await run1(aredis, _take(qk, 0, **opts))  # want 0 takes nothing
            return peek.window_start_ms != old.window_start_ms

        await wait_until(rolled, what="the next limiter window")
        new = await run1(aredis, _take(qk, 2, **opts))
        await run1(aredis, _refund(qk, 3, old.window_start_ms, **opts))
        after = await run1(aredis, _take(qk, 3, **opts))
        if after.window_start_ms == new.window_start_ms:
            break
    assert (new.granted, after.granted) == (2, 1)  # the stale refund gave nothing back
