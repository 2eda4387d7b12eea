"""Batch processors: one call over a list of jobs, each job settled on its own.

The dispatcher gathers up to ``max_size`` entries for at most ``max_wait`` (see
:meth:`Dispatcher.run_batches`); this module runs one gathered list:

* poison entries (undecodable, unknown job, invalid payload) are dead-lettered on their own
  and never reach the processor;
* the processor gets ``list[Job[P]]``; returning completes every job it did not mark with
  :meth:`Job.fail`; raising fails every job with that error (each by its own attempts,
  backoff and dead letter); a timeout fails each as ``timeout``;
* each job's settle is its own (its own fence: a job whose lock was lost mid-batch is
  ``lock_lost`` while the others complete), and each outcome is the one Redis confirmed;
* shutdown past its timeout cancels the call and releases every job of the batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamq.envelope import RawJob
from streamq.hooks import JobInfo
from streamq.job import Job
from streamq.keys import ShardKeys
from streamq.runtime.execute import run_processor
from streamq.runtime.fetch import Entry
from streamq.runtime.process import JobRunner, Poison

__all__ = ["run_batch"]


async def run_batch(
    runner: JobRunner,
    items: Sequence[tuple[ShardKeys, Entry]],
    *,
    free: Callable[[], None],
    ran: Callable[[], None] = lambda: None,
) -> None:
    """Run one batch to the confirmed settle of each of its jobs.

    ``free()`` is called once per entry, when the entry no longer needs its slot; ``ran()``
    once the processor is done with the batch (before Redis answered its settles), so the
    next batch can start meanwhile.
    """
    poison: list[Poison] = []
    runs: list[tuple[ShardKeys, RawJob, JobInfo, Job[Any]]] = []
    handler: Any = None
    for shard, entry in items:
        got = runner.prepare(shard, entry)
        if isinstance(got, Poison):
            poison.append(got)
            continue
        raw, payload, handler = got
        info, job = runner.info(shard, raw, payload)
        runs.append((shard, raw, info, job))
    waits = [asyncio.ensure_future(runner.settle_poison(p, free)) for p in poison]
    try:
        if runs:
            await _run(runner, runs, handler, free, ran)
    finally:
        ran()
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)


async def _run(
    runner: JobRunner,
    runs: list[tuple[ShardKeys, RawJob, JobInfo, Job[Any]]],
    handler: Any,
    free: Callable[[], None],
    ran: Callable[[], None],
) -> None:
    ctx = runner.ctx
    infos = [info for _, _, info, _ in runs]
    jobs = [job for _, _, _, job in runs]
    for shard, raw, _, job in runs:
        runner.running[(shard.index, raw.entry_id)] = job
    for info in infos:
        ctx.hooks.job_started(info)
    started = time.perf_counter()
    with ctx.hooks.batch_context(infos):
        try:
            try:
                await run_processor(handler, jobs, timeout_s=ctx.options.timeout_s,
                                    pool=runner.pool)
                errors: list[BaseException | None] = [job.failure for job in jobs]
            except Exception as exc:
                errors = [exc] * len(jobs)
            decisions = [runner.decide(shard, raw, err)
                         for (shard, raw, _, _), err in zip(runs, errors, strict=True)]
        except asyncio.CancelledError:
            await runner.released([(s, r, i) for s, r, i, _ in runs], started,
                                  [free] * len(runs))
            raise
        finally:
            for shard, raw, _, _ in runs:
                runner.running.pop((shard.index, raw.entry_id), None)
        duration = time.perf_counter() - started
        futs = [runner.settle(op) for op, _ in decisions]
        for _ in runs:
            free()
        ran()
        # One wait for every answer (futures, not a task per job), then one report each.
        statuses = await asyncio.gather(*futs)
        for (shard, raw, info, _), (op, intent), err, status in zip(
            runs, decisions, errors, statuses, strict=True
        ):
            runner.report(shard, raw, info, op, intent, err, duration, status)
