"""Prometheus metrics: a :class:`~streamq.hooks.Hooks` adapter (extra ``streamq[metrics]``).

Every series is labelled by bounded values only: queue (lane), shard, job name, outcome,
reason. Job ids and tenants never become labels. ``docs/observability.md`` lists every metric.

Several worker processes on one machine (``python -m worker`` with ``WORKER_PROCESSES`` > 1)
use prometheus-client's multiprocess mode: each gauge says how the processes' values combine
(:data:`GAUGE_MODES`), counters and histograms are summed.

Example::

    hooks = PrometheusHooks()                      # its own CollectorRegistry
    manager = WorkerManager(redis_url=url, hooks=hooks)
    queue = Queue(Ingestion, client, hooks=hooks)  # producers count enqueues and rejections
    body = prometheus_client.generate_latest(hooks.registry)
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, Literal

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "streamq.metrics needs prometheus-client: pip install 'streamq[metrics]'"
    ) from exc

from streamq.errors import JobTimeout, PermanentError
from streamq.hooks import DeadReason, Hooks, JobInfo, Outcome

__all__ = ["DEAD_REASONS", "FLUSH_INTERVAL_S", "GAUGE_MODES", "PROCESSING_BUCKETS",
           "WAIT_BUCKETS", "PrometheusHooks"]

DEAD_REASONS: tuple[str, ...] = (
    "error",
    "permanent",
    "invalid_payload",
    "unknown_job",
    "stalled",
    "timeout",
    "lost_payload",
)
WAIT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)
PROCESSING_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
    600,
)
ALL_SHARDS = "all"
"""The ``shard`` label of a queue-wide aggregate."""

GaugeMode = Literal["livesum", "livemax", "livemostrecent"]
GAUGE_MODES: dict[str, GaugeMode] = {
    # Jobs running in each process: the machine runs their sum.
    "jobs_active": "livesum",
    # Every process polls the same queues: the latest reading is the depth.
    "queue_ready": "livemostrecent",
    "queue_delayed": "livemostrecent",
    "queue_in_flight": "livemostrecent",
    "queue_dead": "livemostrecent",
    "queue_oldest_ready_age_seconds": "livemostrecent",
    "queue_consumers": "livemostrecent",
    # A late timer in any process is the one to see.
    "event_loop_lag_seconds": "livemax",
    # At most one process of the fleet leads a singleton runner: the sum says if one here does.
    "runner_leader": "livesum",
}
"""How each gauge (name without namespace) combines over processes in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``); ``live*``: a dead process's value is dropped once it is
marked dead. Outside multiprocess mode this is ignored."""

_FAILED_OUTCOMES = frozenset({"retried", "failed"})

FLUSH_INTERVAL_S = 0.05
"""Longest a per-job figure waits on the event loop before it reaches the metrics; a scrape
(or any ``registry.collect()``) writes what is waiting first, so it never reads stale ones."""


class _Tally:
    """Per-job figures gathered in plain dicts and written to the metrics in one go.

    A worker records a few figures per job (started, wait, run time, outcome, jobs active);
    written one by one, each is a label lookup plus a locked update, a fifth of a no-op job's
    CPU. Here a job costs a dict update under one uncontended lock; :meth:`flush` writes the
    sums (a histogram's as bucket counts) every :data:`FLUSH_INTERVAL_S` on the event loop,
    before every collection (see :class:`_FlushFirst`), and when told.
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.counts: dict[Any, int] = {}           # counter child -> increments
        self.observed: dict[Any, list[float]] = {}  # histogram child -> [count per bucket.., sum]
        self.gauges: dict[Any, float] = {}          # gauge child -> latest value
        self.scheduled = False

    def count(self, child: Any) -> None:
        with self.lock:
            counts = self.counts
            counts[child] = counts.get(child, 0) + 1
        self._soon()

    def observe(self, child: Any, value: float) -> None:
        bounds = child._upper_bounds
        with self.lock:
            acc = self.observed.get(child)
            if acc is None:
                acc = self.observed[child] = [0.0] * (len(bounds) + 1)
            acc[bisect_left(bounds, value)] += 1
            acc[-1] += value
        self._soon()

    def set(self, child: Any, value: float) -> None:
        with self.lock:
            self.gauges[child] = value
        self._soon()

    def _soon(self) -> None:
        if self.scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a thread): write now
            self.flush()
            return
        self.scheduled = True
        loop.call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Write every waiting figure to its metric."""
        with self.lock:
            self.scheduled = False
            counts, self.counts = self.counts, {}
            observed, self.observed = self.observed, {}
            gauges, self.gauges = self.gauges, {}
        for child, n in counts.items():
            child.inc(n)
        for child, acc in observed.items():
            _observe_many(child, acc)
        for child, value in gauges.items():
            child.set(value)


def _observe_many(child: Any, acc: list[float]) -> None:
    """Add bucket counts and a sum to a histogram child as ``observe`` would one by one."""
    buckets, total = acc[:-1], acc[-1]
    child._sum.inc(total)
    for i, n in enumerate(buckets):
        if n:
            child._buckets[min(i, len(child._buckets) - 1)].inc(n)


@cache
def _bulk_histograms_work() -> bool:
    """Whether this prometheus-client's histogram children keep the fields
    :func:`_observe_many` writes (checked once, on a throwaway registry)."""
    h = Histogram("streamq_probe", "probe", ("x",), buckets=(1.0,),
                  registry=CollectorRegistry())
    child = h.labels("x")
    ok = all(hasattr(child, a) for a in ("_upper_bounds", "_buckets", "_sum"))
    if ok:
        child.observe(0.5)
        _observe_many(child, [1.0, 0.0, 0.5])
        samples = {s.name: s.value for m in h.collect() for s in m.samples}
        ok = samples.get("streamq_probe_count") == 2 and samples.get("streamq_probe_sum") == 1.0
    return ok


class _FlushFirst:
    """A collector registered before the metrics: collecting flushes the tally first."""

    def __init__(self, tally: _Tally) -> None:
        self.tally = tally

    def collect(self) -> Iterable[Any]:
        self.tally.flush()
        return []

    def describe(self) -> Iterable[Any]:
        return []


def _failure_reason(error: BaseException | None) -> str:
    if isinstance(error, PermanentError):
        return "permanent"
    if isinstance(error, JobTimeout):
        return "timeout"
    return "error"


class PrometheusHooks(Hooks):
    """Counts and times jobs into Prometheus metrics.

    Args:
        registry: where the metrics are registered; by default a new ``CollectorRegistry``
            of this instance's own, so two instances (or tests) never clash.
        namespace: metric name prefix.
        wait_buckets: bucket bounds of the wait-time histogram (seconds).
        processing_buckets: bucket bounds of the processing-time histogram (seconds).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "streamq",
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
        processing_buckets: Sequence[float] = PROCESSING_BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._tally = _Tally(FLUSH_INTERVAL_S)
        self._bulk = _bulk_histograms_work()
        # Registered before the metrics, so a collection writes waiting figures first.
        self.registry.register(_FlushFirst(self._tally))
        self._build(namespace, tuple(wait_buckets), tuple(processing_buckets))

    def flush(self) -> None:
        """Write per-job figures still waiting (at most :data:`FLUSH_INTERVAL_S` old) to the
        metrics; a collection does it by itself, a process about to exit should call it."""
        self._tally.flush()

    def _observe(self, child: Any, value: float) -> None:
        if self._bulk:
            self._tally.observe(child, value)
        else:  # pragma: no cover - a prometheus-client without the fields the tally writes
            child.observe(value)

    def _build(self, ns: str, wait: tuple[float, ...], proc: tuple[float, ...]) -> None:
        r = self.registry

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(f"{ns}_{name}", doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: Sequence[str]) -> Gauge:
            return Gauge(f"{ns}_{name}", doc, labels, registry=r,
                         multiprocess_mode=GAUGE_MODES[name])

        qsj = ("queue", "shard", "job")
        qs = ("queue", "shard")
        # producer
        self.enqueued_total = counter("jobs_enqueued", "Jobs written to Redis by producers.",
                                (*qsj, "delayed"))
        self.duplicates = counter("enqueue_duplicates", "Adds skipped: the job id's dedup "
                                  "marker exists.", qsj)
        self.rejected = counter("enqueue_rejected", "Adds refused before or while writing.",
                                ("queue", "job", "reason"))
        self.tenant_routed_total = counter("jobs_routed_by_tenant_flag", "Adds written to the "
                                           "secondary lane because their tenant is flagged.",
                                           ("queue", "job"))
        # worker, per job
        self.wait = Histogram(f"{ns}_job_wait_seconds", "Time from when a job became due to "
                              "when its attempt started.", qsj, buckets=wait, registry=r)
        self.processing = Histogram(f"{ns}_job_processing_seconds", "Processor run time of an "
                                    "attempt, by outcome.", ("queue", "job", "outcome"),
                                    buckets=proc, registry=r)
        self.started = counter("jobs_started", "Attempts started.", qsj)
        self.completed = counter("jobs_completed", "Attempts that completed.", qsj)
        self.failed = counter("job_failed_attempts", "Attempts that raised (retried or dead).",
                              (*qsj, "reason"))
        self.retried = counter("jobs_retried", "Failed attempts scheduled to run again.", qsj)
        self.delayed = counter("jobs_redelayed", "Attempts that asked for a delay (Retry, "
                               "RateLimited); no attempt spent.", qsj)
        self.cancelled = counter("jobs_cancelled", "Running tracked jobs that ended cancelled "
                                 "(a cancel request; acked and removed, not retried).", qsj)
        self.dead = counter("jobs_dead_lettered", "Jobs moved to the dead-letter stream.",
                            (*qs, "reason"))
        self.tenant_waits = counter("tenant_cap_waits", "Jobs re-delayed without spending an "
                                    "attempt: their tenant ran its tenant_concurrency jobs.",
                                    qsj)
        # worker, maintenance
        self.stalled = counter("jobs_stalled", "Entries found stalled (lock expired).", qs)
        self.reclaimed = counter("jobs_reclaimed", "Stalled entries taken over to run again.", qs)
        self.lock_lost_total = counter("lock_lost", "Jobs whose lock another worker took; not "
                                       "acknowledged here.", qs)
        self.payload_lost_total = counter("payload_lost", "Pending entries whose body was "
                                          "deleted; dead-lettered.", qs)
        self.promoted_total = counter("jobs_promoted", "Delayed or retrying jobs moved to the "
                                      "stream when due.", qs)
        self.redis_errors = counter("redis_errors", "Failed Redis calls of the worker runtime.",
                                    ("queue",))
        self.task_crashes = counter("task_crashes", "Long-lived worker tasks that raised an "
                                    "unexpected error and were restarted.", ("queue", "task"))
        self.active = gauge("jobs_active", "Attempts running in this process.", ("queue",))
        # poller
        self.ready = gauge("queue_ready", "Jobs in the stream not yet delivered.", qs)
        self.delayed_depth = gauge("queue_delayed", "Jobs waiting for their due time "
                                   "(delayed or retrying).", qs)
        self.in_flight = gauge("queue_in_flight", "Jobs delivered and not yet settled.", qs)
        self.dead_depth = gauge("queue_dead", "Entries in the dead-letter stream.", qs)
        self.oldest_ready = gauge("queue_oldest_ready_age_seconds", "Age of the oldest job "
                                  "not yet delivered.", qs)
        self.consumers = gauge("queue_consumers", "Consumers in the group.", qs)
        self.loop_lag = gauge("event_loop_lag_seconds", "How late an event-loop timer of this "
                              "process fired.", ())
        # runners
        self.runner_crashes = counter("runner_crashes", "Runners that raised an unexpected "
                                      "error and were restarted.", ("runner",))
        self.runner_leadership = counter("runner_leadership_changes", "Singleton runner leases "
                                         "taken or lost by this process.", ("runner", "change"))
        self.runner_leader = gauge("runner_leader", "1 while this process leads the singleton "
                                   "runner.", ("runner",))

    def _child(self, metric: Any, *labels: str) -> Any:
        # labels() takes a lock and builds a tuple on every call; jobs hit a few children often.
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- producer --------------------------------------------------------------------------
    def producer_started(self, queue: str, shards: Sequence[str], job_names: Sequence[str]) -> None:
        # The enqueued and redis_error series exist at 0 before the first add, so rate() and
        # the enqueue-failure alert see the first job and the first refused write.
        for name in job_names:
            self._child(self.rejected, queue, name, "redis_error")
            self._child(self.tenant_routed_total, queue, name)
            for shard in shards:
                self._child(self.enqueued_total, queue, shard, name, "false")

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        flag = "true" if delayed else "false"
        self._child(self.enqueued_total, queue, shard, job_name, flag).inc()

    def enqueue_duplicate(self, queue: str, shard: str, job_name: str) -> None:
        self._child(self.duplicates, queue, shard, job_name).inc()

    def enqueue_rejected(self, queue: str, job_name: str, reason: str) -> None:
        self._child(self.rejected, queue, job_name, reason).inc()

    def tenant_routed(self, queue: str, job_name: str) -> None:
        self._child(self.tenant_routed_total, queue, job_name).inc()

    def tenant_cap_waited(self, queue: str, shard: str, job_name: str) -> None:
        # Up to one per job start: tallied like the other per-job figures.
        self._tally.count(self._child(self.tenant_waits, queue, shard, job_name))

    # -- worker ----------------------------------------------------------------------------
    def consumer_started(
        self, queue: str, shards: Sequence[str], job_names: Sequence[str]
    ) -> None:
        # Series that exist from the start read 0 instead of being absent, so rate() and
        # alerts see the first event.
        self._child(self.active, queue).set(0)
        for shard in shards:
            for metric in (self.stalled, self.reclaimed, self.lock_lost_total,
                           self.payload_lost_total, self.promoted_total):
                self._child(metric, queue, shard)
            for reason in DEAD_REASONS:
                self._child(self.dead, queue, shard, reason)
            for name in job_names:
                for metric in (self.started, self.completed, self.retried, self.cancelled,
                               self.tenant_waits):
                    self._child(metric, queue, shard, name)
                self._child(self.failed, queue, shard, name, "error")

    def job_started(self, job: JobInfo) -> None:
        tally = self._tally
        tally.count(self._child(self.started, job.queue, job.shard, job.job_name))
        self._observe(self._child(self.wait, job.queue, job.shard, job.job_name),
                      job.wait_ms / 1000)

    def job_finished(
        self,
        job: JobInfo,
        outcome: Outcome,
        duration_s: float,
        error: BaseException | None = None,
    ) -> None:
        tally = self._tally
        self._observe(self._child(self.processing, job.queue, job.job_name, outcome), duration_s)
        if outcome == "completed":
            tally.count(self._child(self.completed, job.queue, job.shard, job.job_name))
            return
        if outcome == "cancelled":
            tally.count(self._child(self.cancelled, job.queue, job.shard, job.job_name))
            return
        if outcome in _FAILED_OUTCOMES:
            tally.count(self._child(self.failed, job.queue, job.shard, job.job_name,
                                    _failure_reason(error)))
        if outcome == "retried":
            tally.count(self._child(self.retried, job.queue, job.shard, job.job_name))
        elif outcome == "delayed":
            tally.count(self._child(self.delayed, job.queue, job.shard, job.job_name))

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: DeadReason) -> None:
        self._child(self.dead, queue, shard, reason).inc()

    def jobs_reclaimed(self, queue: str, shard: str, count: int) -> None:
        self._child(self.reclaimed, queue, shard).inc(count)

    def jobs_stalled(self, queue: str, shard: str, count: int) -> None:
        self._child(self.stalled, queue, shard).inc(count)

    def lock_lost(self, queue: str, shard: str, count: int) -> None:
        self._child(self.lock_lost_total, queue, shard).inc(count)

    def payload_lost(self, queue: str, shard: str, count: int) -> None:
        self._child(self.payload_lost_total, queue, shard).inc(count)

    def promoted(self, queue: str, shard: str, count: int) -> None:
        self._child(self.promoted_total, queue, shard).inc(count)

    def active_changed(self, queue: str, active: int) -> None:
        self._tally.set(self._child(self.active, queue), active)

    def redis_error(self, queue: str | None, error: BaseException) -> None:
        self._child(self.redis_errors, queue or "").inc()

    # -- poller ----------------------------------------------------------------------------
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
        sets: tuple[tuple[Gauge, float], ...] = (
            (self.ready, ready),
            (self.delayed_depth, delayed),
            (self.in_flight, in_flight),
            (self.dead_depth, dead),
            (self.oldest_ready, oldest_ready_age_s),
            (self.consumers, consumers),
        )
        for metric, value in sets:
            self._child(metric, queue, shard).set(value)

    def task_crashed(self, queue: str | None, task: str) -> None:
        self._child(self.task_crashes, queue or "", task).inc()

    def event_loop_lag(self, lag_s: float) -> None:
        self.loop_lag.set(lag_s)

    def runner_crashed(self, runner: str) -> None:
        self._child(self.runner_crashes, runner).inc()

    def runner_leadership_changed(self, runner: str, leader: bool) -> None:
        self._child(self.runner_leadership, runner, "acquired" if leader else "lost").inc()
        self._child(self.runner_leader, runner).set(1 if leader else 0)
