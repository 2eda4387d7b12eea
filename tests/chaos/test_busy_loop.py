"""A processor that blocks the event loop keeps its lock (DESIGN.md §4, last paragraph).

Lock renewal runs on its own thread and connection, so a CPU-bound processor that never
yields for twice the lock duration is not mistaken for a dead worker: another worker
process watching for stalled jobs the whole time never reclaims it, and it runs once.
"""

from __future__ import annotations

from typing import Any

from streamq import Queue
from tests.chaos.harness import Workers
from tests.support.chaos_app import Chaos, Work

LOCK_S = 1.5
STALLED_S = 0.3


async def test_job_blocking_the_event_loop_past_its_lock_is_not_reclaimed_and_runs_once(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    await workers.start("a", mode="busy_loop", lock=LOCK_S, stalled=STALLED_S)
    # Five locks long: well past the lock, and long enough for b to start watching while it
    # runs even with both cores busy (starting a worker process can take seconds then).
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=5 * LOCK_S))
    started = await workers.wait_record("start", job=job_id, consumer="a", timeout_s=10)
    b = await workers.start("b", lock=LOCK_S, stalled=STALLED_S)
    assert not workers.log.records("end", job=job_id), "b started too late to watch"

    async def still_owned_by_a_once_delivered() -> bool:
        row = await workers.pending_entry(aredis, started["shard"], started["entry"])
        if row is None:
            return True  # settled
        assert row["consumer"] == b"a", f"the job was reclaimed: {row}"
        assert row["times_delivered"] == 1, f"the job was redelivered: {row}"
        return False

    await workers.wait_for(
        still_owned_by_a_once_delivered, timeout_s=10 * LOCK_S, what="the job settled"
    )
    # The run's end is reported once Redis confirmed the settle: right after, not before.
    end = await workers.wait_record("end", job=job_id, timeout_s=5)
    assert len(workers.log.records("end", job=job_id)) == 1
    assert end["consumer"] == "a"
    assert end["outcome"] == "completed"
    assert end["duration_s"] >= 5 * LOCK_S
    assert len(workers.log.runs(job_id)) == 1
    assert not workers.log.records("reclaimed")
    assert not workers.log.records("lock_lost")
    assert await workers.drained(aredis)
    assert b.alive
