"""One job, in stages: decode, validate, run, settle, and report the outcome Redis confirmed.

The outcome of a run decides the settle (DESIGN.md §6):

================================  ==============================================
the processor                     the job
================================  ==============================================
returns                           completed (fenced XACK + XDEL)
raises ``Retry`` / ``RateLimited`` re-delayed, no attempt spent
raises ``PermanentError``         dead letter now (reason ``permanent``)
times out                         failed attempt (reason ``timeout``)
raises anything else              retried with backoff until attempts run out,
                                  then dead letter (reason ``error``)
payload invalid / job unknown     dead letter now, never run
================================  ==============================================

What hooks, logs, spans and metrics hear is the settle's answer, not the intent: a complete
that the fence refused is ``lock_lost``, never ``completed``. The slot is freed as soon as
the processor returns; the job's task waits for the answer inside its span.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from streamq import ops
from streamq.app import Registration
from streamq.backoff import compute_backoff_ms
from streamq.envelope import (
    FIELD_NAMES,
    RawJob,
    add_error_to_baggage,
    decode_entry,
    flat_fields,
    validate_payload,
)
from streamq.errors import InvalidPayload, JobCancelled, JobTimeout, PermanentError, Retry
from streamq.hooks import JobInfo
from streamq.job import Job
from streamq.keys import ShardKeys
from streamq.redact import scrub_text, secret_values
from streamq.runtime.context import LaneContext
from streamq.runtime.execute import run_processor
from streamq.runtime.fetch import Entry
from streamq.runtime.settle import SettleOp, Status
from streamq.runtime.tenancy import TenantGate
from streamq.runtime.tracking import Tracker, is_tracked
from streamq.tenants import TenantControl

__all__ = ["JobRunner", "Poison", "retry_values"]

_log = logging.getLogger("streamq.worker")

TRACEBACK_LINES = 8

_KNOWN_FIELDS = frozenset(n.encode() for n in FIELD_NAMES)

# The outcome a settle kind reports when Redis applied it.
_APPLIED = {"complete": "completed", "release": "released"}


@dataclass(slots=True)
class Poison:
    """An entry that cannot run (undecodable, unknown job, invalid payload): its dead letter."""

    shard: ShardKeys
    op: SettleOp
    reason: str
    job_name: str


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    out: list[bytes] = []
    for k, v in fields.items():
        out.append(k)
        out.append(v)
    return out


def retry_values(raw: RawJob, **changes: Any) -> tuple[list[str | bytes], list[bytes]]:
    """The envelope values of a retry, and the entry's fields this version does not know.

    A newer producer may have added envelope fields: a retry keeps them (flat name/value
    pairs after the known fields), as dead letters and releases do.
    """
    extra: list[bytes] = []
    for k, v in raw.fields.items():
        kb = k if isinstance(k, bytes) else str(k).encode()
        if kb not in _KNOWN_FIELDS:
            extra.append(kb)
            extra.append(v if isinstance(v, bytes) else str(v).encode())
    return raw.encoded(**changes), extra


class JobRunner:
    """Runs entries of one lane to their confirmed outcome.

    Args:
        ctx: the lane.
        registration: the processors.
        pool: threads for sync processors.
        submit: hands a settle to the settler.
        extend_lock: asks the renewal thread for a renewal now (``job.extend_lock``).
        gate: the per-tenant concurrency cap, when the lane has one.
        tenants: flags tenants for ``job.flag_tenant``, when the queue can route them.
    """

    def __init__(
        self,
        ctx: LaneContext,
        registration: Registration,
        pool: ThreadPoolExecutor,
        *,
        submit: Callable[[SettleOp], None],
        extend_lock: Callable[[], None],
        gate: TenantGate | None = None,
        tenants: TenantControl | None = None,
        tracker: Tracker | None = None,
    ) -> None:
        self.ctx = ctx
        # Tracked jobs (status, cancel, results) settle through it; untracked ones never do.
        self.tracker = tracker or Tracker(ctx)
        self.registration = registration
        self.pool = pool
        self.submit = submit
        self.extend_lock = extend_lock
        self.gate = gate
        self.tenants = tenants
        self.running: dict[tuple[int, str], Job[Any]] = {}

    def mark_lost(self, shard: int, ids: list[str]) -> list[str]:
        """Flag running jobs whose lock was lost; returns the ids that are not running."""
        rest = []
        for eid in ids:
            job = self.running.get((shard, eid))
            if job is None:
                rest.append(eid)
            else:
                job._lost = True
        return rest

    # -- settling ------------------------------------------------------------------------------
    def settle(self, op: SettleOp) -> asyncio.Future[Status | None]:
        """Submit ``op``; the future resolves with Redis's answer (None: never answered)."""
        return self._settle(op)

    def _settle(self, op: SettleOp) -> asyncio.Future[Status | None]:
        fut: asyncio.Future[Status | None] = asyncio.get_running_loop().create_future()

        def then(status: Status | None) -> None:
            if not fut.done():
                fut.set_result(status)

        op.then = then
        self.submit(op)
        return fut

    def _dead_op(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes], *,
                 reason: str, error: BaseException | None, attempts: int) -> SettleOp:
        ctx = self.ctx
        dead = self.dead_fields(fields, reason=reason, error=error, attempts=attempts)
        if is_tracked(fields) and fields.get(b"id"):
            return self.tracker.dead_op(shard, entry_id, fields, dead=dead, reason=reason,
                                        error=_text_of(dead, "error"), attempts=attempts)
        return SettleOp("fail", shard, entry_id, build=lambda token: ops.fail(
            shard, ctx.group, ctx.consumer, entry_id=entry_id, dead_fields=dead,
            dead_cap=ctx.options.dead_letter_cap, token=token,
        ))

    def _retry_op(self, shard: ShardKeys, raw: RawJob, *, delay_ms: int,
                  values: tuple[list[str | bytes], list[bytes]]) -> SettleOp:
        ctx = self.ctx
        # A delayed record is keyed by job id and entry id: unique (an entry is retried at most
        # once, fenced), so two copies of one job id never overwrite each other.
        member = f"{raw.id}:{raw.entry_id}"
        env, extra = values
        if is_tracked(raw.fields):
            return self.tracker.retry_op(shard, raw.entry_id, raw.fields, member=member,
                                         delay_ms=delay_ms, flat=[*flat_fields(env), *extra])
        return SettleOp("retry", shard, raw.entry_id, build=lambda token: ops.retry(
            shard, ctx.group, ctx.consumer, entry_id=raw.entry_id, member=member,
            delay_ms=delay_ms, values=env, extra_fields=extra, token=token,
        ))

    def dead_fields(self, fields: dict[bytes, bytes], *, reason: str,
                    error: BaseException | None, attempts: int) -> list[str | bytes]:
        """The dead-letter record: the original entry's fields plus why and where it died."""
        tb = ""
        if error is not None:
            lines = traceback.format_exception(type(error), error, error.__traceback__)
            tb = "\n".join("".join(lines)[-4000:].splitlines()[-TRACEBACK_LINES:])
        # Error text may quote the payload (a validation error shows its input): never store
        # a secret field's value there; the payload itself is redacted when listed.
        secrets = secret_values(fields.get(b"payload", b""), self.ctx.contract.secret_fields)
        extra: list[str | bytes] = [
            "reason", reason,
            "error_type", type(error).__name__ if error else "",
            "error", scrub_text(str(error), secrets)[:2000] if error else "",
            "traceback", scrub_text(tb, secrets),
            "attempts", str(attempts),
            "worker", self.ctx.consumer,
            "queue", self.ctx.name,
        ]
        return [*_flat(fields), *extra]

    def _count_dead(self, shard: ShardKeys, job_name: str, reason: str,
                    status: Status | None) -> None:
        if status == Status.APPLIED:
            self.ctx.hooks.job_dead_lettered(self.ctx.name, shard.name, job_name, reason)

    # -- running -------------------------------------------------------------------------------
    async def run(self, shard: ShardKeys, entry: Entry, slot_free: Callable[[], None]) -> None:
        """Run one entry to its confirmed settle. Never raises but CancelledError."""
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                slot_free()

        try:
            await self._run(shard, entry, free)
        finally:
            free()

    def prepare(self, shard: ShardKeys, entry: Entry) -> tuple[RawJob, Any, Any] | Poison:
        """Decode and validate an entry: ``(raw, payload, handler)``, or the poison's settle."""
        ctx = self.ctx
        try:
            raw = decode_entry(entry.entry_id, entry.fields)
        except Exception as exc:
            # Whatever cannot be decoded is poison, InvalidPayload or not (JSON nested too
            # deep raises RecursionError): left unsettled, it would be held forever.
            return self._poison(shard, entry, "invalid_payload", exc, 0, "")
        spec = ctx.contract.jobs.get(raw.name)
        handler = self.registration.handler(raw.name)
        if spec is None or handler is None:
            exc2 = InvalidPayload(
                f"queue {ctx.name!r} has no processor for job {raw.name!r}",
                queue=ctx.name, job=raw.name, job_id=raw.id,
            )
            return self._poison(shard, entry, "unknown_job", exc2, raw.attempt - 1,
                                raw.name if spec else "")
        try:
            payload = validate_payload(raw, spec.model, queue=ctx.name)
        except Exception as exc:
            # A model validator may raise more than ValueError: still poison, never run.
            return self._poison(shard, entry, "invalid_payload", exc, raw.attempt - 1,
                                raw.name)
        return raw, payload, handler

    def _poison(self, shard: ShardKeys, entry: Entry, reason: str, exc: BaseException,
                attempts: int, job_name: str) -> Poison:
        op = self._dead_op(shard, entry.entry_id, entry.fields, reason=reason, error=exc,
                           attempts=attempts)
        return Poison(shard, op, reason, job_name)

    async def settle_poison(self, poison: Poison, free: Callable[[], None]) -> None:
        """Dead-letter a poison entry (it never runs); count it once Redis confirmed."""
        fut = self._settle(poison.op)
        free()
        self._count_dead(poison.shard, poison.job_name, poison.reason, await fut)

    async def _run(self, shard: ShardKeys, entry: Entry, free: Callable[[], None]) -> None:
        got = self.prepare(shard, entry)
        if isinstance(got, Poison):
            await self.settle_poison(got, free)
            return
        raw, payload, handler = got
        if self.gate is None:
            await self._attempt(shard, raw, payload, handler, free)
            return
        slot = await self.gate.enter(shard, raw, payload)
        if slot is None:
            await self._wait_for_tenant(shard, raw, self.gate.delay_ms(), free)
            return
        try:
            await self._attempt(shard, raw, payload, handler, slot.then(free))
        finally:
            slot.release()

    async def _wait_for_tenant(self, shard: ShardKeys, raw: RawJob, delay_ms: int,
                               free: Callable[[], None]) -> None:
        """Re-delay a job whose tenant runs its cap already: it never started, so no attempt
        is spent and no attempt is reported (only the wait is counted)."""
        op = self._retry_op(shard, raw, delay_ms=delay_ms, values=retry_values(raw))
        fut = self._settle(op)
        free()
        if await fut == Status.APPLIED:
            self.ctx.hooks.tenant_cap_waited(self.ctx.name, shard.name, raw.name)

    def info(self, shard: ShardKeys, raw: RawJob, payload: Any) -> tuple[JobInfo, Job[Any]]:
        """What hooks get about one run, and the job its processor gets."""
        ctx = self.ctx
        tenant = None
        if ctx.contract.tenant_field:
            tenant = str(getattr(payload, ctx.contract.tenant_field, "") or "") or None
        info = JobInfo(
            queue=ctx.name, shard=shard.name, job_id=raw.id, job_name=raw.name,
            attempt=raw.attempt, max_attempts=ctx.max_attempts, entry_id=raw.entry_id,
            wait_ms=max(0.0, ctx.clock.now_ms() - raw.due_ms), tenant=tenant,
            trace_context=raw.trace_context,
            secret_values=(
                secret_values(raw.payload_json, ctx.contract.secret_fields)
                if ctx.contract.secret_fields else frozenset()
            ),
        )
        job: Job[Any] = Job(
            id=raw.id, name=raw.name, queue=ctx.name, shard=shard.name, payload=payload,
            attempt=raw.attempt, max_attempts=ctx.max_attempts, timestamp=raw.timestamp_ms,
            retry_baggage=raw.retry_baggage, trace_context=raw.trace_context, tenant=tenant,
            extend_lock=self.extend_lock, tenant_control=self.tenants,
        )
        return info, job

    def decide(self, shard: ShardKeys, raw: RawJob,
               error: BaseException | None) -> tuple[SettleOp, str]:
        """The settle for a run that ended with ``error`` (None: it completed), and the
        outcome it reports when Redis applies it."""
        if is_tracked(raw.fields):
            if error is None:
                job = self.running.get((shard.index, raw.entry_id))
                return self.tracker.complete_op(
                    shard, raw.entry_id, raw.fields, job_name=raw.name, attempt=raw.attempt,
                    result_json=job._result_json if job is not None else None,
                ), "completed"
            if isinstance(error, JobCancelled):
                return self.tracker.cancel_op(shard, raw.entry_id, raw.fields,
                                              job_name=raw.name, attempt=raw.attempt), "cancelled"
        if error is None:
            return SettleOp("complete", shard, raw.entry_id), "completed"
        if isinstance(error, Retry):
            return self._retry_op(shard, raw, delay_ms=error.delay_ms,
                                  values=retry_values(raw)), "delayed"
        if isinstance(error, PermanentError):
            self._log_failure(raw, error, final=True)
            return self._dead_op(shard, raw.entry_id, raw.fields, reason="permanent",
                                 error=error, attempts=raw.attempt), "failed"
        return self._failed_attempt(shard, raw, error)

    async def finish(self, shard: ShardKeys, raw: RawJob, info: JobInfo, op: SettleOp,
                     intent: str, error: BaseException | None, duration: float,
                     fut: asyncio.Future[Status | None]) -> None:
        """Wait for Redis's answer to ``op`` and report the outcome it confirms."""
        self.report(shard, raw, info, op, intent, error, duration, await fut)

    def report(self, shard: ShardKeys, raw: RawJob, info: JobInfo, op: SettleOp, intent: str,
               error: BaseException | None, duration: float, status: Status | None) -> None:
        """Report the outcome Redis confirmed for ``op`` (``status``)."""
        outcome = self.tracker.confirmed(op, _confirmed(op.kind, intent, status), raw.id)
        if op.kind == "fail" and outcome != "cancelled":
            self._count_dead(shard, raw.name, _reason(error), status)
        self.ctx.hooks.job_finished(info, outcome, duration, error)

    async def _attempt(self, shard: ShardKeys, raw: RawJob, payload: Any, handler: Any,
                       free: Callable[[], None]) -> None:
        ctx = self.ctx
        info, job = self.info(shard, raw, payload)
        key = (shard.index, raw.entry_id)
        self.running[key] = job
        tracked = is_tracked(raw.fields)
        if tracked:
            self.tracker.start(shard, raw.entry_id, job,
                               cancellable=Registration.is_async(handler))
        ctx.hooks.job_started(info)
        started = time.perf_counter()
        with ctx.hooks.process_context(info):
            error: BaseException | None = None
            try:
                try:
                    job._result = await run_processor(handler, job,
                                                      timeout_s=ctx.options.timeout_s,
                                                      pool=self.pool)
                    error = job.failure
                except asyncio.CancelledError:
                    # A cancel request's own cancellation ends the run; any other (shutdown)
                    # goes on to release the job.
                    error = self.tracker.absorb_cancel(job) if tracked else None
                    if error is None:
                        raise
                except Exception as exc:
                    error = exc
                finally:
                    if tracked:
                        self.tracker.stop(shard, raw.entry_id)
                if tracked and error is None:
                    error = self.tracker.encode_result(raw.name, job)  # an invalid result
                op, intent = self.decide(shard, raw, error)
            except asyncio.CancelledError:
                # Shutdown ran out of time: hand the job back so another worker takes it now.
                await self.released([(shard, raw, info)], started, [free])
                raise
            finally:
                self.running.pop(key, None)
            duration = time.perf_counter() - started
            fut = self._settle(op)
            free()
            await self.finish(shard, raw, info, op, intent, error, duration, fut)

    async def released(self, runs: list[tuple[ShardKeys, RawJob, JobInfo]], started: float,
                       frees: list[Callable[[], None]]) -> None:
        """Release cancelled runs (shutdown past its timeout) and report what Redis said."""
        duration = time.perf_counter() - started
        futs = [self._settle(SettleOp("release", shard, raw.entry_id)) for shard, raw, _ in runs]
        for free in frees:
            free()
        try:
            statuses = await asyncio.shield(asyncio.gather(*futs))
        except asyncio.CancelledError:
            statuses = [f.result() if f.done() else None for f in futs]
        for (_, _, info), status in zip(runs, statuses, strict=True):
            self.ctx.hooks.job_finished(info, _confirmed("release", "released", status),
                                        duration, None)

    def _failed_attempt(self, shard: ShardKeys, raw: RawJob,
                        exc: BaseException) -> tuple[SettleOp, str]:
        ctx = self.ctx
        reason = "timeout" if isinstance(exc, JobTimeout) else "error"
        if raw.attempt >= ctx.max_attempts:
            self._log_failure(raw, exc, final=True)
            return self._dead_op(shard, raw.entry_id, raw.fields, reason=reason, error=exc,
                                 attempts=raw.attempt), "failed"
        self._log_failure(raw, exc, final=False)
        baggage = add_error_to_baggage(
            raw.retry_baggage, attempt=raw.attempt, error_type=type(exc).__name__,
            message=str(exc), at_ms=int(ctx.clock.now_ms()),
        )
        delay = compute_backoff_ms(ctx.backoff, raw.attempt)
        values = retry_values(raw, attempt=raw.attempt + 1, retry_baggage=baggage)
        return self._retry_op(shard, raw, delay_ms=delay, values=values), "retried"

    def _log_failure(self, raw: RawJob, exc: BaseException, *, final: bool) -> None:
        _log.warning(
            "job failed; dead-lettering" if final else "job failed; will retry",
            extra={
                "queue": self.ctx.name, "job_id": raw.id, "job": raw.name,
                "attempt": raw.attempt, "error_type": type(exc).__name__,
                "error": scrub_text(
                    str(exc), secret_values(raw.payload_json, self.ctx.contract.secret_fields)
                )[:500],
            },
        )


def _text_of(flat: list[str | bytes], name: str) -> str:
    """The value of ``name`` among flat name/value pairs, as text ('' when absent)."""
    for i in range(len(flat) - 2, -1, -2):
        if flat[i] == name:
            v = flat[i + 1]
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return ""


def _reason(error: BaseException | None) -> str:
    if isinstance(error, PermanentError):
        return "permanent"
    if isinstance(error, JobTimeout):
        return "timeout"
    return "error"


def _confirmed(kind: str, intent: str, status: Status | None) -> str:
    """The outcome to report: the intent when Redis applied it, else what happened."""
    if status is None:
        return "unsettled"
    if status == Status.APPLIED:
        return _APPLIED.get(kind, intent)
    return "lock_lost"
