"""``Job[P]``: what a processor receives."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

__all__ = ["Job"]

from streamq.errors import ConfigurationError

if TYPE_CHECKING:
    from streamq.durations import Duration
    from streamq.tenants import TenantControl, TenantFlag

P = TypeVar("P", bound=BaseModel)

_log = logging.getLogger("streamq.job")


class Job(Generic[P]):
    """One job run: the validated payload and its metadata.

    A processor returns (the job completes) or raises (see the failure semantics); it never
    acknowledges. ``job.id`` is stable across attempts and redeliveries: use it to be
    idempotent.

    Attributes:
        id: the stable job id.
        name: the job name.
        queue: the queue (lane) name.
        shard: the shard name.
        payload: the validated payload.
        attempt: 1-based attempt number.
        max_attempts: attempts before the job is dead-lettered.
        timestamp: first enqueue time, ms since the epoch.
        retry_baggage: errors of earlier attempts, or None.
        tenant: the value of the contract's ``tenant_field`` in the payload, or None.
        logger: a logger carrying queue, job id, name and attempt as context.
    """

    __slots__ = (
        "_ctl",
        "_extend",
        "_failure",
        "_logger",
        "_lost",
        "_result",
        "_result_json",
        "_tenants",
        "attempt",
        "id",
        "max_attempts",
        "name",
        "payload",
        "queue",
        "retry_baggage",
        "shard",
        "tenant",
        "timestamp",
        "trace_context",
    )

    def __init__(
        self,
        *,
        id: str,
        name: str,
        queue: str,
        shard: str,
        payload: P,
        attempt: int,
        max_attempts: int,
        timestamp: int,
        retry_baggage: dict[str, Any] | None = None,
        trace_context: dict[str, str] | None = None,
        tenant: str | None = None,
        extend_lock: Callable[[], None] | None = None,
        tenant_control: TenantControl | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.queue = queue
        self.shard = shard
        self.payload = payload
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.timestamp = timestamp
        self.retry_baggage = retry_baggage
        self.trace_context = trace_context
        self.tenant = tenant
        self._extend = extend_lock
        self._tenants = tenant_control
        # Set by the worker's loop, read from any thread: a plain bool is enough, and a
        # threading.Event (a lock and a condition) per job cost more than the rest of Job.
        self._lost = False
        self._failure: BaseException | None = None
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None
        # Set by the worker for tracked jobs (streamq.runtime.tracking); None otherwise.
        self._ctl: Any = None
        self._result: Any = None
        self._result_json: str | None = None

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger carrying queue, job id, name, attempt (and tenant) as context."""
        if self._logger is None:
            context: dict[str, Any] = {
                "queue": self.queue, "job_id": self.id, "job": self.name, "attempt": self.attempt
            }
            if self.tenant:
                context["tenant"] = self.tenant
            self._logger = logging.LoggerAdapter(_log, context)
        return self._logger

    @property
    def is_final_attempt(self) -> bool:
        """True when a failure of this attempt dead-letters the job."""
        return self.attempt >= self.max_attempts

    @property
    def lock_lost(self) -> bool:
        """True once another worker reclaimed this job; its result will not be acknowledged."""
        return self._lost

    def fail(self, error: BaseException) -> None:
        """Mark this job failed with ``error``, as if its processor had raised it.

        For batch processors, which settle each job on its own: the jobs marked here take
        the path of their error (``Retry`` re-delays without spending an attempt,
        ``PermanentError`` dead-letters, anything else is a failed attempt retried with
        backoff until attempts run out); the others complete. A processor that raises fails
        every job of its batch.

        Example::

            async def ingest(jobs: list[Job[Event]]) -> None:
                for job, ok in zip(jobs, await store.write_many([j.payload for j in jobs])):
                    if not ok:
                        job.fail(RuntimeError("row rejected"))
        """
        if not isinstance(error, BaseException):
            raise TypeError(f"Job.fail takes an exception, got {error!r}")
        self._failure = error

    @property
    def failure(self) -> BaseException | None:
        """The error given to :meth:`fail`, or None."""
        return self._failure

    @property
    def is_tracked(self) -> bool:
        """True when this job is tracked: status, cancel and progress work for it."""
        return self._ctl is not None

    @property
    def cancel_requested(self) -> bool:
        """True once a cancellation of this (tracked) job was requested while it runs.

        The worker learns of requests with its lock renewals. An async processor is also
        cancelled (``asyncio.CancelledError`` where it awaits; clean up and let it
        propagate); a sync processor should check this now and then and return or raise.
        A job that completes anyway is reported completed; one that raises is cancelled.
        """
        return self._ctl is not None and bool(self._ctl.cancel_requested)

    async def report_progress(self, fraction: float, detail: Any = None) -> bool:
        """Record how far this job got (``fraction`` 0..1, and any JSON ``detail``), visible
        in ``Queue.status``. One small Redis call; returns False when nothing was recorded
        (the job is not tracked, or this worker no longer owns it).

        Raises:
            ConfigurationError: ``fraction`` is not within 0..1, or ``detail`` is not JSON.

        Example::

            for i, row in enumerate(rows):
                await store(row)
                await job.report_progress((i + 1) / len(rows), {"rows": i + 1})
        """
        if self._ctl is None:
            return False
        return bool(await self._ctl.progress(self, fraction, detail))

    def report_progress_sync(self, fraction: float, detail: Any = None,
                             *, timeout_s: float = 10.0) -> bool:
        """:meth:`report_progress` for sync processors (call it from the processor's
        thread, never from the event loop)."""
        if self._ctl is None:
            return False
        return bool(self._ctl.progress_sync(self, fraction, detail, timeout_s))

    def extend_lock(self) -> None:
        """Renew this worker's locks now (thread-safe; renewal also runs on its own)."""
        if self._extend is not None:
            self._extend()

    async def flag_tenant(self, duration: Duration, *, reason: str = "") -> TenantFlag:
        """Flag this job's tenant for ``duration`` (timedelta or seconds): producers of the
        queue route its new jobs to the secondary lane until the flag expires (within their
        staleness bound, 1 s by default). See :mod:`streamq.tenants`.

        Flagging does not move this job: raise ``RateLimited`` to re-delay it as well.

        Example::

            except UpstreamThrottled:
                await job.flag_tenant(timedelta(minutes=5), reason="upstream 429")
                raise RateLimited(delay=timedelta(seconds=30))

        Raises:
            ConfigurationError: the queue has no secondary lane or no ``tenant_field``, or
                this job's payload names no tenant.
        """
        control, tenant = self._tenant_target()
        return await control.flag(tenant, duration, reason=reason)

    def flag_tenant_sync(self, duration: Duration, *, reason: str = "") -> TenantFlag:
        """:meth:`flag_tenant` for sync processors (they run in a thread of the worker)."""
        control, tenant = self._tenant_target()
        return control.flag_from_thread(tenant, duration, reason=reason)

    def _tenant_target(self) -> tuple[TenantControl, str]:
        if self._tenants is None:
            raise ConfigurationError(
                f"queue {self.queue!r} job {self.name!r} (id {self.id}): cannot flag a tenant: "
                "the contract needs a tenant_field and a secondary lane (secondary_shards=)",
                queue=self.queue, job=self.name, job_id=self.id,
            )
        if not self.tenant:
            raise ConfigurationError(
                f"queue {self.queue!r} job {self.name!r} (id {self.id}): cannot flag a tenant: "
                "the payload's tenant field is empty",
                queue=self.queue, job=self.name, job_id=self.id,
            )
        return self._tenants, self.tenant

    def __repr__(self) -> str:
        return f"Job({self.queue}/{self.name} id={self.id} attempt={self.attempt})"
