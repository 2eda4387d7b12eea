"""Per-job figures are gathered and written in one go, and read exactly as if written one by
one: a collection never sees them stale."""

from __future__ import annotations

import asyncio
import random

from prometheus_client import CollectorRegistry, Histogram

from streamq import JobInfo
from streamq.metrics import FLUSH_INTERVAL_S, PROCESSING_BUCKETS, PrometheusHooks


def info(**kw: object) -> JobInfo:
    base: dict[str, object] = dict(queue="q", shard="q-1", job_id="j", job_name="n", attempt=1,
                                   max_attempts=3, entry_id="1-0", wait_ms=250.0)
    base.update(kw)
    return JobInfo(**base)  # type: ignore[arg-type]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


def test_bulk_histogram_writes_read_the_same_as_one_observe_each() -> None:
    rnd = random.Random(7)
    values = [rnd.choice([0.0, *PROCESSING_BUCKETS, 1e6]) for _ in range(300)]
    values += [rnd.uniform(0, 700) for _ in range(300)]
    hooks = PrometheusHooks()
    reference = CollectorRegistry()
    plain = Histogram("streamq_job_processing_seconds", "x", ("queue", "job", "outcome"),
                      buckets=PROCESSING_BUCKETS, registry=reference)
    for v in values:
        hooks.job_finished(info(), "completed", v)
        plain.labels("q", "n", "completed").observe(v)
    got = {k: v for k, v in samples(hooks.registry).items()
           if k[0].startswith("streamq_job_processing_seconds")}
    want = samples(reference)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6 * max(1.0, abs(value)), key


async def test_figures_recorded_on_the_loop_reach_the_metrics_within_the_flush_interval() -> None:
    hooks = PrometheusHooks()
    for _ in range(5):
        hooks.job_started(info())
        hooks.job_finished(info(), "completed", 0.01)
    hooks.active_changed("q", 3)
    values = hooks._tally  # nothing written yet: the figures wait in the tally
    assert values.counts
    assert values.gauges
    await asyncio.sleep(FLUSH_INTERVAL_S * 3)
    assert not values.counts
    assert not values.observed
    assert not values.gauges
    assert hooks.registry.get_sample_value(
        "streamq_jobs_completed_total", {"queue": "q", "shard": "q-1", "job": "n"}) == 5
    assert hooks.registry.get_sample_value("streamq_jobs_active", {"queue": "q"}) == 3


async def test_a_collection_writes_waiting_figures_first() -> None:
    hooks = PrometheusHooks()
    hooks.job_started(info())
    hooks.job_finished(info(), "retried", 0.2)
    # Read at once, well before the flush timer fires.
    labels = {"queue": "q", "shard": "q-1", "job": "n"}
    assert hooks.registry.get_sample_value("streamq_jobs_started_total", labels) == 1
    assert hooks.registry.get_sample_value("streamq_jobs_retried_total", labels) == 1
    assert hooks.registry.get_sample_value(
        "streamq_job_wait_seconds_count", labels) == 1


def test_figures_recorded_off_the_event_loop_are_written_at_once() -> None:
    hooks = PrometheusHooks()
    hooks.job_finished(info(), "completed", 0.1)
    assert not hooks._tally.counts
    hooks.flush()
    assert hooks.registry.get_sample_value(
        "streamq_jobs_completed_total", {"queue": "q", "shard": "q-1", "job": "n"}) == 1
