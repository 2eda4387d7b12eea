"""Per-queue worker options, with BullMQ-like defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any, TypedDict

from streamq.backoff import Backoff, BackoffLike
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError

__all__ = ["Batch", "Limiter", "ProcessorOptions", "WorkerOptions"]



@dataclass(frozen=True, slots=True)
class Limiter:
    """A global rate limit: at most ``max_jobs`` started per ``duration``, across all workers
    of the queue (enforced in Redis)."""

    max_jobs: int
    duration: Duration = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_jobs, int) or self.max_jobs < 1:
            raise ConfigurationError(f"limiter max_jobs must be >= 1, got {self.max_jobs!r}")
        to_ms(self.duration, "limiter duration", minimum=1)

    @property
    def duration_ms(self) -> int:
        return to_ms(self.duration, "limiter duration", minimum=1)


@dataclass(frozen=True, slots=True)
class Batch:
    """Run a processor on lists of jobs: up to ``max_size`` gathered for at most ``max_wait``.

    The batch starts as soon as ``max_size`` jobs are there, or ``max_wait`` after its first
    job arrived, whichever comes first. Each job keeps its own attempts, backoff, dead
    letter, lock and trace link; ``concurrency`` counts batches running at once.

    Example::

        @app.processor(Ingestion, batch=Batch(max_size=200, max_wait=0.05))
        async def ingest(jobs: list[Job[Event]]) -> None:
            await store.write_many([j.payload for j in jobs])
    """

    max_size: int
    max_wait: Duration = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or (
            self.max_size < 1
        ):
            raise ConfigurationError(f"batch max_size must be >= 1, got {self.max_size!r}")
        to_ms(self.max_wait, "batch max_wait")

    @property
    def max_wait_s(self) -> float:
        return to_ms(self.max_wait, "batch max_wait") / 1000


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How one queue is consumed. Durations are timedeltas or seconds.

    Attributes:
        concurrency: jobs run at once by this process for the queue.
        prefetch: entries this process may hold beyond its running jobs, fetched ahead so a
            freed slot starts the next job without a round trip. Running + buffered never
            exceeds ``concurrency + prefetch``. A prefetched entry of a killed worker counts
            as one run toward its stall budget, so keep it small.
        limiter: global rate limit across all workers (None: unlimited).
        lock_duration: how long a job stays locked without renewal before another worker
            may reclaim it.
        lock_renew_interval: how often held locks are renewed (default: half the lock).
        stalled_interval: how often to look for stalled jobs of dead workers.
        max_stalled_count: redeliveries of a stalled job before it is dead-lettered
            (0: never redeliver).
        attempts: runs before a failing job is dead-lettered (None: the contract's default).
        backoff: delay policy between attempts (None: the contract's default).
        timeout: a job running longer fails as a timeout (None: no limit).
        shutdown_timeout: on shutdown, how long running jobs may finish before release.
        block_timeout: longest blocking read, so a dead connection is noticed.
        dead_letter_cap: approximate cap of each shard's dead-letter stream (0: uncapped).
        promote_interval: longest wait between checks for due delayed jobs.
        settle_delay: how long a finished job's acknowledgement waits for others to share
            its Redis call, unless ``concurrency`` are already waiting (0: send at once). The
            job's slot is free meanwhile; only the confirmation waits.
        tenant_concurrency: at most this many jobs of one tenant (the contract's
            ``tenant_field``) run at once, across every worker and both lanes of the queue
            (None: no cap). A job over the cap waits without spending an attempt.
        tenant_wait: how long a job over its tenant's cap is re-delayed before it tries
            again (jittered by up to a quarter either way).
    """

    concurrency: int = 1
    prefetch: int = 0
    limiter: Limiter | None = None
    lock_duration: Duration = timedelta(seconds=30)
    lock_renew_interval: Duration | None = None
    stalled_interval: Duration = timedelta(seconds=30)
    max_stalled_count: int = 1
    attempts: int | None = None
    backoff: BackoffLike | None = None
    timeout: Duration | None = None
    shutdown_timeout: Duration = timedelta(seconds=30)
    block_timeout: Duration = timedelta(seconds=2)
    dead_letter_cap: int = 100_000
    promote_interval: Duration = timedelta(milliseconds=200)
    settle_delay: Duration = timedelta(milliseconds=2)
    tenant_concurrency: int | None = None
    tenant_wait: Duration = timedelta(milliseconds=250)

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency!r}")
        if not isinstance(self.prefetch, int) or isinstance(self.prefetch, bool) or (
            self.prefetch < 0
        ):
            raise ConfigurationError(f"prefetch must be >= 0, got {self.prefetch!r}")
        if not isinstance(self.max_stalled_count, int) or self.max_stalled_count < 0:
            raise ConfigurationError(
                f"max_stalled_count must be >= 0, got {self.max_stalled_count!r}"
            )
        if self.attempts is not None and (not isinstance(self.attempts, int) or self.attempts < 1):
            raise ConfigurationError(f"attempts must be >= 1, got {self.attempts!r}")
        if self.dead_letter_cap < 0:
            raise ConfigurationError("dead_letter_cap must be >= 0")
        if self.backoff is not None and not (
            isinstance(self.backoff, Backoff) or callable(self.backoff)
        ):
            raise ConfigurationError(
                f"backoff must be a Backoff or a callable, got {self.backoff!r}"
            )
        lock = to_ms(self.lock_duration, "lock_duration", minimum=100)
        renew = self.lock_renew_interval_ms
        if renew >= lock:
            raise ConfigurationError(
                f"lock_renew_interval ({renew} ms) must be shorter than lock_duration ({lock} ms)"
            )
        to_ms(self.stalled_interval, "stalled_interval", minimum=10)
        to_ms(self.shutdown_timeout, "shutdown_timeout")
        to_ms(self.block_timeout, "block_timeout", minimum=10)
        to_ms(self.promote_interval, "promote_interval", minimum=1)
        if to_ms(self.settle_delay, "settle_delay") > 100:
            raise ConfigurationError("settle_delay must be at most 100 ms")
        if self.timeout is not None:
            to_ms(self.timeout, "timeout", minimum=1)
        if self.tenant_concurrency is not None and (
            isinstance(self.tenant_concurrency, bool)
            or not isinstance(self.tenant_concurrency, int) or self.tenant_concurrency < 1
        ):
            raise ConfigurationError(
                f"tenant_concurrency must be >= 1 (or None), got {self.tenant_concurrency!r}"
            )
        to_ms(self.tenant_wait, "tenant_wait", minimum=10)

    @property
    def lock_duration_ms(self) -> int:
        return to_ms(self.lock_duration, "lock_duration")

    @property
    def lock_renew_interval_ms(self) -> int:
        if self.lock_renew_interval is None:
            return self.lock_duration_ms // 2
        return to_ms(self.lock_renew_interval, "lock_renew_interval", minimum=10)

    @property
    def stalled_interval_ms(self) -> int:
        return to_ms(self.stalled_interval, "stalled_interval")

    @property
    def timeout_s(self) -> float | None:
        return None if self.timeout is None else to_ms(self.timeout, "timeout") / 1000

    @property
    def shutdown_timeout_s(self) -> float:
        return to_ms(self.shutdown_timeout, "shutdown_timeout") / 1000

    @property
    def block_timeout_ms(self) -> int:
        return to_ms(self.block_timeout, "block_timeout")

    @property
    def settle_delay_s(self) -> float:
        return to_ms(self.settle_delay, "settle_delay") / 1000

    @property
    def promote_interval_s(self) -> float:
        return to_ms(self.promote_interval, "promote_interval") / 1000

    @property
    def tenant_wait_ms(self) -> int:
        return to_ms(self.tenant_wait, "tenant_wait", minimum=10)

    def merged(self, **overrides: Any) -> WorkerOptions:
        """A copy with ``overrides`` applied; unknown names raise ``ConfigurationError``."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ConfigurationError(
                f"unknown worker option(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        return replace(self, **overrides)


class ProcessorOptions(TypedDict, total=False):
    """The keyword options of ``@app.processor(...)``: :class:`WorkerOptions` fields, typed so
    that mypy or pyright flags a misspelt or mistyped option at the decorator. Durations are
    a ``timedelta`` or seconds."""

    concurrency: int
    prefetch: int
    limiter: Limiter | None
    lock_duration: Duration
    lock_renew_interval: Duration | None
    stalled_interval: Duration
    max_stalled_count: int
    attempts: int | None
    backoff: BackoffLike | None
    timeout: Duration | None
    shutdown_timeout: Duration
    block_timeout: Duration
    dead_letter_cap: int
    promote_interval: Duration
    settle_delay: Duration
    tenant_concurrency: int | None
    tenant_wait: Duration
