"""A worker's /metrics after a scripted scenario: exact counts of every outcome."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from streamq import InvalidPayload, PayloadTooLarge, Queue, UnknownJob
from streamq.keys import QueueKeys
from streamq.metrics import PrometheusHooks
from tests.observability.conftest import RunWorker
from tests.observability.support import (
    Behaviour,
    Obs,
    Work,
    make_app,
    raw_entry,
    scrape,
    total,
    wait_for,
)

GROUP = "streamq"
DELAY_S = 1.5


async def test_scrape_after_scenario_counts_every_outcome_and_wait_excludes_delay(
    run_worker: RunWorker, aredis: aioredis.Redis, prefix: str
) -> None:
    hooks = PrometheusHooks()
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks, max_payload_bytes=200)
    keys = QueueKeys(prefix, "obs", 2)

    # Refused adds never reach Redis, but producers count them.
    with pytest.raises(InvalidPayload):
        await queue.add(Obs.work, {"mode": "ok"})
    with pytest.raises(UnknownJob):
        await queue.add("nope", {"project_id": "p"})
    with pytest.raises(PayloadTooLarge):
        await queue.add(Obs.work, Work(project_id="p", token="x" * 500))

    # A job taken by a consumer that then dies: reclaimed once its lock expires.
    await queue.add(Obs.work, Work(project_id="p"), job_id="stalled-1")
    stalled_shard = keys.for_key("stalled-1")
    await aredis.xgroup_create(stalled_shard.stream, GROUP, id="0", mkstream=True)
    taken = await aredis.xreadgroup(GROUP, "ghost", {stalled_shard.stream: ">"}, count=10)
    assert len(taken[0][1]) == 1

    # Poison: entries written around the producer, one invalid, one of an unknown job.
    await aredis.xadd(keys.shards[0].stream,
                      raw_entry(job_id="poison-1", name="work", payload=b'{"mode":"ok"}'))
    await aredis.xadd(keys.shards[1].stream,
                      raw_entry(job_id="poison-2", name="nope", payload=b'{"project_id":"p"}'))

    state = Behaviour()
    manager, server = await run_worker(make_app(state), hooks)
    assert server.port is not None

    for i in range(5):
        await queue.add(Obs.work, Work(project_id="p", n=i))
    await queue.add(Obs.work, Work(project_id="p", mode="flaky"), job_id="flaky-1")
    await queue.add(Obs.work, Work(project_id="p", mode="fail"), job_id="fail-1")
    later_enqueued_at = time.time()
    await queue.add(Obs.later, Work(project_id="p"), job_id="later-1", delay=DELAY_S)

    await manager.run_until_idle(timeout_s=20)
    # The delayed job really waited for its delay...
    assert state.ran_at["later-1"] - later_enqueued_at >= DELAY_S - 0.05
    assert sorted(a for j, a in state.runs if j == "flaky-1") == [1, 2, 3]

    async def depth_settled() -> bool:
        s = await scrape(server.port)  # type: ignore[arg-type]
        return (
            total(s, "streamq_queue_dead", queue="obs", shard="all") == 3
            and total(s, "streamq_queue_ready", queue="obs", shard="all") == 0
            and total(s, "streamq_queue_in_flight", queue="obs", shard="all") == 0
            and total(s, "streamq_queue_delayed", queue="obs", shard="all") == 0
        )

    await wait_for(depth_settled, what="the poller to see the drained queue")
    s = await scrape(server.port)  # type: ignore[arg-type]

    q = {"queue": "obs"}
    # producer
    assert total(s, "streamq_jobs_enqueued_total", **q, job="work", delayed="false") == 8
    assert total(s, "streamq_jobs_enqueued_total", **q, job="later", delayed="true") == 1
    assert total(s, "streamq_enqueue_rejected_total", **q, reason="invalid") == 1
    assert total(s, "streamq_enqueue_rejected_total", **q, reason="unknown_job") == 1
    assert total(s, "streamq_enqueue_rejected_total", **q, reason="too_large") == 1
    # attempts: 5 ok + stalled 1 + flaky 3 + fail 3 (work) and the delayed one (later)
    assert total(s, "streamq_jobs_started_total", **q, job="work") == 12
    assert total(s, "streamq_jobs_started_total", **q, job="later") == 1
    assert total(s, "streamq_jobs_completed_total", **q, job="work") == 7
    assert total(s, "streamq_jobs_completed_total", **q, job="later") == 1
    assert total(s, "streamq_job_failed_attempts_total", **q) == 5
    assert total(s, "streamq_job_failed_attempts_total", **q, reason="error") == 5
    assert total(s, "streamq_jobs_retried_total", **q) == 4
    # dead letters, by reason
    dead = {
        r: total(s, "streamq_jobs_dead_lettered_total", **q, reason=r)
        for r in ("error", "permanent", "invalid_payload", "unknown_job", "stalled", "timeout",
                  "lost_payload")
    }
    assert dead == {"error": 1, "permanent": 0, "invalid_payload": 1, "unknown_job": 1,
                    "stalled": 0, "timeout": 0, "lost_payload": 0}
    # maintenance
    assert total(s, "streamq_jobs_stalled_total", **q) == 1
    assert total(s, "streamq_jobs_reclaimed_total", **q) == 1
    assert total(s, "streamq_jobs_reclaimed_total", **q, shard=stalled_shard.name) == 1
    assert total(s, "streamq_lock_lost_total", **q) == 0
    assert total(s, "streamq_payload_lost_total", **q) == 0
    assert total(s, "streamq_jobs_promoted_total", **q) == 1 + 4  # the delayed job, 4 retries
    # processing time is recorded for failures too, by outcome
    proc = "streamq_job_processing_seconds_count"
    assert total(s, proc, **q, job="work", outcome="completed") == 7
    assert total(s, proc, **q, job="work", outcome="retried") == 4
    assert total(s, proc, **q, job="work", outcome="failed") == 1
    assert total(s, proc, **q, job="later", outcome="completed") == 1
    # ...and wait time is measured from when the job became due, not from its enqueue
    assert total(s, "streamq_job_wait_seconds_count", **q, job="later") == 1
    assert total(s, "streamq_job_wait_seconds_sum", **q, job="later") < 0.5
    assert total(s, "streamq_job_wait_seconds_bucket", **q, job="later", le="0.5") == 1
    # gauges
    assert total(s, "streamq_jobs_active", **q) == 0
    assert total(s, "streamq_queue_dead", **q, shard="all") == 3
    assert total(s, "streamq_queue_dead", **q, shard="obs") + total(
        s, "streamq_queue_dead", **q, shard="obs-1"
    ) == 3
    assert total(s, "streamq_queue_consumers", **q, shard="all") >= 1
    assert ("streamq_event_loop_lag_seconds", frozenset()) in s
    # no job ids or tenants as labels
    for (_, labels) in s:
        values = {v for _, v in labels}
        assert not values & {"stalled-1", "flaky-1", "fail-1", "later-1", "p"}
