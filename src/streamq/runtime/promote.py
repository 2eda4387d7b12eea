"""Promotion: due delayed jobs (scheduled or retrying) move to the stream.

Every worker runs it for the lanes it consumes; the script moves each due job exactly once,
so that is safe in parallel. Its replies also carry the server time, which keeps the lane's
:class:`~streamq.runtime.context.ServerClock` current.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from streamq import ops
from streamq._redis import run_calls
from streamq.runtime.context import LaneContext

__all__ = ["PROMOTE_BATCH", "Promoter"]

PROMOTE_BATCH = 500


class Promoter:
    """Promotes due jobs of every shard of a lane, waking early when the next one is due."""

    def __init__(self, ctx: LaneContext, *, on_ok: Callable[[], None],
                 closing: Callable[[], bool]) -> None:
        self.ctx = ctx
        self.on_ok = on_ok
        self.closing = closing

    async def once(self) -> float | None:
        """Promote once; returns seconds until the next due job (0: more are due), or None."""
        ctx = self.ctx
        calls = [ops.promote(s, limit=PROMOTE_BATCH) for s in ctx.shards]
        sent = time.time()
        results = await run_calls(ctx.client, calls, queue=ctx.name)
        received = time.time()
        self.on_ok()
        soonest: float | None = None
        again = False
        for shard, res in zip(ctx.shards, results, strict=True):
            ctx.clock.observe(res.now_ms, sent, received)
            if res.moved:
                ctx.hooks.promoted(ctx.name, shard.name, res.moved)
                again = again or res.moved >= PROMOTE_BATCH
            if res.next_due_ms is not None:
                wait = max(0.0, (res.next_due_ms - res.now_ms) / 1000)
                soonest = wait if soonest is None else min(soonest, wait)
        return 0.0 if again else soonest

    async def run(self) -> None:
        """Promote every promote interval (sooner when a job is due sooner)."""
        interval = self.ctx.options.promote_interval_s
        while not self.closing():
            nxt = await self.once()
            await asyncio.sleep(interval if nxt is None else min(interval, nxt))
