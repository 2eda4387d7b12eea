"""Periodic work of a worker: promote due jobs, reclaim stalled ones, prune dead consumers.

Every worker runs these for the lanes it consumes; the scripts make that safe in parallel
(each due job is promoted once, each stalled entry claimed once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from streamq import ops
from streamq._redis import run_calls

if TYPE_CHECKING:
    from streamq.runtime.worker import Worker

__all__ = ["leave_group", "promote_loop", "promote_once", "reclaim_loop", "reclaim_once"]

_log = logging.getLogger("streamq.worker")

PROMOTE_BATCH = 500
RECLAIM_PAGE = 100


async def sync_clock(w: Worker) -> None:
    """Estimate the offset between this host's clock and the Redis server's."""
    before = time.time()
    sec, usec = await w.client.time()
    after = time.time()
    w.clock_offset_ms = (sec * 1000 + usec / 1000) - (before + after) * 500


async def promote_once(w: Worker) -> float | None:
    """Promote due jobs of every shard; returns seconds until the next due job, or None."""
    calls = [ops.promote(s, limit=PROMOTE_BATCH) for s in w.shards]
    t0 = time.time()
    results = await run_calls(w.client, calls, queue=w.name)
    rtt = time.time() - t0
    soonest: float | None = None
    again = False
    for shard, res in zip(w.shards, results, strict=True):
        w.clock_offset_ms = res.now_ms - (t0 + rtt / 2) * 1000
        if res.moved:
            w.hooks.promoted(w.name, shard.name, res.moved)
            again = again or res.moved >= PROMOTE_BATCH
        if res.next_due_ms is not None:
            wait = max(0.0, (res.next_due_ms - res.now_ms) / 1000)
            soonest = wait if soonest is None else min(soonest, wait)
    return 0.0 if again else soonest


async def promote_loop(w: Worker) -> None:
    interval = w.options.promote_interval_s
    while not w.closing:
        wait = interval
        try:
            nxt = await promote_once(w)
            if nxt is not None:
                wait = min(interval, nxt)
        except Exception as exc:
            w.hooks.redis_error(w.name, exc)
            wait = max(interval, 1.0)
        await asyncio.sleep(wait)


async def renew_own(w: Worker) -> None:
    """Renew the entries this worker holds, from the loop, right before it reclaims.

    When its renewal thread was cut off longer than the lock (a Redis outage, a pause of
    the process), the reclaim would otherwise claim this worker's own running jobs from
    itself: each time raising their delivery count, until a live job is dead-lettered as
    stalled while it runs. One fenced call per shard held, per stalled interval.
    """
    snap = w.held.snapshot()
    held = [i for i, ids in enumerate(snap) if ids]
    if not held:
        return
    calls = [ops.renew(w.shards[i], w.group, w.consumer, snap[i]) for i in held]
    replies = await run_calls(w.client, calls, queue=w.name)
    for i, lost in zip(held, replies, strict=True):
        still = [eid for eid in lost if (i, eid) in w.held]
        if still:
            w.renewer.on_lost(i, still)


async def reclaim_once(w: Worker) -> int:
    """Reclaim stalled entries of every shard (looping each until cursor 0-0).

    Returns how many entries were taken over to run here.
    """
    await renew_own(w)
    taken = 0
    for shard in w.shards:
        cursor = "0-0"
        while True:
            page: ops.ReclaimPage = (
                await run_calls(
                    w.client,
                    [
                        ops.reclaim(
                            shard,
                            w.group,
                            w.consumer,
                            min_idle_ms=w.options.lock_duration_ms,
                            cursor=cursor,
                            count=RECLAIM_PAGE,
                            max_stalled_count=w.options.max_stalled_count,
                            dead_cap=w.options.dead_letter_cap,
                        )
                    ],
                    queue=w.name,
                )
            )[0]
            new = [e for e in page.entries if w.add_reclaimed(shard, e.entry_id, e.fields)]
            taken += len(new)
            stalled = len(page.stalled) + len(new)
            if stalled:
                w.hooks.jobs_stalled(w.name, shard.name, stalled)
            if new:
                w.hooks.jobs_reclaimed(w.name, shard.name, len(new))
                _log.warning(
                    "reclaimed stalled jobs",
                    extra={"queue": w.name, "shard": shard.name, "count": len(new)},
                )
            for _ in page.stalled:
                w.hooks.job_dead_lettered(w.name, shard.name, "", "stalled")
            if page.lost:
                w.hooks.payload_lost(w.name, shard.name, len(page.lost))
                for _ in page.lost:
                    w.hooks.job_dead_lettered(w.name, shard.name, "", "lost_payload")
            cursor = page.cursor
            if cursor in ("0-0", "0") or w.closing:
                break
    return taken


async def heartbeat(w: Worker) -> None:
    """Record this consumer as alive, and drop consumers of gone processes."""
    now_ms = int(w.server_now_ms())
    await w.client.hset(w.keys.workers, w.consumer, now_ms)
    beats: dict[bytes, bytes] = await w.client.hgetall(w.keys.workers)
    stale_after = 3 * max(w.options.stalled_interval_ms, w.options.lock_duration_ms)
    gone = {k.decode() for k, v in beats.items() if now_ms - int(v) > stale_after}
    await _drop_gone(w, gone, stale_after, beats)


async def _drop_gone(
    w: Worker, gone: set[str], stale_after_ms: int, beats: dict[bytes, bytes] | None = None
) -> None:
    if beats is None:
        beats = await w.client.hgetall(w.keys.workers)
    alive = {k.decode() for k in beats} - gone
    for shard in w.shards:
        try:
            consumers: list[dict[str, Any]] = await w.client.xinfo_consumers(shard.stream, w.group)
        except Exception:
            continue
        for c in consumers:
            name = c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
            if name == w.consumer or name in alive:
                continue
            if int(c.get("idle", 0)) < stale_after_ms:
                continue
            dropped = (await run_calls(w.client, [ops.drop_consumer(shard, w.group, name)]))[0]
            if dropped:
                _log.info("removed a gone consumer", extra={"queue": w.name, "consumer": name})
    if gone:
        await w.client.hdel(w.keys.workers, *gone)


async def reclaim_loop(w: Worker) -> None:
    interval = w.options.stalled_interval_ms / 1000
    while not w.closing:
        try:
            await heartbeat(w)
            # A paused lane starts nothing new, reclaimed jobs included: they stay pending
            # (not lost) until the lane is resumed.
            if not await w.is_paused():
                await reclaim_once(w)
        except Exception as exc:
            w.hooks.redis_error(w.name, exc)
        await asyncio.sleep(interval)


async def leave_group(w: Worker) -> None:
    """On shutdown: forget this consumer if it holds nothing (never one with pending entries)."""
    try:
        await run_calls(
            w.client, [ops.drop_consumer(s, w.group, w.consumer) for s in w.shards], queue=w.name
        )
        await w.client.hdel(w.keys.workers, w.consumer)
    except Exception as exc:
        w.hooks.redis_error(w.name, exc)
