"""Running an app's processors in tests: until idle on a Redis (:func:`run_app_until_idle`),
or on one hand-made job with no Redis at all (:func:`make_job`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from streamq.app import App
from streamq.contracts import JobSpec
from streamq.envelope import validation_fields
from streamq.errors import InvalidPayload
from streamq.hooks import Hooks, JobInfo
from streamq.job import Job
from streamq.keys import shard_name

__all__ = ["JobOutcome", "RunReport", "make_job", "run_app_until_idle"]

P = TypeVar("P", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one attempt ended, as Redis confirmed it.

    Attributes:
        queue: the lane name.
        job_name: the job name.
        job_id: the job id.
        attempt: the attempt number (1-based).
        outcome: ``completed``, ``retried``, ``failed`` (dead-lettered), ``delayed``
            (``Retry``/``RateLimited``), ``lock_lost``, ``released`` or ``unsettled``.
        error: the exception the processor raised, or None.
    """

    queue: str
    job_name: str
    job_id: str
    attempt: int
    outcome: str
    error: BaseException | None = None


@dataclass
class RunReport:
    """What a run did: every attempt's confirmed outcome and every dead letter's reason.

    ``dead_lettered`` counts poison jobs (invalid payload, unknown job name) too, which never
    ran and so have no outcome.
    """

    outcomes: list[JobOutcome] = field(default_factory=list)
    dead_reasons: Counter[str] = field(default_factory=Counter)

    def count(self, outcome: str) -> int:
        """How many attempts ended with ``outcome``."""
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    @property
    def processed(self) -> int:
        """Attempts that ran, whatever their outcome."""
        return len(self.outcomes)

    @property
    def completed(self) -> int:
        return self.count("completed")

    @property
    def retried(self) -> int:
        return self.count("retried")

    @property
    def delayed(self) -> int:
        return self.count("delayed")

    @property
    def dead_lettered(self) -> int:
        return sum(self.dead_reasons.values())

    def of(self, job_id: str) -> list[JobOutcome]:
        """The attempts of one job, in the order they ended."""
        return [o for o in self.outcomes if o.job_id == job_id]


class _Recorder(Hooks):
    def __init__(self, report: RunReport, chained: Hooks | None) -> None:
        self.report = report
        self.chained = chained

    def job_finished(self, job: JobInfo, outcome: str, duration_s: float,
                     error: BaseException | None = None) -> None:
        self.report.outcomes.append(
            JobOutcome(job.queue, job.job_name, job.job_id, job.attempt, outcome, error)
        )
        if self.chained is not None:
            self.chained.job_finished(job, outcome, duration_s, error)

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: str) -> None:
        self.report.dead_reasons[reason] += 1
        if self.chained is not None:
            self.chained.job_dead_lettered(queue, shard, job_name, reason)


async def run_app_until_idle(
    app: App[Any],
    *,
    redis_url: str,
    prefix: str,
    queues: Iterable[str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    timeout_s: float = 10.0,
    hooks: Hooks | None = None,
) -> RunReport:
    """Start a worker for ``app`` (its primary lanes, or ``queues``), run until every queue
    is idle (nothing ready, delayed or running) and stop it; what happened.

    Jobs added before the call are processed, and so are jobs the processors add and
    retries (delayed jobs are waited for: keep backoffs short in tests).

    Raises:
        TimeoutError: not idle within ``timeout_s``; the message says what is left.
    """
    from streamq.runtime.manager import WorkerManager

    report = RunReport()
    manager = WorkerManager(redis_url=redis_url, prefix=prefix,
                            hooks=_Recorder(report, hooks))
    manager.register_app(app, queues=queues, overrides=overrides)
    await manager.start()
    try:
        await manager.run_until_idle(timeout_s=timeout_s)
    finally:
        await manager.close_workers()
    return report


def make_job(
    spec: JobSpec[P],
    payload: P | Mapping[str, Any],
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    job_id: str = "test-job",
    shard: int = 0,
    timestamp_ms: int | None = None,
    retry_baggage: dict[str, Any] | None = None,
    tenant: str | None = None,
    extend_lock: Callable[[], None] | None = None,
) -> Job[P]:
    """A ``Job`` as a worker would hand it to a processor, with no Redis at all.

    The payload goes through the same JSON round trip as a real job (so a processor sees
    defaults filled in and a payload a worker could have received), validated against the
    job's model.

    Args:
        spec: the job, as the contract declares it (``Ingestion.ingest_event``).
        payload: an instance of the job's model, or its fields as a mapping.
        attempt: the attempt number (1-based): test retries and the final attempt.
        max_attempts: attempts before dead-lettering (default: the queue's ``attempts``).
        job_id: the job id.
        shard: the shard index (its name is derived as the worker derives it).
        timestamp_ms: first enqueue time (default: now).
        retry_baggage: errors of earlier attempts, as the worker stores them.
        tenant: the tenant the worker would read from the contract's tenant field.
        extend_lock: called by ``job.extend_lock()`` (default: nothing happens).

    Raises:
        InvalidPayload: the payload does not fit the job's model (names queue, job, fields).
        ValueError: the spec belongs to no contract, or attempt/max_attempts is below 1.
    """
    contract = spec.queue
    if contract is None:
        raise ValueError(f"{spec!r} is not declared in a QueueContract")
    queue = contract.queue_name
    max_attempts = contract.defaults.attempts if max_attempts is None else max_attempts
    if attempt < 1 or max_attempts < 1:
        raise ValueError(f"attempt and max_attempts must be >= 1, got {attempt}, {max_attempts}")
    try:
        if isinstance(payload, BaseModel):
            if not isinstance(payload, spec.model):
                raise InvalidPayload(
                    f"queue {queue!r} job {spec.name!r}: expected a {spec.model.__name__} "
                    f"payload, got {type(payload).__name__}", queue=queue, job=spec.name,
                )
            encoded = payload.model_dump_json(by_alias=True)
        else:
            encoded = json.dumps(dict(payload))
        validated = spec.model.model_validate_json(encoded)
    except ValidationError as exc:
        fields = validation_fields(exc)
        raise InvalidPayload(
            f"queue {queue!r} job {spec.name!r}: invalid payload, field(s) "
            f"{', '.join(fields)}: {exc.errors()[0]['msg']}",
            queue=queue, job=spec.name, job_id=job_id, fields=fields,
        ) from exc
    except TypeError as exc:  # a mapping json cannot encode
        raise InvalidPayload(f"queue {queue!r} job {spec.name!r}: payload is not JSON: {exc}",
                             queue=queue, job=spec.name, job_id=job_id) from exc
    if tenant is None and contract.tenant_field:
        tenant = str(getattr(validated, contract.tenant_field, "") or "") or None
    return Job(
        id=job_id, name=spec.name, queue=queue, shard=shard_name(queue, shard),
        payload=validated, attempt=attempt, max_attempts=max_attempts,
        timestamp=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        retry_baggage=retry_baggage, tenant=tenant, extend_lock=extend_lock,
    )
