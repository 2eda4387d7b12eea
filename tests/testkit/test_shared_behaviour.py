"""One set of behavioural tests, run by the plugin's fixtures on a real redis-server and on
fakeredis (see conftest.py): add, process, retry, delay, dead letters, dedup, pause."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from streamq import SyncDeadLetters, SyncQueueAdmin
from streamq.keys import QueueKeys
from streamq.pytest_plugin import StreamqRedis, StreamqWorker
from tests.testkit.app import Step, Steps, build_app

QueueFactory = Any


async def test_added_jobs_are_processed_once_each(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    queue = streamq_queue(Steps)
    ids = [queue.add(Steps.step, Step(n=i)) for i in range(10)]
    report = await streamq_worker.run(app)
    assert sorted(seen.runs) == [(i, 1) for i in range(10)]
    assert report.completed == 10
    assert report.processed == 10
    assert {o.job_id for o in report.outcomes} == set(ids)


async def test_a_failing_job_is_retried_with_its_attempt_counted_until_it_succeeds(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    job_id = streamq_queue(Steps).add(Steps.step, Step(n=1, act="fail_until:3"))
    report = await streamq_worker.run(app)
    assert seen.runs == [(1, 1), (1, 2), (1, 3)]
    assert [o.outcome for o in report.of(job_id)] == ["retried", "retried", "completed"]
    assert report.retried == 2
    assert report.dead_lettered == 0


async def test_a_job_failing_every_attempt_is_dead_lettered_with_its_error(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker, streamq_redis: StreamqRedis
) -> None:
    app, seen = build_app()
    job_id = streamq_queue(Steps).add(Steps.step, Step(n=7, act="always_fail"))
    report = await streamq_worker.run(app)
    assert seen.runs == [(7, 1), (7, 2), (7, 3)]
    assert report.dead_reasons == {"error": 1}
    dead = SyncDeadLetters(streamq_redis.sync_client(), Steps, prefix=streamq_redis.prefix)
    [letter] = dead.list()
    assert letter.job_id == job_id
    assert letter.attempts == 3
    assert "step 7 is broken" in letter.error


async def test_a_permanent_error_dead_letters_at_once(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    streamq_queue(Steps).add(Steps.step, Step(n=2, act="permanent"))
    report = await streamq_worker.run(app)
    assert seen.runs == [(2, 1)]
    assert report.dead_reasons == {"permanent": 1}
    assert report.count("failed") == 1


async def test_retry_redelays_without_spending_an_attempt(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    streamq_queue(Steps).add(Steps.step, Step(n=3, act="later"))
    report = await streamq_worker.run(app)
    assert seen.runs == [(3, 1), (3, 1)]
    assert [o.outcome for o in report.outcomes] == ["delayed", "completed"]


async def test_a_delayed_job_runs_only_once_due(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    added = time.time()
    streamq_queue(Steps).add(Steps.step, Step(n=4), delay=timedelta(milliseconds=400))
    streamq_queue(Steps).add(Steps.step, Step(n=5))
    report = await streamq_worker.run(app)
    assert report.completed == 2
    # Due times come from the server clock, which is this machine's for both servers.
    assert seen.started_at[4] - added >= 0.39
    assert seen.started_at[5] < seen.started_at[4]


async def test_a_duplicate_job_id_is_added_once(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    queue = streamq_queue(Steps)
    first = queue.add(Steps.step, Step(n=6), job_id="order-6")
    again = queue.add(Steps.step, Step(n=6), job_id="order-6")
    assert first == again == "order-6"
    report = await streamq_worker.run(app)
    assert seen.runs == [(6, 1)]
    assert report.completed == 1


async def test_a_paused_queue_starts_nothing_until_resumed(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker, streamq_redis: StreamqRedis
) -> None:
    app, seen = build_app()
    admin = SyncQueueAdmin(streamq_redis.sync_client(), Steps, prefix=streamq_redis.prefix)
    admin.pause()
    streamq_queue(Steps).add(Steps.step, Step(n=8))
    with pytest.raises(TimeoutError, match="not idle"):
        await streamq_worker.run(app, timeout_s=1.0)
    assert seen.runs == []
    assert admin.depth().ready == 1
    admin.resume()
    report = await streamq_worker.run(app)
    assert seen.runs == [(8, 1)]
    assert report.completed == 1


def test_a_sync_test_runs_the_worker_too(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker
) -> None:
    app, seen = build_app()
    streamq_queue(Steps).add(Steps.step, Step(n=9))
    assert streamq_worker.run_sync(app).completed == 1
    assert seen.runs == [(9, 1)]


def test_each_test_has_a_prefix_of_its_own(streamq_redis: StreamqRedis) -> None:
    client = streamq_redis.sync_client()
    assert client.keys(f"{streamq_redis.prefix}*") == []


async def test_a_job_left_by_a_dead_worker_is_reclaimed_once_its_lock_expires(
    streamq_queue: QueueFactory, streamq_worker: StreamqWorker, streamq_redis: StreamqRedis
) -> None:
    app, seen = build_app()
    client = streamq_redis.sync_client()
    streams = [s.stream for s in QueueKeys(streamq_redis.prefix, "steps", 2).shards]
    for stream in streams:
        client.xgroup_create(stream, "streamq", id="0", mkstream=True)
    job_id = streamq_queue(Steps).add(Steps.step, Step(n=10))
    # A worker that read the job and died: it stays pending under that worker's name.
    taken = client.xreadgroup("streamq", "dead-worker", {s: ">" for s in streams}, count=10)
    assert sum(len(entries) for _, entries in taken) == 1
    report = await streamq_worker.run(
        app, overrides={"steps": {"lock_duration": 0.3, "stalled_interval": 0.1}}
    )
    assert seen.runs == [(10, 1)]  # same attempt: a stall is not a failed attempt
    assert [o.outcome for o in report.of(job_id)] == ["completed"]
    assert all(client.xpending(s, "streamq")["pending"] == 0 for s in streams)
