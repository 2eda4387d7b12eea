"""The instrumentation interface: hook points with no-op defaults.

The producer and the worker runtime call these hooks; Prometheus metrics
(:mod:`streamq.metrics`) and OpenTelemetry tracing (:mod:`streamq.tracing`) are adapters
that implement them. The core runtime never imports either library.

Labels passed to hooks are bounded: lane (queue) name, shard name, job name, reason. Job ids
and tenants are in :class:`JobInfo` for tracing and logs, never for metric labels.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompositeHooks", "DeadReason", "Hooks", "JobInfo", "Outcome"]

DeadReason = str
"""Why a job was dead-lettered: ``error``, ``permanent``, ``invalid_payload``,
``unknown_job``, ``stalled``, ``timeout`` or ``lost_payload``."""

Outcome = str
"""How an attempt ended, as Redis confirmed it: ``completed``, ``retried``, ``failed``
(dead-lettered), ``delayed`` (Retry/RateLimited), ``cancelled`` (a tracked job whose
cancellation was requested while it ran: acked and removed), ``lock_lost`` (another worker owns or
settled the job: nothing was applied), ``released`` (shutdown), or ``unsettled`` (the
worker stopped before Redis answered: the job stays pending and runs again elsewhere)."""


@dataclass(slots=True)
class JobInfo:
    """What hooks know about one job run."""

    queue: str
    shard: str
    job_id: str
    job_name: str
    attempt: int
    max_attempts: int
    entry_id: str
    wait_ms: float = 0.0
    tenant: str | None = None
    trace_context: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    secret_values: frozenset[str] = frozenset()
    """Values of the payload's secret fields (the contract's ``secret_fields``), so adapters
    can scrub them from error text. Never emit them."""


class Hooks:
    """Instrumentation hook points; every method is a no-op here. Subclass what you need."""

    # -- producer --------------------------------------------------------------------------
    def producer_started(self, queue: str, shards: Sequence[str], job_names: Sequence[str]) -> None:
        """A producer was made that writes these shards of ``queue`` (a lane) and job names."""

    def enqueue_context(
        self, queue: str, job_name: str, job_id: str, tenant: str | None
    ) -> AbstractContextManager[dict[str, str] | None]:
        """Wraps one add; yields a trace-context carrier to store in the envelope, or None."""
        return nullcontext(None)

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        """A job was written to Redis (not called for a dedup duplicate)."""

    def enqueue_duplicate(self, queue: str, shard: str, job_name: str) -> None:
        """An add was skipped because its job id's dedup marker exists."""

    def enqueue_rejected(self, queue: str, job_name: str, reason: str) -> None:
        """An add failed: ``too_large``, ``invalid``, ``unknown_job`` or ``redis_error``."""

    def tenant_routed(self, queue: str, job_name: str) -> None:
        """An add of ``queue`` went to its secondary lane because its tenant is flagged."""

    # -- worker: per job -------------------------------------------------------------------
    def process_context(self, job: JobInfo) -> AbstractContextManager[None]:
        """Wraps one attempt (the processor call); tracing opens its CONSUMER span here."""
        return nullcontext()

    def batch_context(self, jobs: Sequence[JobInfo]) -> AbstractContextManager[None]:
        """Wraps one run of a batch processor over ``jobs``; tracing opens one CONSUMER span
        linked to each job's producer span. ``job_finished`` of each job runs inside it."""
        return nullcontext()

    def job_started(self, job: JobInfo) -> None:
        """An attempt is about to run; ``job.wait_ms`` is the time since it became due."""

    def job_finished(
        self,
        job: JobInfo,
        outcome: Outcome,
        duration_s: float,
        error: BaseException | None = None,
    ) -> None:
        """An attempt ended with ``outcome`` after ``duration_s`` of processing."""

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: DeadReason) -> None:
        """A job went to the dead-letter stream for ``reason``."""

    def tenant_cap_waited(self, queue: str, shard: str, job_name: str) -> None:
        """A job did not start: its tenant already runs its ``tenant_concurrency`` jobs. It
        was re-delayed shortly, no attempt spent."""

    # -- worker: maintenance ---------------------------------------------------------------
    def jobs_reclaimed(self, queue: str, shard: str, count: int) -> None:
        """``count`` stalled entries were taken over from a dead or stuck worker."""

    def jobs_stalled(self, queue: str, shard: str, count: int) -> None:
        """``count`` entries were found stalled (reclaimed or dead-lettered as stalled)."""

    def lock_lost(self, queue: str, shard: str, count: int) -> None:
        """``count`` jobs of this worker were reclaimed by another one; not acknowledged."""

    def payload_lost(self, queue: str, shard: str, count: int) -> None:
        """``count`` pending entries had no body (deleted under the group); dead-lettered."""

    def promoted(self, queue: str, shard: str, count: int) -> None:
        """``count`` delayed or retrying jobs became due and moved to the stream."""

    def active_changed(self, queue: str, active: int) -> None:
        """The number of jobs running for ``queue`` in this process changed."""

    def redis_error(self, queue: str | None, error: BaseException) -> None:
        """A Redis call of the runtime failed (it will back off and retry)."""

    def task_crashed(self, queue: str | None, task: str) -> None:
        """A long-lived worker task (``reader``, ``dispatcher``, ``settler``...) raised an
        unexpected error; it was logged and is being restarted."""

    def consumer_started(
        self, queue: str, shards: Sequence[str], job_names: Sequence[str]
    ) -> None:
        """This process started consuming ``queue``; adapters may pre-create its series."""

    # -- runners (streamq.runners) ---------------------------------------------------------
    def runner_crashed(self, runner: str) -> None:
        """A runner raised an unexpected error; it was logged and is restarted after a
        capped backoff."""

    def runner_leadership_changed(self, runner: str, leader: bool) -> None:
        """This process took (``leader=True``) or lost the lease of singleton ``runner``.
        Called from the lease's renewal thread."""

    # -- observability poller (streamq.observe) --------------------------------------------
    def queue_depth(
        self,
        queue: str,
        shard: str,
        *,
        ready: int,
        delayed: int,
        in_flight: int,
        dead: int,
        oldest_ready_age_s: float,
        consumers: int,
    ) -> None:
        """A depth reading of one shard (``shard="all"``: the queue's aggregate)."""

    def event_loop_lag(self, lag_s: float) -> None:
        """How late a timer of this process's event loop fired."""


class CompositeHooks(Hooks):
    """Fans every hook out to several adapters, in order."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = list(hooks)

    def enqueue_context(
        self, queue: str, job_name: str, job_id: str, tenant: str | None
    ) -> AbstractContextManager[dict[str, str] | None]:
        return self._enter_all(
            [h.enqueue_context(queue, job_name, job_id, tenant) for h in self.hooks]
        )

    @staticmethod
    @contextmanager
    def _enter_all(
        cms: list[AbstractContextManager[dict[str, str] | None]],
    ) -> Iterator[dict[str, str] | None]:
        carrier: dict[str, str] | None = None
        with ExitStack() as stack:
            for cm in cms:
                got = stack.enter_context(cm)
                if got:
                    carrier = {**(carrier or {}), **got}
            yield carrier

    def process_context(self, job: JobInfo) -> AbstractContextManager[None]:
        # Runs for every job: skip the base no-op, and nest nothing when one adapter is left.
        active = [h for h in self.hooks if type(h).process_context is not Hooks.process_context]
        if not active:
            return nullcontext()
        if len(active) == 1:
            return active[0].process_context(job)
        return self._enter_each(active, job)

    @staticmethod
    @contextmanager
    def _enter_each(hooks: list[Hooks], job: JobInfo) -> Iterator[None]:
        with ExitStack() as stack:
            for h in hooks:
                stack.enter_context(h.process_context(job))
            yield

    @contextmanager
    def batch_context(self, jobs: Sequence[JobInfo]) -> Iterator[None]:
        with ExitStack() as stack:
            for h in self.hooks:
                stack.enter_context(h.batch_context(jobs))
            yield


_NOTIFY = frozenset(
    n
    for n in vars(Hooks)
    if not n.startswith("_") and n not in ("enqueue_context", "process_context", "batch_context")
)


def _fan_out(name: str) -> Any:
    # Plain notification hooks fan out generically (defined once per name on the class, so a
    # call costs one loop, not a closure per attribute lookup); the two context hooks above
    # are defined explicitly because they compose differently.
    def fan_out(self: CompositeHooks, *args: Any, **kwargs: Any) -> None:
        for h in self.hooks:
            getattr(h, name)(*args, **kwargs)

    fan_out.__name__ = name
    fan_out.__doc__ = getattr(Hooks, name).__doc__
    return fan_out


for _name in _NOTIFY:
    setattr(CompositeHooks, _name, _fan_out(_name))
