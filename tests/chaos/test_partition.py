"""A worker frozen past its lock (GC pause, partition) cannot settle a job it lost (§4 fencing).

SIGSTOP freezes a worker mid-job for longer than lock_duration + stalled_interval; another
worker reclaims the job and runs it. On SIGCONT the stale worker's processor finishes and
its completion is refused: the entry stays pending for its new owner, which completes it.
"""

from __future__ import annotations

import signal
from typing import Any

from streamq import Queue
from tests.chaos.harness import Workers
from tests.support.chaos_app import Chaos, Work

LOCK_S = 1.5
STALLED_S = 0.5


async def test_stale_worker_resumed_after_a_pause_cannot_complete_a_reclaimed_job(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    procs = await workers.start_all("a", "b", lock=LOCK_S, stalled=STALLED_S)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=3.0))
    first = await workers.wait_record("start", job=job_id, timeout_s=10)
    stale = procs.pop(first["consumer"])
    [other] = procs.values()
    stale.signal(signal.SIGSTOP)

    rerun = await workers.wait_record(
        "start", job=job_id, consumer=other.consumer, timeout_s=LOCK_S + STALLED_S + 8
    )
    assert rerun["entry"] == first["entry"]
    stale.signal(signal.SIGCONT)

    # The stale processor sleeps out its 3 s, returns while the other worker still runs the
    # job, and its worker tries to complete it.
    lost = await workers.wait_record("lock_lost", consumer=stale.consumer, timeout_s=10)
    assert lost["count"] == 1
    # Renewal ran at once on SIGCONT and found the job gone, before it returned.
    # The run's end is reported once its settle's answer is in, just after the lock_lost count.
    stale_end = await workers.wait_record("end", job=job_id, consumer=stale.consumer,
                                          timeout_s=10)
    assert len(workers.log.records("end", job=job_id, consumer=stale.consumer)) == 1
    assert stale_end["outcome"] == "lock_lost"
    if not workers.log.records("end", job=job_id, consumer=other.consumer):
        # The usual case: the other worker still runs the job, and its entry is untouched by
        # the stale completion. (With both cores busy the stale worker can take longer to
        # resume than the rerun takes; the outcomes below still prove the fence.)
        pending = await workers.pending_entry(aredis, rerun["shard"], rerun["entry"])
        if not workers.log.records("end", job=job_id, consumer=other.consumer):
            assert pending is not None, "the stale completion acknowledged the new owner's entry"
            assert pending["consumer"] == other.consumer.encode()

    done = await workers.wait_record("end", job=job_id, consumer=other.consumer, timeout_s=10)
    assert done["outcome"] == "completed"
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=5, what="queue drained")
    assert not workers.log.records("lock_lost", consumer=other.consumer)
    assert [r["consumer"] for r in workers.log.runs(job_id)] == [stale.consumer, other.consumer]
    completed = workers.log.records("end", job=job_id, outcome="completed")
    assert [r["consumer"] for r in completed] == [other.consumer]  # counted once, by its owner
    assert await workers.dead_letters(aredis) == []
    assert stale.alive
