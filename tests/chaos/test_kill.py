"""SIGKILL of a worker process at any point loses no job (DESIGN.md §5, §6).

A killed worker's jobs stay pending under its consumer name; another worker reclaims them
once they have been idle longer than the lock, with ``attempt`` unchanged and the delivery
count raised by one. A job that keeps stalling is dead-lettered as ``stalled``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from streamq import JobRequest, Queue
from tests.chaos.harness import Workers, completed_jobs, env_int
from tests.support.chaos_app import Chaos, Work

LOCK_S = 1.5
STALLED_S = 0.5
SLACK_S = 1.5
"""Scheduling and process start-up noise on a loaded CI machine."""

OPTS = {"lock": LOCK_S, "stalled": STALLED_S}


async def test_killed_workers_job_is_finished_by_another_worker_with_attempt_unchanged(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    procs = await workers.start_all("a", "b", **OPTS)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=2.0))
    first = await workers.wait_record("start", job=job_id, timeout_s=10)
    victim = procs.pop(first["consumer"])
    [other] = procs.values()

    killed_at = victim.kill()

    rerun = await workers.wait_record(
        "start", job=job_id, consumer=other.consumer,
        timeout_s=LOCK_S + STALLED_S + SLACK_S + 5,
    )
    assert rerun["t"] - killed_at <= LOCK_S + STALLED_S + SLACK_S
    assert rerun["attempt"] == first["attempt"] == 1
    assert rerun["entry"] == first["entry"], "a reclaim keeps the stream entry"
    pending = await workers.pending_entry(aredis, rerun["shard"], rerun["entry"])
    assert pending is not None
    assert pending["consumer"] == other.consumer.encode()
    assert pending["times_delivered"] == 2

    done = await workers.wait_record("end", job=job_id, consumer=other.consumer, timeout_s=10)
    assert done["outcome"] == "completed"
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=5, what="queue drained")
    assert sum(r["count"] for r in workers.log.records("reclaimed", consumer=other.consumer)) == 1
    assert await workers.dead_letters(aredis) == []


async def _kill_mid_batch_and_restart(
    workers: Workers, queue: Queue[Chaos], aredis: Any, *, jobs: int, kills: int, seed: int
) -> None:
    """Run ``jobs`` over two workers; SIGKILL one mid-job ``kills`` times, restarting it.

    Proves: every job completes; a job runs twice only when it was in flight in a killed
    worker (started there and not yet acknowledged), and its rerun is a reclaim of the
    same entry with the same attempt.

    A run's ``end`` is written once Redis confirmed its settle, so a kill between Redis
    applying a complete and the worker reading the reply leaves a job acknowledged without
    an ``end``. Such a job counts as completed only when its last run was in a killed worker,
    had its full length before the kill, and Redis no longer holds the entry anywhere.
    """
    try:
        await _run_batch(workers, queue, aredis, jobs=jobs, kills=kills, rng=random.Random(seed))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(replay with STREAMQ_CHAOS_SEED={seed})") from None


async def _run_batch(
    workers: Workers, queue: Queue[Chaos], aredis: Any, *, jobs: int, kills: int,
    rng: random.Random,
) -> None:
    # A job in flight at two kills in a row is rightly dead-lettered as stalled; this test
    # is about loss, so allow as many redeliveries as there are kills.
    opts = {**OPTS, "concurrency": 6, "max_stalled": kills}
    victim = (await workers.start_all("v0", "steady", **opts))["v0"]
    work = [Work(n=i, sleep_s=rng.uniform(0.02, 0.12)) for i in range(jobs)]
    # The batch goes in one slice per victim, each added once that victim is ready: were it
    # all added at once, the steady worker could finish it while a restarted victim is still
    # starting up (seconds on a loaded machine), and that victim would never be busy to kill.
    edges = [jobs * k // (kills + 1) for k in range(kills + 2)]
    ids: list[str] = []
    kill_times: dict[str, float] = {}
    for k in range(kills + 1):
        ids += await queue.add_bulk(
            JobRequest(Chaos.work, w) for w in work[edges[k]:edges[k + 1]]
        )
        if k == kills:
            break
        target = rng.randint(edges[k] + 1, edges[k + 1])

        def victim_busy(name: str = victim.consumer, at_least: int = target) -> bool:
            started = len(workers.log.records("start"))
            starts = {r["job"] for r in workers.log.records("start", consumer=name)}
            ends = {r["job"] for r in workers.log.records("end", consumer=name)}
            return started >= at_least and bool(starts - ends)

        await workers.wait_for(victim_busy, timeout_s=60, what=f"kill point {target}")
        kill_times[victim.consumer] = victim.kill()
        victim = await workers.start(f"v{k + 1}", **opts)

    sleep_s = {job_id: w.sleep_s for job_id, w in zip(ids, work, strict=True)}

    def acked_at_a_kill(job_id: str) -> bool:
        """Its last run was in a killed worker and had its full length before the kill."""
        runs = workers.log.runs(job_id)
        killed_at = kill_times.get(runs[-1]["consumer"]) if runs else None
        return killed_at is not None and runs[-1]["t"] + sleep_s[job_id] <= killed_at

    # Nothing ready, in flight (a killed worker's entries stay pending until reclaimed) or
    # delayed; then every job accounted for in the run-log.
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=60, what="queue drained")

    def all_accounted_for() -> bool:
        done = completed_jobs(workers.log)
        return all(j in done or acked_at_a_kill(j) for j in ids)

    await workers.wait_for(all_accounted_for, timeout_s=30, what=f"all {jobs} jobs completed")
    assert set(completed_jobs(workers.log)) <= set(ids)
    assert await workers.dead_letters(aredis) == []

    for job_id in ids:
        runs = workers.log.runs(job_id)
        *killed_runs, last = runs
        for run in killed_runs:
            # Every run but the last was cut short by a kill: started before it, in the
            # killed worker, and rerun as a reclaim of the same entry with the same attempt.
            killed_at = kill_times.get(run["consumer"])
            assert killed_at is not None, f"job {job_id} ran again without a kill: {runs}"
            assert run["t"] < killed_at
            assert (run["entry"], run["attempt"]) == (last["entry"], last["attempt"])
            # Acknowledged work is never redone. The runtime reports a run completed only
            # once Redis confirmed its complete, so no run reported completed is followed by
            # another, however long before the kill it ended (no timing bound needed).
            acked = workers.log.records(
                "end", job=job_id, consumer=run["consumer"], outcome="completed"
            )
            assert not acked, (
                f"job {job_id} completed in {run['consumer']} yet ran again: {runs}"
            )
        # The run that completed is the last one, and it completed exactly once.
        reported = completed_jobs(workers.log).get(job_id, [])
        if not reported:
            assert acked_at_a_kill(job_id), runs  # drained: Redis acknowledged it
            continue
        [done] = reported
        assert (done["consumer"], done["entry"]) == (last["consumer"], last["entry"]), runs


def _seed() -> int:
    """A fresh seed per run (STREAMQ_CHAOS_SEED replays one); failures print it."""
    return env_int("STREAMQ_CHAOS_SEED", int(time.time()))


async def test_no_job_is_lost_when_a_worker_is_killed_mid_batch_and_restarted(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    await _kill_mid_batch_and_restart(
        workers, queue, aredis, jobs=200, kills=1, seed=_seed()
    )


@pytest.mark.slow
async def test_no_job_is_lost_over_repeated_kills_and_restarts(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    # STREAMQ_SOAK scales it; the default is the bounded form CI runs.
    soak = env_int("STREAMQ_SOAK", 1)
    await _kill_mid_batch_and_restart(
        workers, queue, aredis, jobs=300 * soak, kills=2 + soak, seed=_seed()
    )


async def test_job_stalled_more_than_max_stalled_count_is_dead_lettered_as_stalled(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    procs = await workers.start_all("a", "b", "c", **OPTS, max_stalled=1)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=60))
    first = await workers.wait_record("start", job=job_id, timeout_s=10)
    stalled_in = [procs.pop(first["consumer"])]

    stalled_in[0].kill()  # stall 1: reclaimed and run again
    second = await workers.wait_for(
        lambda: workers.log.runs(job_id)[1:],
        timeout_s=LOCK_S + STALLED_S + SLACK_S + 5,
        what="the first reclaim",
    )
    stalled_in.append(procs.pop(second[0]["consumer"]))
    [survivor] = procs.values()
    stalled_in[1].kill()  # stall 2: more than max_stalled_count, so dead-lettered

    dead = await workers.wait_for(
        lambda: workers.dead_letters(aredis),
        timeout_s=LOCK_S + STALLED_S + SLACK_S + 5,
        what="the stalled job in dead",
    )
    assert len(dead) == 1
    assert dead[0]["id"] == job_id
    assert dead[0]["reason"] == "stalled"
    assert [r["consumer"] for r in workers.log.runs(job_id)] == [p.consumer for p in stalled_in]
    assert await workers.drained(aredis)
    assert workers.log.records("dead", consumer=survivor.consumer, reason="stalled")
    assert survivor.alive
