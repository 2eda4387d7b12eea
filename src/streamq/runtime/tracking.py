"""The worker's side of tracked jobs (:mod:`streamq.jobstatus`): settles that keep the
location and final records in step, cancel requests, progress.

Untracked jobs never reach this module's Redis calls. For tracked ones:

* completions (and cancels) of one shard share one ``complete_tracked`` call per flush, as
  untracked completions share ``complete``; a retry or dead letter is one ``settle_tracked``
  call, which also turns it into ``cancelled`` when a cancellation was requested. Both remove
  the location record and write the final record (with the validated result) in the same
  script as the ack, in the settler's pipelined flush: no extra round trip;
* the running tracked jobs ride with each lock renewal (:class:`Tracker.riders`, one
  ``control`` call per shard with tracked jobs): it records who runs them and since when,
  and answers which have a cancel request. An async processor is then cancelled
  (``asyncio`` cancellation, delivered where it awaits); a sync one sees
  ``job.cancel_requested`` turn true and may return or raise;
* ``await job.report_progress(...)`` is one small fenced call, made when the processor asks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamq import ops
from streamq._redis import Call, run_calls
from streamq.errors import ConfigurationError, InvalidResult, JobCancelled
from streamq.job import Job
from streamq.jobstatus import CTL_FIELD, encode_result, final_record
from streamq.keys import ShardKeys
from streamq.runtime.context import LaneContext
from streamq.runtime.settle import SettleOp

__all__ = ["TrackedSettle", "Tracker", "is_tracked"]

_log = logging.getLogger("streamq.worker")

_OUTCOMES = {"c": "completed", "x": "cancelled", "d": "failed"}


def is_tracked(fields: dict[bytes, bytes]) -> bool:
    """True when an entry carries the ``ctl`` field of a tracked job."""
    return CTL_FIELD in fields


def keep_ms(fields: dict[bytes, bytes]) -> int:
    """How long a tracked entry's final record is kept (its ``ctl`` field's ``keep``)."""
    try:
        return max(0, int(json.loads(fields[CTL_FIELD]).get("keep") or 0))
    except (KeyError, ValueError, TypeError, AttributeError):
        return 0


def _text(v: bytes | None) -> str:
    return v.decode("utf-8", "replace") if v else ""


class TrackedSettle:
    """The ``build`` of a tracked job's :class:`SettleOp`: makes its ``settle_tracked`` call
    and keeps the outcome Redis applied (``c``, ``x``, ``r``, ``d``), which may differ from
    the action asked (a cancel request turns a retry or a dead letter into a cancel)."""

    __slots__ = ("kw", "outcome")

    def __init__(self, **kw: Any) -> None:
        self.kw = kw
        self.outcome = ""

    def __call__(self, token: str) -> Call:
        call = ops.settle_tracked(token=token, **self.kw)
        return dataclasses.replace(call, parse=self._parse)

    def _parse(self, reply: Any) -> ops.SettleStatus:
        status, self.outcome = call_parse(reply)
        return status


def call_parse(reply: Any) -> tuple[ops.SettleStatus, str]:
    status = ops.SettleStatus(int(reply[0]))
    out = reply[1]
    return status, out.decode() if isinstance(out, bytes) else str(out)


class _Handle:
    """What a tracked job's :class:`Job` reaches: its cancel flag and progress reports."""

    __slots__ = ("cancel_requested", "cancelled_task", "entry_id", "loop", "shard", "tracker")

    def __init__(self, tracker: Tracker, shard: ShardKeys, entry_id: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.tracker = tracker
        self.shard = shard
        self.entry_id = entry_id
        self.loop = loop
        self.cancel_requested = False
        self.cancelled_task = False

    async def progress(self, job: Job[Any], fraction: float, detail: Any) -> bool:
        return await self.tracker.progress(self, job, fraction, detail)

    def progress_sync(self, job: Job[Any], fraction: float, detail: Any,
                      timeout_s: float) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise ConfigurationError(
                f"queue {job.queue!r} job {job.name!r} id {job.id!r}: report_progress_sync "
                "called on the worker's event loop; use 'await job.report_progress(...)'",
                queue=job.queue, job=job.name, job_id=job.id,
            )
        fut = asyncio.run_coroutine_threadsafe(self.progress(job, fraction, detail), self.loop)
        return fut.result(timeout_s)


@dataclass(slots=True)
class _Run:
    job: Job[Any]
    handle: _Handle
    start_ms: int
    task: asyncio.Task[Any] | None
    cancelling: bool = False


class Tracker:
    """Tracked jobs of one lane's consumer: their settles, cancel requests and progress."""

    def __init__(self, ctx: LaneContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._runs: dict[tuple[int, str], _Run] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cancelled_runs = 0
        # One object, so the settler groups every completion of a shard into one call.
        self._batch: Callable[[list[SettleOp], str], Call] = self._complete_many

    # -- running jobs (event loop) --------------------------------------------------------------
    def start(self, shard: ShardKeys, entry_id: str, job: Job[Any], *,
              cancellable: bool) -> None:
        """Register a tracked job that is about to run (from its own task)."""
        loop = self._loop = asyncio.get_running_loop()
        handle = _Handle(self, shard, entry_id, loop)
        job._ctl = handle
        task = asyncio.current_task() if cancellable else None
        run = _Run(job, handle, int(self.ctx.clock.now_ms()), task)
        with self._lock:
            self._runs[(shard.index, entry_id)] = run

    def stop(self, shard: ShardKeys, entry_id: str) -> None:
        """The processor returned (or raised): no cancellation may land from now on."""
        with self._lock:
            self._runs.pop((shard.index, entry_id), None)

    def absorb_cancel(self, job: Job[Any]) -> JobCancelled | None:
        """The error to settle with when the job's task was cancelled by a cancel request
        alone (:class:`JobCancelled`); None for any other cancellation (a shutdown's, also
        when it comes on top of ours), which the caller re-raises."""
        handle = job._ctl
        task = asyncio.current_task()
        if (not isinstance(handle, _Handle) or not handle.cancelled_task or task is None
                or task.cancelling() != 1):
            return None
        task.uncancel()
        return JobCancelled(
            f"queue {job.queue!r} job {job.name!r} id {job.id!r} was cancelled while running",
            queue=job.queue, job=job.name, job_id=job.id, shard=job.shard,
        )

    def _requested(self, index: int, job_ids: list[str]) -> None:
        wanted = set(job_ids)
        with self._lock:
            runs = [r for (i, _), r in self._runs.items() if i == index and r.job.id in wanted]
        for run in runs:
            if run.handle.cancel_requested:
                continue
            run.handle.cancel_requested = True
            _log.info("cancellation requested; stopping the job",
                      extra={"queue": self.ctx.name, "job_id": run.job.id, "job": run.job.name,
                             "cancel": "task" if run.task else "flag"})
            if run.task is not None and not run.cancelling:
                run.cancelling = True
                run.handle.cancelled_task = True
                run.task.cancel()

    # -- the renewal thread ---------------------------------------------------------------------
    def riders(self) -> list[tuple[Call, Callable[[Any], None]]]:
        """Calls to send with a lock renewal (renewal thread): one per shard with tracked
        jobs running here, each answered by the jobs to cancel."""
        with self._lock:
            if not self._runs:
                return []
            per: dict[int, list[tuple[str, str, int]]] = {}
            for (index, entry_id), run in self._runs.items():
                per.setdefault(index, []).append((run.job.id, entry_id, run.start_ms))
        loop = self._loop
        out: list[tuple[Call, Callable[[Any], None]]] = []
        for index, running in per.items():
            def done(reply: Any, index: int = index) -> None:
                if reply and loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(self._requested, index, list(reply))
            call = ops.control(self.ctx.shards[index], self.ctx.group, self.ctx.consumer, running)
            out.append((call, done))
        return out

    # -- progress -------------------------------------------------------------------------------
    async def progress(self, handle: _Handle, job: Job[Any], fraction: float,
                       detail: Any) -> bool:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
            0.0 <= float(fraction) <= 1.0
        ):
            raise ConfigurationError(
                f"queue {job.queue!r} job {job.name!r} id {job.id!r}: field 'fraction' must "
                f"be a number from 0 to 1, got {fraction!r}",
                queue=job.queue, job=job.name, job_id=job.id,
            )
        try:
            text = "" if detail is None else json.dumps(detail, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"queue {job.queue!r} job {job.name!r} id {job.id!r}: field 'detail' is not "
                f"JSON: {exc}", queue=job.queue, job=job.name, job_id=job.id,
            ) from exc
        call = ops.progress(handle.shard, self.ctx.group, self.ctx.consumer, job_id=job.id,
                            entry_id=handle.entry_id, fraction=float(fraction),
                            detail=text[:4000])
        return bool((await run_calls(self.ctx.client, [call], queue=self.ctx.name))[0])

    # -- settles --------------------------------------------------------------------------------
    def encode_result(self, job_name: str, job: Job[Any]) -> InvalidResult | None:
        """Validate and encode a completed run's return value into ``job._result_json``;
        the error the run becomes instead when the value does not fit."""
        spec = self.ctx.contract.jobs.get(job_name)
        if spec is None:
            return None
        try:
            job._result_json = encode_result(spec, job._result, queue=self.ctx.name,
                                             job_id=job.id)
        except InvalidResult as exc:
            return exc
        return None

    def _op(self, kind: Any, shard: ShardKeys, entry_id: str, entry: dict[bytes, bytes],
            **kw: Any) -> SettleOp:
        ctx = self.ctx
        build = TrackedSettle(
            shard=shard, group=ctx.group, consumer=ctx.consumer, entry_id=entry_id,
            job_id=_text(entry.get(b"id")), keep_ms=keep_ms(entry), **kw,
        )
        return SettleOp(kind, shard, entry_id, build=build)

    def complete_op(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes], *,
                    job_name: str, attempt: int, result_json: str | None) -> SettleOp:
        record = final_record(job_name=job_name, attempt=attempt, result_json=result_json)
        op = self._op("complete", shard, entry_id, fields, action="complete", record=record)
        op.batch = self._batch
        return op

    def cancel_op(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes], *,
                  job_name: str, attempt: int) -> SettleOp:
        record = final_record(job_name=job_name, attempt=attempt, reason="cancelled")
        op = self._op("complete", shard, entry_id, fields, action="cancel", record=record)
        op.batch = self._batch
        return op

    def _complete_many(self, group: list[SettleOp], token: str) -> Call:
        """One ``complete_tracked`` call for the completions (and cancels) of one shard;
        its parse hands each op's outcome to the op's :class:`TrackedSettle`."""
        holders = [op.build for op in group]
        jobs = []
        for h in holders:
            assert isinstance(h, TrackedSettle)
            kw = h.kw
            jobs.append(ops.TrackedDone(kw["entry_id"], kw["job_id"], kw["action"] == "cancel",
                                        kw["keep_ms"], kw["record"]))
        call = ops.complete_tracked(group[0].shard, self.ctx.group, self.ctx.consumer, jobs,
                                    token=token)
        base = call.parse

        def parse(reply: Any) -> list[ops.SettleStatus]:
            statuses, outcomes = base(reply)
            for h, o in zip(holders, outcomes, strict=True):
                if isinstance(h, TrackedSettle):
                    h.outcome = "" if o == "-" else o
            return list(statuses)

        return dataclasses.replace(call, parse=parse)

    def retry_op(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes], *,
                 member: str, delay_ms: int, flat: list[str | bytes]) -> SettleOp:
        record = final_record(job_name=_text(fields.get(b"name")), attempt=0)
        return self._op("retry", shard, entry_id, fields, action="retry", record=record,
                        member=member, delay_ms=delay_ms, fields=flat)

    def dead_op(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes], *,
                dead: list[str | bytes], reason: str, error: str, attempts: int) -> SettleOp:
        record = final_record(job_name=_text(fields.get(b"name")), attempt=attempts,
                              reason=reason, error=error)
        return self._op("fail", shard, entry_id, fields, action="fail", record=record,
                        dead_cap=self.ctx.options.dead_letter_cap, fields=dead)

    def confirmed(self, op: SettleOp, outcome: str, job_id: str) -> str:
        """The outcome to report for ``op``: a tracked settle may have applied a cancel."""
        build = op.build
        if not isinstance(build, TrackedSettle) or outcome in ("lock_lost", "unsettled"):
            return outcome
        if build.outcome == "x":
            self.cancelled_runs += 1
            _log.info("job cancelled", extra={"queue": self.ctx.name, "job_id": job_id,
                                               "shard": op.shard.name})
            return "cancelled"
        return outcome

    async def write_finals(self, shard: ShardKeys, finals: list[ops.TrackedFinal]) -> None:
        """Write the final records of tracked jobs the reclaimer dead-lettered as stalled."""
        calls = [
            ops.track_final(shard, f.job_id, keep_ms=f.keep_ms, record=final_record(
                job_name=f.job_name, attempt=f.attempt, reason="stalled", error=f.error,
                state="dead",
            ))
            for f in finals if f.keep_ms > 0
        ]
        if calls:
            await run_calls(self.ctx.client, calls, queue=self.ctx.name)

