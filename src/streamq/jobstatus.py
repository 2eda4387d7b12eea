"""Job status, cancellation and results: the records behind ``Queue.status`` and friends.

Only **tracked** jobs have them: a job whose contract declares ``track=True``, a result model
or ``keep_result``, or an add that asks (``add(..., track=True)`` or ``keep_result=``).
Untracked jobs write nothing more than before. A tracked job carries one extra envelope field,
``ctl`` (JSON ``{"keep": <ms>}``), so every script that moves it knows to keep two records
in step, both in the job's shard:

* the **location record**, a field of the shard's ``tracked`` hash: job id -> JSON
  ``{"e": <stream entry id>}`` (ready or running) or ``{"m": <delayed member>}`` (delayed or
  waiting for a retry), plus ``k`` (keep ms), ``x`` (cancel requested), ``c``/``s`` (the
  consumer running it and since when, ms) and ``p``/``d`` (progress and its detail). It
  exists from the add until the job leaves (completed, cancelled, dead): the hash holds one
  field per tracked job still in the queue.
* the **final record**, key ``result:<job id>``: a one-element list holding JSON
  ``{"state", "at", "n" (job name), "a" (attempt), "r" (result JSON), "reason", "error"}``,
  written when the job leaves, with a ``PEXPIRE`` of ``keep`` ms (none at all when keep is
  0). Waiters block on it with ``BLMOVE key key LEFT LEFT`` (the element stays for the next).

A status is read by one script per shard (:func:`streamq.ops.job_status`), all shards in one
pipelined round trip, never scanning a stream: the location record names the entry, and
``XPENDING`` on that one id says whether it runs (and where), ``XRANGE`` on it whether it
waits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from streamq import ops
from streamq._redis import Call
from streamq.contracts import JobSpec, Lane, QueueContract
from streamq.durations import Duration, to_ms
from streamq.envelope import validation_fields
from streamq.errors import (
    ConfigurationError,
    InvalidResult,
    JobCancelled,
    JobFailed,
    JobNotFound,
    ResultTimeout,
)
from streamq.keys import QueueKeys, ShardKeys

__all__ = [
    "CancelResult",
    "JobState",
    "JobStatus",
    "Lookup",
    "ctl_value",
    "final_record",
    "keep_to_ms",
]

JobState = Literal[
    "waiting", "delayed", "active", "retrying", "completed", "cancelled", "dead", "unknown"
]
"""Where a job is. ``delayed``: waiting for its due time; ``retrying``: waiting for its due
time after a failed attempt; ``completed``, ``cancelled`` and ``dead`` only while the final
record is kept; ``unknown``: not tracked, or finished and forgotten."""

CTL_FIELD = b"ctl"
"""The envelope field that marks a tracked job."""

_LIVE = ("active", "waiting", "delayed", "retrying")


def keep_to_ms(keep: Duration | None, *, what: str = "keep_result") -> int | None:
    """``keep`` (a timedelta or seconds) as ms; None stays None. Refuses negatives."""
    return None if keep is None else to_ms(keep, what)


def ctl_value(spec: JobSpec[Any], track: bool | None, keep_result: Duration | None
              ) -> str | None:
    """The ``ctl`` field of one add of ``spec``, or None when the add is not tracked.

    ``keep_result`` (the add's) wins over the contract's; ``track=False`` with no keep turns
    the contract's tracking off for this add.
    """
    keep = keep_to_ms(keep_result)
    if keep is None:
        if track is False:
            return None
        keep = spec.keep_result_ms
        if keep is None and not (track or spec.track):
            return None
    return json.dumps({"keep": keep or 0}, separators=(",", ":"))


def final_record(*, job_name: str, attempt: int, result_json: str | None = None,
                 reason: str | None = None, error: str | None = None,
                 state: str | None = None) -> str:
    """A final record's fields as JSON (the script adds ``at``, and ``state`` when not
    given)."""
    rec: dict[str, Any] = {"n": job_name, "a": attempt}
    if state:
        rec["state"] = state
    if result_json is not None:
        rec["r"] = result_json
    if reason:
        rec["reason"] = reason
    if error:
        rec["error"] = error[:2000]
    return json.dumps(rec, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What one tracked job is doing, as :meth:`Queue.status <streamq.Queue.status>` found it.

    Attributes:
        job_id: the job id asked for.
        state: see :data:`JobState`.
        queue: the lane the job is on (None when unknown).
        shard: the shard the job is on.
        job: the job name.
        attempt: the 1-based attempt running, waiting or last run.
        due_ms: ``delayed``/``retrying``: when it is due (ms, Redis clock).
        consumer: ``active``: the worker consumer holding it.
        since_ms: ``active``: when that worker started it (ms, Redis clock); None until the
            worker's first lock renewal recorded it.
        progress: ``active``: the last fraction reported (0..1), or None.
        progress_detail: ``active``: the detail reported with it (any JSON value).
        cancel_requested: ``active``: a cancellation was asked for and not yet honoured.
        last_error: ``retrying``: the last attempt's error (``Type: message``); ``dead``:
            the error that killed it.
        reason: ``dead``: why (``error``, ``permanent``, ``timeout``, ``invalid_payload``,
            ``stalled``...); ``cancelled``: ``cancelled``.
        finished_ms: final states: when the job left the queue (ms, Redis clock).
        result_json: ``completed``: the stored result (JSON text), or None.
        keep_ms: live states: how long its final record will be kept (0: none).
    """

    job_id: str
    state: JobState
    queue: str | None = None
    shard: str | None = None
    job: str | None = None
    attempt: int | None = None
    due_ms: int | None = None
    consumer: str | None = None
    since_ms: int | None = None
    progress: float | None = None
    progress_detail: Any = None
    cancel_requested: bool = False
    last_error: str | None = None
    reason: str | None = None
    finished_ms: int | None = None
    result_json: str | None = None
    keep_ms: int | None = None

    @property
    def is_final(self) -> bool:
        """True for ``completed``, ``cancelled`` and ``dead``."""
        return self.state in ("completed", "cancelled", "dead")

    def to_dict(self) -> dict[str, Any]:
        """Every attribute, JSON-ready (the result as its decoded JSON, under ``result``)."""
        d = asdict(self)
        raw = d.pop("result_json")
        d["result"] = json.loads(raw) if raw else None
        return d


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What :meth:`Queue.cancel <streamq.Queue.cancel>` did.

    Attributes:
        job_id: the job id.
        outcome: ``removed`` (it was waiting or delayed: it will never run), ``requested``
            (it is running: its worker is told at its next lock renewal), ``finished`` (it
            had already finished: nothing done) or ``unknown`` (not tracked, or forgotten).
        detail: ``removed``: ``waiting`` or ``delayed``; ``requested``: the consumer running
            it; ``finished``: its final state.
        queue: the lane it was found on, when found.
    """

    job_id: str
    outcome: Literal["removed", "requested", "finished", "unknown"]
    detail: str = ""
    queue: str | None = None


def _s(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _flat_dict(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _last_error(baggage: str) -> str | None:
    if not baggage:
        return None
    try:
        errors = json.loads(baggage).get("errors") or []
    except (ValueError, AttributeError):
        return None
    if not errors:
        return None
    last = errors[-1]
    return f"{last.get('type', 'Error')}: {last.get('message', '')}"


def _int(v: Any) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def decode_status(job_id: str, queue: str, shard: str, reply: Sequence[Any]) -> JobStatus:
    """A :func:`streamq.ops.job_status` reply as a :class:`JobStatus`."""
    kind = _s(reply[0])
    if kind == "unknown":
        return JobStatus(job_id, "unknown")
    if kind == "final":
        rec = json.loads(_s(reply[1]))
        state = rec.get("state", "unknown")
        return JobStatus(
            job_id, state, queue, shard, rec.get("n"), _int(rec.get("a")),
            last_error=rec.get("error"), reason=rec.get("reason"),
            finished_ms=_int(rec.get("at")), result_json=rec.get("r"),
        )
    rec = json.loads(_s(reply[1]))
    if kind == "delayed":
        fields = _flat_dict(json.loads(_s(reply[6])))
        err = _last_error(fields.get("baggage", ""))
        return JobStatus(
            job_id, "retrying" if err else "delayed", queue, shard, fields.get("name"),
            _int(fields.get("attempt")), due_ms=_int(reply[4]), last_error=err,
            keep_ms=_int(rec.get("k")) or 0,
        )
    fields = _flat_dict(reply[6])
    base = JobStatus(job_id, "waiting", queue, shard, fields.get("name"),
                     _int(fields.get("attempt")), last_error=_last_error(fields.get("baggage", "")),
                     keep_ms=_int(rec.get("k")) or 0)
    if kind == "waiting":
        return base
    detail = rec.get("d")
    consumer = _s(reply[3])
    return JobStatus(
        job_id, "active", queue, shard, base.job, base.attempt, consumer=consumer,
        since_ms=_int(rec.get("s")) if rec.get("c") == consumer else None,
        progress=rec.get("p"), progress_detail=json.loads(detail) if detail else None,
        cancel_requested=bool(rec.get("x")), last_error=base.last_error, keep_ms=base.keep_ms,
    )


def _rank(st: JobStatus) -> tuple[int, int]:
    if st.state in _LIVE:
        return (2, 0)
    if st.state == "unknown":
        return (0, 0)
    return (1, st.finished_ms or 0)


class Lookup:
    """Where a job id may be, and the calls that read or cancel it there (shared by
    :class:`~streamq.Queue`, :class:`~streamq.SyncQueue` and the admin classes).

    Without a sharding key every shard of every lane of the contract is asked (one pipelined
    round trip on one server); with one, only the shard that key maps to in each lane.
    """

    def __init__(self, contract: type[QueueContract], prefix: str, group: str,
                 lanes: Sequence[Lane] | None = None) -> None:
        self.contract = contract
        self.group = group
        self.lanes = [(lane.name, QueueKeys(prefix, lane.name, lane.shards))
                      for lane in (lanes or contract.lanes())]

    def targets(self, sharding_key: str | None) -> list[tuple[str, ShardKeys]]:
        if sharding_key is None:
            return [(name, sk) for name, qk in self.lanes for sk in qk.shards]
        return [(name, qk.for_key(sharding_key)) for name, qk in self.lanes]

    def status_calls(self, job_id: str, targets: list[tuple[str, ShardKeys]]) -> list[Call]:
        _check_id(job_id)
        return [ops.job_status(sk, self.group, job_id) for _, sk in targets]

    def pick(self, job_id: str, targets: list[tuple[str, ShardKeys]],
             replies: Sequence[Any]) -> tuple[JobStatus, ShardKeys | None]:
        """The most telling status found (a live one over a final one, the latest final),
        and the shard it is on."""
        best, where = JobStatus(job_id, "unknown"), None
        for (lane, sk), reply in zip(targets, replies, strict=True):
            st = decode_status(job_id, lane, sk.name, reply)
            if _rank(st) > _rank(best):
                best, where = st, sk
        return best, where

    def cancel_calls(self, job_id: str, targets: list[tuple[str, ShardKeys]]) -> list[Call]:
        _check_id(job_id)
        return [ops.cancel(sk, self.group, job_id) for _, sk in targets]

    def cancel_result(self, job_id: str, targets: list[tuple[str, ShardKeys]],
                      replies: Sequence[tuple[str, str]]) -> CancelResult:
        order = {"removed": 3, "requested": 3, "finished": 2, "unknown": 1}
        best = CancelResult(job_id, "unknown")
        for (lane, _), (outcome, detail) in zip(targets, replies, strict=True):
            if order.get(outcome, 0) > order[best.outcome]:
                best = CancelResult(job_id, outcome, detail, lane)  # type: ignore[arg-type]
        return best

    def spec(self, name: str | None) -> JobSpec[Any] | None:
        return self.contract.jobs.get(name) if name else None

    def outcome(self, st: JobStatus) -> Any:
        """The result of a final status: the result model instance (or the decoded JSON
        when the job has no model, None when nothing was returned); raises
        :class:`JobFailed` or :class:`JobCancelled`."""
        queue = st.queue or self.contract.queue_name
        if st.state == "cancelled":
            raise JobCancelled(f"queue {queue!r} job {st.job!r} id {st.job_id!r} was cancelled",
                               queue=queue, job=st.job, job_id=st.job_id, shard=st.shard)
        if st.state == "dead":
            raise JobFailed(
                f"queue {queue!r} job {st.job!r} id {st.job_id!r} was dead-lettered "
                f"({st.reason}): {st.last_error or ''}".rstrip(": "),
                reason=st.reason, error=st.last_error, queue=queue, job=st.job,
                job_id=st.job_id, shard=st.shard,
            )
        if st.state != "completed":
            raise JobNotFound(f"queue {queue!r}: job id {st.job_id!r} has no final record",
                              queue=queue, job_id=st.job_id)
        if st.result_json is None:
            return None
        spec = self.spec(st.job)
        if spec is not None and spec.result_model is not None:
            return spec.result_model.model_validate_json(st.result_json)
        return json.loads(st.result_json)

    def wait_key(self, st: JobStatus, sk: ShardKeys | None) -> str:
        """The key to block on for ``st``'s final record; raises when there is none to wait
        for (unknown job, or one that keeps no final record)."""
        if sk is None or st.state == "unknown":
            raise self.not_found(st.job_id)
        if not st.is_final and not st.keep_ms:
            queue = st.queue or self.contract.queue_name
            raise ConfigurationError(
                f"queue {queue!r} job {st.job!r} id {st.job_id!r} keeps no result: add it "
                "with keep_result= (or declare keep_result/result on the job)",
                queue=queue, job=st.job, job_id=st.job_id,
            )
        return sk.result(st.job_id)

    def waited(self, job_id: str, st: JobStatus, sk: ShardKeys | None, raw: Any,
               timeout_s: float) -> Any:
        """The outcome of a wait that returned ``raw`` (None: timed out)."""
        assert sk is not None
        if raw is None:
            if st.is_final:
                # The record expired between the look-up and the wait.
                raise self.not_found(job_id)
            raise ResultTimeout(
                f"queue {sk.queue!r} job {st.job!r} id {job_id!r} did not finish within "
                f"{timeout_s:g} s (it was {st.state})",
                queue=sk.queue, job=st.job, job_id=job_id, shard=sk.name,
            )
        return self.outcome(decode_status(job_id, sk.queue, sk.name, ["final", raw]))

    def not_found(self, job_id: str) -> JobNotFound:
        queue = self.contract.queue_name
        return JobNotFound(
            f"queue {queue!r}: job id {job_id!r} is not tracked (added without tracking, "
            "or its final record expired)", queue=queue, job_id=job_id,
        )


def _check_id(job_id: str) -> None:
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise ConfigurationError(f"job_id must be 1..200 characters, got {job_id!r}")


def encode_result(spec: JobSpec[Any], value: Any, *, queue: str, job_id: str) -> str | None:
    """A processor's return value as the JSON to store: validated against the job's result
    model when it has one (raises :class:`InvalidResult` naming the fields), else any
    JSON-encodable value (None stores nothing)."""
    model = spec.result_model
    if model is not None:
        try:
            if isinstance(value, model):
                obj = value
            elif isinstance(value, BaseModel):
                obj = model.model_validate(value.model_dump(by_alias=True))
            else:
                obj = model.model_validate(value)
            return obj.model_dump_json(by_alias=True)
        except ValidationError as exc:
            fields = validation_fields(exc)
            raise InvalidResult(
                f"queue {queue!r} job {spec.name!r} id {job_id!r}: result failed validation "
                f"against {model.__name__} on field(s) {', '.join(fields)}: "
                f"{exc.errors()[0]['msg']}",
                fields=fields, queue=queue, job=spec.name, job_id=job_id,
            ) from exc
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return value.model_dump_json(by_alias=True)
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidResult(
            f"queue {queue!r} job {spec.name!r} id {job_id!r}: result of type "
            f"{type(value).__name__} is not JSON (declare a result model)",
            queue=queue, job=spec.name, job_id=job_id,
        ) from exc
