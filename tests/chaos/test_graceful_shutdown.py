"""SIGTERM/SIGINT shut a worker down gracefully (DESIGN.md §4 release, §2 close_workers).

Running jobs shorter than the shutdown timeout finish and are acknowledged; longer ones
are released (re-added at the stream tail, attempt unchanged), so another worker takes them
at once instead of after the lock expires. The process exits 0 and leaves the consumer
group when it holds nothing.
"""

from __future__ import annotations

import signal
from typing import Any

from streamq import Queue
from tests.chaos.harness import Workers, completed_jobs
from tests.support.chaos_app import Chaos, Work

SHUTDOWN_S = 3.0
LOCK_S = 15.0
"""Long enough that no reclaim can explain a fast takeover: only a release can."""
SLACK_S = 3.0
"""Scheduling delay on a loaded machine (two CPU hogs on two cores), for the bounds that
prove promptness. Each bound stays well under LOCK_S, so it still tells a release from a
reclaim; waits on conditions use generous deadlines instead."""


async def test_sigterm_finishes_short_jobs_and_releases_long_ones_to_another_worker(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    opts = {"lock": LOCK_S, "stalled": 0.5, "concurrency": 4, "shutdown_timeout": SHUTDOWN_S}
    a = await workers.start("a", **opts)
    # The short ones last, so they start last: the signal must find them still running.
    long = [await queue.add(Chaos.work, Work(n=10 + i, sleep_s=60)) for i in range(2)]
    short = [await queue.add(Chaos.work, Work(n=i, sleep_s=1.5)) for i in range(2)]
    await workers.wait_for(
        lambda: len(workers.log.records("start", consumer="a")) == 4,
        timeout_s=30,
        what="all four jobs running in a",
    )
    # Not waited for: b starts while a shuts down (under load a Python start-up can outlast
    # the short jobs).
    b = workers.spawn("b", **opts)

    sent = a.signal(signal.SIGTERM)

    assert await a.wait_exit(SHUTDOWN_S + 30) == 0, workers.diagnostics([a])
    exited = workers.log.records("exit", consumer="a")
    assert exited
    assert exited[0]["signal"] == "SIGTERM"
    for job_id in short:
        [end] = workers.log.records("end", job=job_id)
        assert end["consumer"] == "a"
        assert end["outcome"] == "completed"
        assert end["t"] > sent, "the short job was still running when the signal came"
    await workers.ready(b, timeout_s=30)
    [b_ready] = workers.log.records("ready", consumer="b")
    for job_id in long:
        [before] = workers.log.records("start", job=job_id, consumer="a")
        [released] = workers.log.records("end", job=job_id, consumer="a")
        assert released["outcome"] == "released"
        assert released["duration_s"] >= SHUTDOWN_S
        assert released["t"] - sent >= SHUTDOWN_S, "released before the shutdown timeout"
        taken = await workers.wait_record("start", job=job_id, consumer="b", timeout_s=LOCK_S)
        # b takes it as soon as it is both released and b is up: b's start-up under load is
        # no part of what is proved, and LOCK_S bounds the whole: no reclaim explains it.
        assert taken["t"] - max(released["t"], b_ready["t"]) < SLACK_S
        assert taken["t"] - sent < LOCK_S
        assert taken["attempt"] == before["attempt"] == 1
        assert taken["entry"] != before["entry"], "a released job is a new entry"
        pending = await workers.pending_entry(aredis, taken["shard"], taken["entry"])
        assert pending is not None
        assert pending["consumer"] == b"b"
        assert pending["times_delivered"] == 1
    assert not workers.log.records("reclaimed")
    assert "a" not in await workers.consumers(aredis)
    assert len(workers.log.records("start")) == 6  # 4 in a, the 2 released ones in b
    assert set(completed_jobs(workers.log)) == set(short)
    for s in workers.keys.shards:
        assert await aredis.xlen(s.stream) == len(
            [r for r in workers.log.records("start", consumer="b") if r["shard"] == s.name]
        )


async def test_sigint_waits_only_for_running_jobs_then_exits(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    timeout_s = 30.0
    a = await workers.start("a", lock=1.5, stalled=0.5, concurrency=2,
                            shutdown_timeout=timeout_s)
    ids = [await queue.add(Chaos.work, Work(n=i, sleep_s=1.5)) for i in range(2)]
    await workers.wait_for(
        lambda: len(workers.log.records("start", consumer="a")) == 2,
        timeout_s=30,
        what="both jobs running",
    )

    sent = a.signal(signal.SIGINT)

    assert await a.wait_exit(timeout_s) == 0, workers.diagnostics([a])
    [exited] = workers.log.records("exit", consumer="a")
    assert exited["signal"] == "SIGINT"
    for job_id in ids:
        [end] = workers.log.records("end", job=job_id)
        assert end["outcome"] == "completed"
        assert end["t"] > sent, "the job was still running when the signal came"
    # The jobs had at most 1.5 s left; the shutdown timeout is 30 s.
    assert exited["t"] - sent < 1.5 + SLACK_S < timeout_s, (
        "shutdown waited for its timeout, not for the jobs"
    )
    assert set(completed_jobs(workers.log)) == set(ids)
    assert await workers.drained(aredis)
    assert "a" not in await workers.consumers(aredis)


async def test_sigterm_releases_a_sync_job_past_the_timeout_to_another_worker(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    shutdown_s, job_s = 1.0, 3.0
    opts = {"lock": LOCK_S, "stalled": 0.5, "shutdown_timeout": shutdown_s, "mode": "slow"}
    # Both up before the job exists: whichever takes it, the signal then comes at once, so
    # the job (3 s) is still far from done when the shutdown timeout (1 s) runs out.
    procs = await workers.start_all("a", "b", **opts)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=job_s))
    first = await workers.wait_record("start", job=job_id, timeout_s=30)
    holder = procs.pop(first["consumer"])
    [other] = procs.values()

    sent = holder.signal(signal.SIGTERM)

    taken = await workers.wait_record("start", job=job_id, consumer=other.consumer,
                                      timeout_s=LOCK_S)
    # Reported once Redis confirmed the release: the other worker may have started it first.
    released = await workers.wait_record("end", job=job_id, consumer=holder.consumer,
                                         timeout_s=30)
    assert released["outcome"] == "released"
    assert released["t"] - sent >= shutdown_s, "released before the shutdown timeout"
    assert released["t"] - sent < shutdown_s + SLACK_S, "released at the shutdown timeout"
    assert taken["t"] - released["t"] < SLACK_S
    assert taken["t"] - sent < LOCK_S
    assert taken["entry"] != first["entry"], "a released job is a new entry"
    assert taken["attempt"] == first["attempt"]
    # A thread cannot be stopped: the process exits once the abandoned sync call returns,
    # its result ignored (the job is the other worker's now).
    assert await holder.wait_exit(job_s + 30) == 0, workers.diagnostics([holder])
    assert workers.log.records("end", job=job_id, consumer=holder.consumer) == [released]
    done = await workers.wait_record("end", job=job_id, consumer=other.consumer,
                                     timeout_s=job_s + 30)
    assert done["outcome"] == "completed"
    assert not workers.log.records("reclaimed")
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=30, what="queue drained")
