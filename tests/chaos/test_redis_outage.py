"""A Redis outage or crash loses no job and kills no worker (DESIGN.md §5).

Each test runs its own redis-server with AOF (``appendfsync always``) on its own port, crashes
it (SIGKILL) with a worker process attached, and restarts it on the same port from the
same data directory. The worker stays alive through the outage, reconnects, and processes
what survived (ready and delayed jobs, in-flight entries) and what is added afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq import JobRequest, Queue
from tests.chaos.harness import Workers, completed_jobs
from tests.support.chaos_app import Chaos, Work
from tests.support.redis_server import RedisServer, find_binary

LOCK_S = 1.5
STALLED_S = 0.5
BLOCK_S = 1.0
OUTAGE_S = 2.0
"""Longer than the blocking read and than the lock."""
RECOVERY_S = 6.0
"""How soon after the restart the worker must be working again (reconnect backoff included)."""

OPTS = {"lock": LOCK_S, "stalled": STALLED_S, "block_timeout": BLOCK_S}


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    binary = find_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server binary found")
        pytest.skip("no redis-server binary found")
    server = RedisServer(
        binary, appendonly=True, extra=["--maxmemory-policy", "noeviction"]
    ).start()
    yield server
    server.stop(kill=True)
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
async def aof(aof_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=aof_server.port)
    yield client
    await client.aclose()


@pytest.fixture
def outage_workers(aof_server: RedisServer, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(aof_server.url, prefix, tmp_path)
    yield w
    w.cleanup()


async def _outage(server: RedisServer, workers: Workers, watched: str) -> float:
    """Crash Redis, keep it down ``OUTAGE_S`` (until ``watched`` has noticed), restart it.

    Returns the wall-clock time of the crash.
    """
    server.stop(kill=True)
    down_at = time.time()
    await workers.wait_for(
        lambda: workers.log.records("redis_error", consumer=watched)
        and [r for r in workers.log.records("redis_error", consumer=watched)
             if r["t"] > down_at],
        timeout_s=OUTAGE_S + 5,
        what=f"{watched} noticing the outage",
    )
    # The outage's length is what is under test (longer than the blocking read and the
    # lock), so it is waited out, not polled for.
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.time() - down_at)))
    server.start()
    return down_at


async def test_worker_survives_a_redis_outage_and_processes_jobs_added_after_restart(
    aof_server: RedisServer, aof: aioredis.Redis, outage_workers: Workers, prefix: str
) -> None:
    workers = outage_workers
    queue = Queue(Chaos, aof, prefix=prefix)
    a = await workers.start("a", **OPTS)
    before = await queue.add(Chaos.work, Work(n=0))
    await workers.wait_record("end", job=before, outcome="completed", timeout_s=10)

    await _outage(aof_server, workers, "a")
    restarted = time.time()
    assert a.alive, workers.diagnostics([a])

    after = await queue.add(Chaos.work, Work(n=1))
    done = await workers.wait_record(
        "end", job=after, outcome="completed", timeout_s=RECOVERY_S
    )
    assert done["consumer"] == "a"
    assert done["t"] - restarted < RECOVERY_S
    await workers.wait_for(lambda: workers.drained(aof), timeout_s=5, what="queue drained")
    assert a.alive


async def test_ready_and_delayed_jobs_survive_a_redis_crash_with_aof(
    aof_server: RedisServer, aof: aioredis.Redis, outage_workers: Workers, prefix: str
) -> None:
    workers = outage_workers
    queue = Queue(Chaos, aof, prefix=prefix)
    a = await workers.start("a", concurrency=1, **OPTS)
    ready = await queue.add_bulk(
        JobRequest(Chaos.work, Work(n=i, sleep_s=0.15)) for i in range(10)
    )
    delayed = [
        await queue.add(Chaos.work, Work(n=100 + i), delay=1.5 + 0.1 * i) for i in range(2)
    ]
    await workers.wait_for(
        lambda: len(completed_jobs(workers.log)) >= 2, timeout_s=10, what="two jobs done"
    )
    backlog = sum([await aof.xlen(s.stream) for s in workers.keys.shards])
    waiting = sum([await aof.zcard(s.delayed) for s in workers.keys.shards])

    await _outage(aof_server, workers, "a")

    assert backlog >= 5, "the crash was meant to hit a backlog of ready jobs"
    assert waiting == 2, "the crash was meant to hit delayed jobs"
    await workers.wait_for(
        lambda: set(completed_jobs(workers.log)) == {*ready, *delayed},
        timeout_s=RECOVERY_S + 5,
        what="every job completed",
    )
    await workers.wait_for(lambda: workers.drained(aof), timeout_s=5, what="queue drained")
    for job_id in [*ready, *delayed]:
        assert len(workers.log.runs(job_id)) == 1, workers.log.runs(job_id)
    assert await workers.dead_letters(aof) == []
    assert a.alive


async def test_job_in_flight_across_a_redis_restart_is_completed_once_or_reclaimed(
    aof_server: RedisServer, aof: aioredis.Redis, outage_workers: Workers, prefix: str
) -> None:
    workers = outage_workers
    queue = Queue(Chaos, aof, prefix=prefix)
    procs = {c: workers.spawn(c, **OPTS) for c in ("a", "b")}
    for p in procs.values():
        await workers.ready(p)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=1.5))
    first = await workers.wait_record("start", job=job_id, timeout_s=10)
    holder, other = first["consumer"], ({"a", "b"} - {first["consumer"]}).pop()

    down_at = await _outage(aof_server, workers, holder)

    await workers.wait_for(lambda: workers.drained(aof), timeout_s=RECOVERY_S + 5,
                           what="queue drained")
    # An end is reported once the settle's answer is in: a moment after the queue drains.
    first_end = await workers.wait_record("end", job=job_id, consumer=holder, timeout_s=10)
    assert first_end["t"] > down_at, "the job was meant to finish during the outage"
    runs = workers.log.runs(job_id)
    completions = completed_jobs(workers.log)[job_id]
    if len(runs) == 1:
        # The holder's completion, held back through the outage, landed: done once.
        assert [c["consumer"] for c in completions] == [holder]
        assert not workers.log.records("lock_lost")
    else:
        # The other worker reclaimed it first (the holder could not renew through the
        # outage); the holder's late completion was refused, the rerun's counts.
        assert [r["consumer"] for r in runs] == [holder, other]
        assert runs[1]["entry"] == first["entry"]
        assert runs[1]["attempt"] == first["attempt"]
        assert workers.log.records("lock_lost", consumer=holder)
        assert completions[-1]["consumer"] == other
    assert await workers.dead_letters(aof) == []
    assert all(p.alive for p in procs.values())


async def test_own_running_job_is_not_counted_stalled_after_an_outage_longer_than_its_lock(
    aof_server: RedisServer, aof: aioredis.Redis, outage_workers: Workers, prefix: str
) -> None:
    # With max_stalled_count=0 a single redelivery dead-letters the job; a fast stalled
    # check makes the worker's own reclaim run before its renewal thread after the restart.
    workers = outage_workers
    queue = Queue(Chaos, aof, prefix=prefix)
    a = await workers.start("a", lock=LOCK_S, stalled=0.1, max_stalled=0,
                            block_timeout=BLOCK_S)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=OUTAGE_S + 2.0))
    first = await workers.wait_record("start", job=job_id, consumer="a", timeout_s=10)

    await _outage(aof_server, workers, "a")

    async def delivered_once_until_done() -> bool:
        row = await workers.pending_entry(aof, first["shard"], first["entry"])
        if row is None:
            return True
        assert row["consumer"] == b"a"
        assert row["times_delivered"] == 1, "the worker reclaimed its own running job"
        return False

    await workers.wait_for(delivered_once_until_done, timeout_s=RECOVERY_S + 5,
                           what="the job settled")
    assert await workers.dead_letters(aof) == [], "its own running job was buried as stalled"
    end = await workers.wait_record("end", job=job_id, timeout_s=10)
    assert len(workers.log.records("end", job=job_id)) == 1
    assert end["outcome"] == "completed"
    assert not workers.log.records("lock_lost")
    assert await workers.drained(aof)
    assert a.alive
