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
    opts = {"lock": LOCK_S, "stalled": STALLED_S}
    a = await workers.start("a", **opts)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=3.0))
    first = await workers.wait_record("start", job=job_id, consumer="a", timeout_s=10)
    a.signal(signal.SIGSTOP)
    await workers.start("b", **opts)

    rerun = await workers.wait_record(
        "start", job=job_id, consumer="b", timeout_s=LOCK_S + STALLED_S + 8
    )
    assert rerun["entry"] == first["entry"]
    a.signal(signal.SIGCONT)

    # a's processor has long run out its 3 s: it returns at once and a tries to complete.
    lost = await workers.wait_record("lock_lost", consumer="a", timeout_s=10)
    assert lost["count"] == 1
    # Renewal ran at once on SIGCONT and found the job gone, well before it returned.
    [stale_end] = workers.log.records("end", job=job_id, consumer="a")
    assert stale_end["outcome"] == "lock_lost"
    assert not workers.log.records("end", job=job_id, consumer="b"), "b was meant to be busy"
    pending = await workers.pending_entry(aredis, rerun["shard"], rerun["entry"])
    assert pending is not None, "the stale completion acknowledged the new owner's entry"
    assert pending["consumer"] == b"b"

    done = await workers.wait_record("end", job=job_id, consumer="b", timeout_s=10)
    assert done["outcome"] == "completed"
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=5, what="queue drained")
    assert not workers.log.records("lock_lost", consumer="b")
    assert [r["consumer"] for r in workers.log.runs(job_id)] == ["a", "b"]
    assert await workers.dead_letters(aredis) == []
    assert a.alive
