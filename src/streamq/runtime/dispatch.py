"""Dispatch: start fetched entries as jobs (or batches) when slots and rate-limit tokens allow.

The dispatcher takes entries from the :class:`~streamq.runtime.fetch.Intake` buffer while the
lane has free slots, asks the lane's global limiter for tokens, and runs each job (or each
gathered batch) as a task of its own. A freed slot takes the next buffered entry at once when
the lane is certainly not paused nor rate-limited. A paused lane hands back what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from streamq import ops
from streamq._redis import run_calls
from streamq.options import Batch
from streamq.runtime.batch import run_batch
from streamq.runtime.context import LaneContext
from streamq.runtime.fetch import Entry, Intake
from streamq.runtime.process import JobRunner
from streamq.runtime.renewal import HeldEntries

__all__ = ["Dispatcher", "PauseFlag"]

_log = logging.getLogger("streamq.worker")


class PauseFlag:
    """The lane's ``paused`` flag in the meta hash, read at most every 0.2-1 s."""

    def __init__(self, client: Any, meta_key: str) -> None:
        self.client = client
        self.key = meta_key
        self.value = False
        self._until = 0.0

    def fresh(self) -> bool:
        return time.monotonic() < self._until

    async def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self._until:
            self.value = bool(await self.client.hget(self.key, "paused"))
            self._until = now + (0.2 if self.value else 1.0)
        return self.value


class Dispatcher:
    """Starts a lane's jobs; owns what it started (tasks, counts, the limiter's last answer).

    Args:
        ctx: the lane.
        intake: slots and the buffer.
        runner: runs one job (or one batch) to its confirmed settle.
        held: entries held; a job that fails unexpectedly is dropped from it (to stall).
        pause: the lane's paused flag.
        hand_back: releases entries this lane will not run.
        closing: whether the lane is closing.
        batch: the lane's batch settings, for a batch processor.
    """

    def __init__(
        self,
        ctx: LaneContext,
        intake: Intake,
        runner: JobRunner,
        held: HeldEntries,
        *,
        pause: PauseFlag,
        hand_back: Callable[[list[Entry]], None],
        closing: Callable[[], bool],
        batch: Batch | None = None,
    ) -> None:
        self.ctx = ctx
        self.intake = intake
        self.runner = runner
        self.held = held
        self.pause = pause
        self.hand_back = hand_back
        self.closing = closing
        self.batch = batch
        self.started_total = 0
        self.last_started = time.monotonic()
        self.last_grant_denied = False
        self.batches_active = 0
        self.jobs: dict[asyncio.Task[None], list[tuple[int, str]]] = {}
        """Each job (or batch) task and the entries it runs."""

    def _track(self, task: asyncio.Task[None], keys: list[tuple[int, str]]) -> None:
        self.jobs[task] = keys
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Task[None]) -> None:
        self.jobs.pop(task, None)

    def processing(self, tasks: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """Those of ``tasks`` whose processor still runs (the others only wait for Redis to
        answer their settle: cancelling them would lose the outcome's report)."""
        running = self.runner.running
        return {t for t in tasks if any(k in running for k in self.jobs.get(t, ()))}

    def wedged_for(self, now: float | None = None) -> float:
        """Seconds the lane has held buffered entries with free slots and started none.

        Zero when it is not stuck that way (nothing buffered, paused, or waiting for rate
        limit tokens). This catches a wedged dispatcher even when peers drained the queue.
        """
        intake = self.intake
        if (self.closing() or not intake.buffer or intake.free_slots() <= 0
                or self.pause.value or self.last_grant_denied):
            return 0.0
        return (now if now is not None else time.monotonic()) - self.last_started

    async def run(self) -> None:
        intake = self.intake
        while not self.closing():
            await intake.wait_for(
                lambda: self.closing() or (bool(intake.buffer) and intake.free_slots() > 0)
            )
            if self.closing():
                return
            # A read already in flight when the lane was paused can still return entries:
            # hand them back (fenced release) so a paused lane holds nothing.
            if await self.pause():
                self.hand_back(intake.drain())
                continue
            n = await self._take_tokens(min(len(intake.buffer), intake.free_slots()))
            for _ in range(n):
                entry = intake.take()
                if entry is None or self.closing():
                    break
                self.start(entry)

    async def _take_tokens(self, n: int) -> int:
        """How many of ``n`` jobs the lane's rate limit lets start now (all without one)."""
        limiter = self.ctx.options.limiter
        if limiter is None:
            return n
        call = ops.limiter(self.ctx.keys, max_jobs=limiter.max_jobs,
                           window_ms=limiter.duration_ms, want=n)
        grant = (await run_calls(self.ctx.client, [call], queue=self.ctx.name))[0]
        self.last_grant_denied = grant.granted == 0
        if grant.granted == 0:
            await asyncio.sleep(max(grant.window_left_ms, 1) / 1000)
        return int(grant.granted)

    async def run_batches(self) -> None:
        intake, batch = self.intake, self.batch
        assert batch is not None
        concurrency = self.ctx.options.concurrency
        while not self.closing():
            await intake.wait_for(
                lambda: self.closing()
                or (bool(intake.buffer) and self.batches_active < concurrency)
            )
            if len(intake.buffer) < batch.max_size and not self.closing():
                # Gather: up to max_size, for at most max_wait from the first entry.
                await intake.wait_for(
                    lambda: self.closing() or len(intake.buffer) >= batch.max_size,
                    timeout_s=batch.max_wait_s,
                )
            if self.closing():
                return
            if await self.pause():
                self.hand_back(intake.drain())
                continue
            n = await self._take_tokens(min(len(intake.buffer), batch.max_size,
                                            intake.free_slots()))
            entries = [e for e in (intake.take() for _ in range(n)) if e is not None]
            if entries and not self.closing():
                self.start_batch(entries)

    def start_batch(self, entries: list[Entry]) -> None:
        self.batches_active += 1
        self.started_total += len(entries)
        self.last_started = time.monotonic()
        self.ctx.hooks.active_changed(self.ctx.name, self.intake.active)
        task = asyncio.get_running_loop().create_task(self._guarded_batch(entries))
        self._track(task, [(e.shard, e.entry_id) for e in entries])

    async def _guarded_batch(self, entries: list[Entry]) -> None:
        freed = 0
        done = False

        def free() -> None:
            nonlocal freed
            freed += 1
            self.intake.finished()

        def ran() -> None:
            # The batch slot is free once the processor is done: the next batch may run
            # while this one's settles are on their way.
            nonlocal done
            if not done:
                done = True
                self.batches_active -= 1
                self.intake.wake()

        try:
            items = [(self.ctx.shards[e.shard], e) for e in entries]
            await run_batch(self.runner, items, free=free, ran=ran)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("unexpected error processing a batch", extra={"queue": self.ctx.name})
            for e in entries:  # left to stall and be reclaimed (see _guarded)
                self.held.discard(e.shard, e.entry_id)
        finally:
            for _ in range(len(entries) - freed):
                self.intake.finished()
            ran()
            self.ctx.hooks.active_changed(self.ctx.name, self.intake.active)

    def start(self, entry: Entry) -> None:
        self.started_total += 1
        self.last_started = time.monotonic()
        self.ctx.hooks.active_changed(self.ctx.name, self.intake.active)
        task = asyncio.get_running_loop().create_task(self._guarded(entry))
        self._track(task, [(entry.shard, entry.entry_id)])

    async def _guarded(self, entry: Entry) -> None:
        shard = self.ctx.shards[entry.shard]
        try:
            await self.runner.run(shard, entry, self._freed)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("unexpected error processing a job", extra={"queue": self.ctx.name})
            # Its settle may never come: stop renewing it, so it stalls and is reclaimed
            # (then dead-lettered as stalled) instead of being held here forever.
            self.held.discard(entry.shard, entry.entry_id)

    def _freed(self) -> None:
        intake = self.intake
        intake.finished()
        # The freed slot takes the next buffered entry at once, unless the lane may be paused
        # (a stale flag goes through the dispatcher, which reads it) or rate-limited.
        if (intake.buffer and not self.closing() and self.ctx.options.limiter is None
                and self.pause.fresh() and not self.pause.value):
            entry = intake.take()
            if entry is not None:
                self.start(entry)
                return
        self.ctx.hooks.active_changed(self.ctx.name, intake.active)

