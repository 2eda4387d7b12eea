"""Stalled reclaim: take over entries whose worker died or stopped renewing, up to free slots.

A worker claims at most what it can start now (:meth:`Intake.claimable`): the rest stay
pending for idle workers, so one busy or crash-looping worker cannot sweep a backlog into its
buffer. The stall budget counts *starts*: the script keeps, per entry, how many runs started
without a settle, and dead-letters an entry as stalled once it stalled more than
``max_stalled_count`` times. A claim is a start (claimed entries start at once), so an entry
that was claimed but never run is not charged for someone else's crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from streamq import ops
from streamq._redis import run_calls
from streamq.keys import ShardKeys
from streamq.runtime.context import LaneContext
from streamq.runtime.fetch import Entry, Intake
from streamq.runtime.renewal import HeldEntries

__all__ = ["Reclaimer"]

_log = logging.getLogger("streamq.worker")


class Reclaimer:
    """Every stalled interval: renew this worker's own locks, then claim stalled entries.

    Args:
        ctx: the lane.
        intake: where claimed entries go (at the front: they start at once).
        held: the entries this worker holds (claimed ones are added).
        on_lost: ``(shard, ids)`` of held entries found owned by someone else.
        is_paused: a paused lane claims nothing (stalled jobs stay pending, not lost).
    """

    def __init__(
        self,
        ctx: LaneContext,
        intake: Intake,
        held: HeldEntries,
        *,
        on_lost: Callable[[int, list[str]], None],
        is_paused: Callable[[], Awaitable[bool]],
        closing: Callable[[], bool],
        on_finals: Callable[[ShardKeys, list[ops.TrackedFinal]], Awaitable[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.on_finals = on_finals
        self.intake = intake
        self.held = held
        self.on_lost = on_lost
        self.is_paused = is_paused
        self.closing = closing
        self.claimed = 0

    async def run(self) -> None:
        interval = self.ctx.options.stalled_interval_ms / 1000
        while not self.closing():
            if not await self.is_paused():
                await self.once()
            await asyncio.sleep(interval)

    async def renew_own(self) -> None:
        """Renew this worker's held entries from the loop, right before claiming.

        When the renewal thread was cut off longer than the lock (an outage, a paused
        process), the claim would otherwise take this worker's own running jobs from itself.
        """
        ctx = self.ctx
        snap = self.held.snapshot()
        held = [i for i, ids in enumerate(snap) if ids]
        if not held:
            return
        calls = [ops.renew(ctx.shards[i], ctx.group, ctx.consumer, snap[i]) for i in held]
        replies = await run_calls(ctx.client, calls, queue=ctx.name)
        for i, lost in zip(held, replies, strict=True):
            still = [eid for eid in lost if (i, eid) in self.held]
            if still:
                self.on_lost(i, still)

    async def once(self) -> int:
        """Claim stalled entries of every shard while this worker has free slots.

        Returns how many entries were taken over to run here.
        """
        await self.renew_own()
        taken = 0
        for shard in self.ctx.shards:
            cursor = "0-0"
            while not self.closing():
                want = self.intake.claimable()
                if want <= 0:
                    return taken
                got, cursor = await self._page(shard.index, cursor, want)
                taken += got
                if cursor in ("0-0", "0"):
                    break
        return taken

    async def _page(self, index: int, cursor: str, want: int) -> tuple[int, str]:
        ctx = self.ctx
        shard = ctx.shards[index]
        call = ops.reclaim(
            shard, ctx.group, ctx.consumer, min_idle_ms=ctx.options.lock_duration_ms,
            cursor=cursor, count=want, max_stalled_count=ctx.options.max_stalled_count,
            dead_cap=ctx.options.dead_letter_cap,
        )
        page: ops.ReclaimPage = (await run_calls(ctx.client, [call], queue=ctx.name))[0]
        new = [e for e in page.entries if (index, e.entry_id) not in self.held]
        for e in new:
            self.held.add(index, e.entry_id)
        if new:
            self.intake.add([Entry(index, e.entry_id, e.fields, e.starts) for e in new],
                            front=True)
            self.claimed += len(new)
        hooks = ctx.hooks
        if page.entries or page.stalled:
            hooks.jobs_stalled(ctx.name, shard.name, len(page.stalled) + len(page.entries))
        if new:
            hooks.jobs_reclaimed(ctx.name, shard.name, len(new))
            _log.warning("reclaimed stalled jobs",
                         extra={"queue": ctx.name, "shard": shard.name, "count": len(new)})
        for _ in page.stalled:
            hooks.job_dead_lettered(ctx.name, shard.name, "", "stalled")
        if page.stalled:
            _log.warning("dead-lettered jobs that stalled too often",
                         extra={"queue": ctx.name, "shard": shard.name,
                                "count": len(page.stalled),
                                "max_stalled_count": ctx.options.max_stalled_count})
        if page.finals and self.on_finals is not None:
            # Tracked jobs among the stalled: their final records (the script could not
            # name those keys in advance). Best effort: the dead letters are already safe.
            try:
                await self.on_finals(shard, page.finals)
            except Exception as exc:
                _log.warning("could not record stalled tracked jobs as dead",
                             extra={"queue": ctx.name, "shard": shard.name,
                                    "error": repr(exc)})
        if page.lost:
            hooks.payload_lost(ctx.name, shard.name, len(page.lost))
            for _ in page.lost:
                hooks.job_dead_lettered(ctx.name, shard.name, "", "lost_payload")
        return len(new), page.cursor
