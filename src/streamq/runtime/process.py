"""One job, in stages: decode, validate, run, settle.

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
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import TYPE_CHECKING, Any

from streamq import ops
from streamq.backoff import compute_backoff_ms
from streamq.envelope import RawJob, add_error_to_baggage, decode_entry, validate_payload
from streamq.errors import InvalidPayload, JobTimeout, PermanentError, Retry
from streamq.hooks import JobInfo
from streamq.job import Job
from streamq.keys import ShardKeys
from streamq.redact import scrub_text, secret_values
from streamq.runtime.execute import run_processor
from streamq.runtime.settle import SettleOp

if TYPE_CHECKING:
    from streamq.runtime.worker import Worker

__all__ = ["process_entry"]

TRACEBACK_LINES = 8


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    out: list[bytes] = []
    for k, v in fields.items():
        out.append(k)
        out.append(v)
    return out


def dead_fields(
    w: Worker,
    fields: dict[bytes, bytes],
    *,
    reason: str,
    error: BaseException | None,
    attempts: int,
) -> list[str | bytes]:
    """The dead-letter record: the original envelope fields plus why and where it died."""
    tb = ""
    if error is not None:
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        tb = "".join(lines)[-4000:]
        tb = "\n".join(tb.splitlines()[-TRACEBACK_LINES:])
    # Error text may quote the payload (a validation error shows its input): never store a
    # secret field's value there; the payload itself is redacted when listed.
    secrets = secret_values(fields.get(b"payload", b""), w.contract.secret_fields)
    extra: list[str | bytes] = [
        "reason", reason,
        "error_type", type(error).__name__ if error else "",
        "error", scrub_text(str(error), secrets)[:2000] if error else "",
        "traceback", scrub_text(tb, secrets),
        "attempts", str(attempts),
        "worker", w.consumer,
        "queue", w.lane.name,
    ]
    return [*_flat(fields), *extra]


async def _dead(
    w: Worker,
    shard: ShardKeys,
    entry_id: str,
    fields: dict[bytes, bytes],
    *,
    reason: str,
    error: BaseException | None,
    attempts: int,
    job_name: str,
) -> None:
    call = ops.fail(
        shard,
        w.group,
        w.consumer,
        entry_id=entry_id,
        dead_fields=dead_fields(w, fields, reason=reason, error=error, attempts=attempts),
        dead_cap=w.options.dead_letter_cap,
    )

    def count(ok: bool) -> None:
        # Only a dead letter that landed counts: a fenced-out fail is a lost lock instead.
        if ok:
            w.on_dead(shard, job_name, reason)

    w.settle(SettleOp("fail", shard, entry_id, call, then=count))


def _retry(
    w: Worker, shard: ShardKeys, raw: RawJob, *, delay_ms: int, values: list[str | bytes]
) -> None:
    call = ops.retry(
        shard,
        w.group,
        w.consumer,
        entry_id=raw.entry_id,
        job_id=raw.id,
        delay_ms=delay_ms,
        values=values,
    )
    w.settle(SettleOp("retry", shard, raw.entry_id, call))


async def process_entry(
    w: Worker, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes]
) -> None:
    """Run one fetched entry to its settle. Never raises (errors become settles)."""
    try:
        raw = decode_entry(entry_id, fields)
    except Exception as exc:
        # Whatever cannot be decoded is poison, InvalidPayload or not (JSON nested too deep
        # raises RecursionError): left unsettled, it would be held and renewed forever.
        await _dead(w, shard, entry_id, fields, reason="invalid_payload", error=exc,
                    attempts=0, job_name="")
        return
    spec = w.contract.jobs.get(raw.name)
    handler = w.registration.handler(raw.name)
    if spec is None or handler is None:
        exc2 = InvalidPayload(
            f"queue {w.lane.name!r} has no processor for job {raw.name!r}",
            queue=w.lane.name, job=raw.name, job_id=raw.id,
        )
        await _dead(w, shard, entry_id, fields, reason="unknown_job", error=exc2,
                    attempts=raw.attempt - 1, job_name=raw.name if spec else "")
        return
    try:
        payload = validate_payload(raw, spec.model, queue=w.lane.name)
    except Exception as exc:
        # A model validator may raise more than ValueError (pydantic passes a TypeError or
        # KeyError through): still poison, never run.
        await _dead(w, shard, entry_id, fields, reason="invalid_payload", error=exc,
                    attempts=raw.attempt - 1, job_name=raw.name)
        return
    await _run(w, shard, raw, payload, handler)


async def _run(w: Worker, shard: ShardKeys, raw: RawJob, payload: Any, handler: Any) -> None:
    tenant = None
    if w.contract.tenant_field:
        tenant = str(getattr(payload, w.contract.tenant_field, "") or "") or None
    info = JobInfo(
        queue=w.lane.name,
        shard=shard.name,
        job_id=raw.id,
        job_name=raw.name,
        attempt=raw.attempt,
        max_attempts=w.max_attempts,
        entry_id=raw.entry_id,
        wait_ms=max(0.0, w.server_now_ms() - raw.due_ms),
        tenant=tenant,
        trace_context=raw.trace_context,
        secret_values=(
            secret_values(raw.payload_json, w.contract.secret_fields)
            if w.contract.secret_fields else frozenset()
        ),
    )
    job: Job[Any] = Job(
        id=raw.id, name=raw.name, queue=w.lane.name, shard=shard.name, payload=payload,
        attempt=raw.attempt, max_attempts=w.max_attempts, timestamp=raw.timestamp_ms,
        retry_baggage=raw.retry_baggage, trace_context=raw.trace_context, tenant=tenant,
        extend_lock=w.renew_now,
    )
    w.running[(shard.index, raw.entry_id)] = job
    w.hooks.job_started(info)
    started = time.perf_counter()
    with w.hooks.process_context(info):
        error: BaseException | None = None
        try:
            await run_processor(handler, job, timeout_s=w.options.timeout_s, pool=w.pool)
            outcome = "completed"
            w.settle(SettleOp("complete", shard, raw.entry_id))
        except Retry as exc:
            error, outcome = exc, "delayed"
            _retry(w, shard, raw, delay_ms=exc.delay_ms, values=raw.encoded())
        except PermanentError as exc:
            error, outcome = exc, "failed"
            await _dead(w, shard, raw.entry_id, raw.fields, reason="permanent", error=exc,
                        attempts=raw.attempt, job_name=raw.name)
        except Exception as exc:
            error = exc
            outcome = await _failed_attempt(w, shard, raw, exc)
        except asyncio.CancelledError:
            # Shutdown ran out of time: the worker releases the entry (Worker._guarded).
            # The run still ends for the hooks, so its processing time is recorded.
            w.hooks.job_finished(info, "released", time.perf_counter() - started, None)
            raise
        finally:
            w.running.pop((shard.index, raw.entry_id), None)
        if job.lock_lost:
            # Renewal found the job reclaimed by another worker while it ran: the settle
            # above is refused (fenced), so this run must not count as completed or failed.
            outcome = "lock_lost"
        w.hooks.job_finished(info, outcome, time.perf_counter() - started, error)


async def _failed_attempt(w: Worker, shard: ShardKeys, raw: RawJob, exc: Exception) -> str:
    reason = "timeout" if isinstance(exc, JobTimeout) else "error"
    if raw.attempt >= w.max_attempts:
        w.log_failure(raw, exc, final=True)
        await _dead(w, shard, raw.entry_id, raw.fields, reason=reason, error=exc,
                    attempts=raw.attempt, job_name=raw.name)
        return "failed"
    w.log_failure(raw, exc, final=False)
    baggage = add_error_to_baggage(
        raw.retry_baggage,
        attempt=raw.attempt,
        error_type=type(exc).__name__,
        message=str(exc),
        at_ms=int(w.server_now_ms()),
    )
    delay = compute_backoff_ms(w.backoff, raw.attempt)
    _retry(w, shard, raw, delay_ms=delay,
           values=raw.encoded(attempt=raw.attempt + 1, retry_baggage=baggage))
    return "retried"
