"""Liveness of consumers: this one's heartbeat, pruning gone ones, and leaving cleanly.

Each worker records itself in the lane's ``workers`` hash every stalled interval and removes
consumers of gone processes from the group (only those with nothing pending, atomically). On
shutdown it reconciles its own pending list with what it holds, hands back anything a
cancelled read or claim left under its name, and leaves the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from streamq import ops
from streamq._redis import map_error, run_calls
from streamq.runtime.context import LaneContext, new_token
from streamq.runtime.fetch import check_foreign_groups
from streamq.runtime.renewal import HeldEntries

__all__ = ["Heartbeat", "leave_group", "reconcile_pending"]

_log = logging.getLogger("streamq.worker")

PENDING_PAGE = 500


class Heartbeat:
    """Records this consumer as alive and drops consumers of gone processes."""

    def __init__(self, ctx: LaneContext, *, on_ok: Callable[[], None],
                 closing: Callable[[], bool]) -> None:
        self.ctx = ctx
        self.on_ok = on_ok
        self.closing = closing
        self.beats = 0

    @property
    def stale_after_ms(self) -> int:
        o = self.ctx.options
        return 3 * max(o.stalled_interval_ms, o.lock_duration_ms)

    async def run(self) -> None:
        interval = self.ctx.options.stalled_interval_ms / 1000
        while not self.closing():
            await self.once()
            await asyncio.sleep(interval)

    async def once(self) -> None:
        ctx = self.ctx
        now_ms = int(ctx.clock.now_ms())
        await ctx.client.hset(ctx.keys.workers, ctx.consumer, now_ms)
        beats: dict[bytes, bytes] = await ctx.client.hgetall(ctx.keys.workers)
        self.on_ok()
        self.beats += 1
        gone = {k.decode() for k, v in beats.items() if now_ms - int(v) > self.stale_after_ms}
        await self.drop_gone(gone, beats)
        # A group added after start would lose jobs to our XDEL: keep checking (one XINFO
        # GROUPS per shard per stalled interval).
        await check_foreign_groups(ctx)

    async def drop_gone(self, gone: set[str], beats: dict[bytes, bytes] | None = None, *,
                        stale_after_ms: int | None = None) -> None:
        """Remove consumers of ``gone`` processes idle longer than ``stale_after_ms``."""
        ctx = self.ctx
        stale = self.stale_after_ms if stale_after_ms is None else stale_after_ms
        if beats is None:
            beats = await ctx.client.hgetall(ctx.keys.workers)
        alive = {k.decode() for k in beats} - gone
        for shard in ctx.shards:
            try:
                consumers: list[dict[str, Any]] = await ctx.client.xinfo_consumers(
                    shard.stream, ctx.group
                )
            except Exception as exc:
                # No group yet on this shard, or Redis failing: the next beat tries again.
                # Anything else is a bug: say so loudly (pruning waits, nothing is lost).
                expected = map_error(exc) is not None or "NOGROUP" in str(exc)
                _log.log(logging.DEBUG if expected else logging.WARNING,
                         "cannot list consumers to prune", exc_info=not expected,
                         extra={"queue": ctx.name, "shard": shard.name, "error": repr(exc)})
                continue
            for c in consumers:
                name = c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
                if name == ctx.consumer or name in alive:
                    continue
                if int(c.get("idle", 0)) < stale:
                    continue
                call = ops.drop_consumer(shard, ctx.group, name)
                if (await run_calls(ctx.client, [call], queue=ctx.name))[0]:
                    _log.info("removed a gone consumer",
                              extra={"queue": ctx.name, "consumer": name})
        if gone:
            await ctx.client.hdel(ctx.keys.workers, *gone)


async def reconcile_pending(ctx: LaneContext, held: HeldEntries) -> int:
    """Hand back every entry pending under this consumer that it does not hold.

    A read or claim cancelled while its reply was on the wire leaves entries pending under
    this consumer that the worker never saw; without this they would wait for the lock to
    expire (and be charged a stall). Returns how many were released.
    """
    released = 0
    for shard in ctx.shards:
        start = "-"
        while True:
            page = await ctx.client.xpending_range(
                shard.stream, ctx.group, min=start, max="+", count=PENDING_PAGE,
                consumername=ctx.consumer,
            )
            if not page:
                break
            ids = [_text(p["message_id"]) for p in page]
            stray = [i for i in ids if (shard.index, i) not in held]
            if stray:
                call = ops.release(shard, ctx.group, ctx.consumer, stray, token=new_token())
                statuses = (await run_calls(ctx.client, [call], queue=ctx.name))[0]
                released += sum(1 for s in statuses if s == ops.SettleStatus.APPLIED)
            if len(page) < PENDING_PAGE:
                break
            start = "(" + ids[-1]
    if released:
        _log.info("released entries a cancelled read left pending",
                  extra={"queue": ctx.name, "count": released})
    return released


async def leave_group(ctx: LaneContext) -> None:
    """Forget this consumer if it holds nothing (never one with pending entries)."""
    await run_calls(ctx.client, [ops.drop_consumer(s, ctx.group, ctx.consumer)
                                 for s in ctx.shards], queue=ctx.name)
    await ctx.client.hdel(ctx.keys.workers, ctx.consumer)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
