"""The adapters alone: every hook lands on the right series, and nothing shadows a hook."""

from __future__ import annotations

import inspect

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest

from streamq import CompositeHooks, Hooks, JobInfo, JobTimeout, PermanentError, Queue
from streamq.health import RedisHealth
from streamq.keys import QueueKeys
from streamq.metrics import PrometheusHooks
from streamq.observe import ObservabilityConfig, build_hooks, find_hooks
from tests.observability.conftest import RunWorker
from tests.observability.support import (
    Behaviour,
    Obs,
    Work,
    make_app,
    parse_metrics,
    scrape,
    total,
    wait_for,
)


def info(**kw: object) -> JobInfo:
    base: dict[str, object] = dict(queue="q", shard="q-1", job_id="j", job_name="n", attempt=1,
                                   max_attempts=3, entry_id="1-0", wait_ms=250.0)
    base.update(kw)
    return JobInfo(**base)  # type: ignore[arg-type]


def test_no_metric_attribute_shadows_a_hook_method() -> None:
    hooks = PrometheusHooks()
    for name, _ in inspect.getmembers(Hooks, inspect.isfunction):
        if name.startswith("_"):
            continue
        assert inspect.ismethod(getattr(hooks, name)), f"{name} is shadowed"


def test_each_hook_lands_on_its_series() -> None:
    registry = CollectorRegistry()
    h = PrometheusHooks(registry)
    h.consumer_started("q", ["q", "q-1"], ["n"])
    h.enqueued("q", "q-1", "n", delayed=False)
    h.enqueued("q", "q-1", "n", delayed=True)
    h.enqueue_duplicate("q", "q-1", "n")
    h.enqueue_rejected("q", "n", "too_large")
    h.job_started(info())
    h.job_finished(info(), "completed", 0.02)
    h.job_finished(info(), "retried", 0.5, RuntimeError("x"))
    h.job_finished(info(), "failed", 0.5, PermanentError("x"))
    h.job_finished(info(), "retried", 2.0, JobTimeout("x"))
    h.job_finished(info(), "delayed", 0.01)
    h.job_dead_lettered("q", "q-1", "n", "permanent")
    h.jobs_stalled("q", "q-1", 2)
    h.jobs_reclaimed("q", "q-1", 1)
    h.lock_lost("q", "q-1", 3)
    h.payload_lost("q", "q-1", 1)
    h.promoted("q", "q-1", 4)
    h.active_changed("q", 7)
    h.redis_error("q", ConnectionError("down"))
    h.queue_depth("q", "all", ready=5, delayed=2, in_flight=1, dead=9, oldest_ready_age_s=3.5,
                  consumers=2)
    h.event_loop_lag(0.25)
    s = parse_metrics(generate_latest(registry).decode())
    q = {"queue": "q", "shard": "q-1"}
    assert total(s, "streamq_jobs_enqueued_total", **q, delayed="false") == 1
    assert total(s, "streamq_jobs_enqueued_total", **q, delayed="true") == 1
    assert total(s, "streamq_enqueue_duplicates_total", **q) == 1
    assert total(s, "streamq_enqueue_rejected_total", queue="q", reason="too_large") == 1
    assert total(s, "streamq_jobs_started_total", **q) == 1
    assert total(s, "streamq_job_wait_seconds_sum", **q) == 0.25
    assert total(s, "streamq_jobs_completed_total", **q) == 1
    assert total(s, "streamq_job_failed_attempts_total", **q, reason="error") == 1
    assert total(s, "streamq_job_failed_attempts_total", **q, reason="permanent") == 1
    assert total(s, "streamq_job_failed_attempts_total", **q, reason="timeout") == 1
    assert total(s, "streamq_jobs_retried_total", **q) == 2
    assert total(s, "streamq_jobs_redelayed_total", **q) == 1
    assert total(s, "streamq_job_processing_seconds_count", queue="q") == 5
    assert total(s, "streamq_job_processing_seconds_count", queue="q", outcome="retried") == 2
    assert total(s, "streamq_jobs_dead_lettered_total", **q, reason="permanent") == 1
    assert total(s, "streamq_jobs_dead_lettered_total", **q) == 1
    assert total(s, "streamq_jobs_stalled_total", **q) == 2
    assert total(s, "streamq_jobs_reclaimed_total", **q) == 1
    assert total(s, "streamq_lock_lost_total", **q) == 3
    assert total(s, "streamq_payload_lost_total", **q) == 1
    assert total(s, "streamq_jobs_promoted_total", **q) == 4
    assert total(s, "streamq_jobs_active", queue="q") == 7
    assert total(s, "streamq_redis_errors_total", queue="q") == 1
    assert total(s, "streamq_queue_dead", queue="q", shard="all") == 9
    assert total(s, "streamq_queue_oldest_ready_age_seconds", queue="q", shard="all") == 3.5
    assert total(s, "streamq_event_loop_lag_seconds") == 0.25
    # consumer_started made the rare series exist at zero, for every shard and reason.
    assert ("streamq_lock_lost_total", frozenset({("queue", "q"), ("shard", "q")})) in s
    assert (
        "streamq_jobs_dead_lettered_total",
        frozenset({("queue", "q"), ("shard", "q"), ("reason", "lost_payload")}),
    ) in s
    for name in ("streamq_jobs_cancelled_total", "streamq_tenant_cap_waits_total"):
        assert (name, frozenset({("queue", "q"), ("shard", "q"), ("job", "n")})) in s, name


def test_two_instances_never_clash_and_build_hooks_finds_its_parts() -> None:
    PrometheusHooks()
    PrometheusHooks()  # each has its own registry
    hooks = build_hooks(ObservabilityConfig())
    assert isinstance(hooks, CompositeHooks)
    assert [type(h).__name__ for h in hooks.hooks] == [
        "TracingHooks", "PrometheusHooks", "JobLogHooks", "RedisHealth"
    ]
    assert find_hooks(hooks, RedisHealth) is hooks.hooks[-1]
    prom = find_hooks(hooks, PrometheusHooks)
    assert prom is not None
    text = generate_latest(prom.registry).decode()
    assert "process_cpu_seconds_total" in text or "python_gc_objects_collected_total" in text


async def test_a_pending_entry_whose_body_was_deleted_is_counted_as_payload_lost(
    run_worker: RunWorker, aredis: aioredis.Redis, prefix: str
) -> None:
    keys = QueueKeys(prefix, "obs", 2)
    queue = Queue(Obs, aredis, prefix=prefix)
    await queue.add(Obs.work, Work(project_id="p"), job_id="lost-1")
    shard = keys.for_key("lost-1")
    await aredis.xgroup_create(shard.stream, "streamq", id="0", mkstream=True)
    [[_, [(entry_id, _)]]] = await aredis.xreadgroup("streamq", "ghost", {shard.stream: ">"})
    await aredis.xdel(shard.stream, entry_id)

    hooks = PrometheusHooks()
    _, server = await run_worker(make_app(Behaviour()), hooks)
    port = server.port
    assert port is not None

    async def counted() -> bool:
        s = await scrape(port)
        return total(s, "streamq_payload_lost_total", queue="obs") == 1

    await wait_for(counted, what="the lost payload to be counted")
    s = await scrape(port)
    assert total(s, "streamq_payload_lost_total", queue="obs", shard=shard.name) == 1
    assert total(s, "streamq_jobs_dead_lettered_total", queue="obs", reason="lost_payload") == 1
    assert total(s, "streamq_jobs_started_total", queue="obs") == 0


async def test_a_producer_counts_an_add_redis_refused_as_a_redis_error() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from streamq import RedisUnavailable
    from tests.support.redis_server import free_port

    hooks = PrometheusHooks()
    client = aioredis.Redis(
        port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    queue = Queue(Obs, client, hooks=hooks)
    try:
        with pytest.raises(RedisUnavailable):
            await queue.add(Obs.work, Work(project_id="p"))
    finally:
        await client.aclose()
    s = parse_metrics(generate_latest(hooks.registry).decode())
    assert total(s, "streamq_enqueue_rejected_total", queue="obs", reason="redis_error") == 1
    assert total(s, "streamq_jobs_enqueued_total") == 0
