"""A worker process connected through Redis Sentinel (``redis+sentinel://`` URL) keeps
processing after its primary is SIGKILLed and the sentinels promote the replica: no worker
restart, jobs added after the failover run."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamq import Queue, RedisUnavailable
from streamq.keys import QueueKeys
from streamq.sentinel import SentinelURL
from tests.chaos.harness import Workers
from tests.conftest import _binary_or_stop
from tests.support.chaos_app import Chaos, Work
from tests.support.redis_server import RedisSentinel, RedisServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sentinels(primary: RedisServer, replica: RedisServer) -> Iterator[list[RedisSentinel]]:
    """Three sentinels (quorum 2) watching :func:`primary` as ``jobs``, peers found."""
    started = [
        RedisSentinel(_binary_or_stop(), primary_port=primary.port, service="jobs").start()
        for _ in range(3)
    ]
    try:
        for s in started:
            s.wait_peers(sentinels=3, replicas=1, timeout_s=30)
        yield started
    finally:
        for s in started:
            s.stop()


async def _until(pred, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_worker_keeps_processing_after_a_sentinel_failover_without_restart(
    primary, replica, sentinels, prefix, tmp_path: Path
):
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in sentinels) + "/jobs/0"
    workers = Workers(url, prefix, tmp_path)
    client = SentinelURL.parse(url).async_client(socket_timeout=5, socket_connect_timeout=2)
    acked: dict[str, float] = {}
    stop = asyncio.Event()
    unavailable = 0

    async def produce() -> None:
        nonlocal unavailable
        queue = Queue(Chaos, client, prefix=prefix)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                await queue.add(Chaos.work, Work(n=n), job_id=f"s{n}")
            except RedisUnavailable:
                unavailable += 1
                await asyncio.sleep(0.05)
                continue
            acked[f"s{n}"] = time.monotonic()
            await asyncio.sleep(0.005)

    def ended() -> dict[str, float]:
        return {r["job"]: r["t"] for r in workers.log.records("end", outcome="completed")}

    proc = await workers.start("w1", concurrency=8, lock=5, block_timeout=0.5)
    producer = asyncio.create_task(produce())
    try:
        await _until(lambda: len(ended()) >= 50, 30, "the first jobs to run")

        killed_at = time.monotonic()
        killed_wall = time.time()
        primary.stop(kill=True)
        await _until(lambda: sentinels[0].primary_port() == replica.port, 40,
                     "the sentinels to promote the replica")
        promoted_s = time.monotonic() - killed_at

        def first_new_run() -> float | None:
            after = {j for j, t in acked.items() if t > killed_at}
            times = [t for j, t in ended().items() if j in after]
            return min(times) if times else None

        await _until(lambda: first_new_run() is not None, 40,
                     "a job added after the failover to run")
        worker_recovery_s = first_new_run() - killed_wall  # type: ignore[operator]
        await asyncio.sleep(0.5)
        stop.set()
        await producer

        keys = QueueKeys(prefix, Chaos.queue_name, Chaos.primary.shards)

        def drained() -> bool:
            with redis.Redis(port=replica.port) as r:
                return all(r.xlen(s.stream) == 0 and r.zcard(s.delayed) == 0
                           for s in keys.shards)

        await _until(drained, 30, "the promoted primary's queue to drain")
        assert proc.alive, proc.stderr_tail()
        assert len(workers.log.records("ready", pid=proc.pid)) == 1  # never restarted
    finally:
        stop.set()
        if not producer.done():
            producer.cancel()
        workers.cleanup()
        await client.aclose()

    runs = Counter(r["job"] for r in workers.log.records("start"))
    lost = sorted(set(acked) - set(ended()))
    twice = sorted(j for j, c in runs.items() if c > 1)
    print(f"[sentinel figures] acknowledged={len(acked)} lost={len(lost)} "
          f"ran_twice={len(twice)} unavailable_adds={unavailable} "
          f"promoted_s={promoted_s:.2f} worker_recovery_s={worker_recovery_s:.2f}")
    # Asynchronous replication may lose what the dead primary acknowledged last; it
    # cannot lose more than the adds made around the kill.
    assert len(lost) < len(acked) // 10, lost[:20]


def test_python_m_worker_with_a_sentinel_redis_url_drains_across_a_failover(
    primary, replica, sentinels, prefix, tmp_path: Path
):
    from streamq import JobRequest, SyncQueue
    from tests.entrypoint.helpers import WorkerProcess, clean_env, wait_for
    from tests.entrypoint.sample_app import Note, Notes

    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in sentinels) + "/jobs/0"
    client = SentinelURL.parse(url).sync_client(socket_timeout=5, socket_connect_timeout=2)
    notes = SyncQueue(Notes, client, prefix=prefix)
    keys = QueueKeys(prefix, Notes.queue_name, Notes.primary.shards)

    def ready_left() -> int:
        try:
            return sum(client.xlen(s.stream) + client.zcard(s.delayed) for s in keys.shards)
        except redis.RedisError:
            return -1  # mid-failover: ask again

    # n % 5 == 0 fails on purpose in the sample app: only other numbers here.
    numbers = [n for n in range(1, 400) if n % 5]
    worker = WorkerProcess(
        clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                  REDIS_PREFIX=prefix, QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
                  LOG_FORMAT="json"),
        tmp_path / "worker.log",
    )
    try:
        worker.wait_consuming(timeout_s=30)
        notes.add_bulk(JobRequest(Notes.note, Note(n=n)) for n in numbers[:150])
        wait_for(lambda: ready_left() == 0, 30, "the first jobs to drain")

        primary.stop(kill=True)
        wait_for(lambda: sentinels[0].primary_port() == replica.port, 40,
                 "the sentinels to promote the replica")

        def add_rest() -> bool:
            try:
                notes.add_bulk(JobRequest(Notes.note, Note(n=n), job_id=f"after-{n}")
                               for n in numbers[150:])
            except RedisUnavailable:
                return False  # the client's connection still pointed at the dead primary
            return True

        wait_for(add_rest, 30, "an add to reach the promoted replica")
        wait_for(lambda: ready_left() == 0, 40, "jobs added after the failover to drain")
        assert worker.proc.poll() is None, worker.log  # the same process, never restarted
        assert worker.terminate() == 0
    finally:
        worker.kill()
        client.close()
