"""Status across a SIGKILL: a tracked job of a killed worker process reads ``active`` under
that worker, then under the worker that reclaims it, then ``completed``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from streamq import Queue
from tests.chaos.harness import Workers
from tests.runtime.support import wait_until
from tests.support.chaos_app import Chaos, Work

LOCK_S = 1.5
STALLED_S = 0.5


async def test_status_follows_a_tracked_job_from_a_killed_worker_to_its_reclaimer(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    procs = await workers.start_all("a", "b", lock=LOCK_S, stalled=STALLED_S)
    job_id = await queue.add(Chaos.work, Work(n=1, sleep_s=3.0),
                             keep_result=timedelta(minutes=1))
    first = await workers.wait_record("start", job=job_id, timeout_s=10)
    victim = procs.pop(first["consumer"])
    [other] = procs.values()
    st = await queue.status(job_id)
    assert (st.state, st.consumer) == ("active", victim.consumer)

    victim.kill()
    await workers.wait_record("start", job=job_id, consumer=other.consumer, timeout_s=15)

    async def under_the_reclaimer() -> bool:
        s = await queue.status(job_id)
        return (s.state, s.consumer) == ("active", other.consumer) and s.since_ms is not None

    # The reclaimer records its own start with its next lock renewal.
    await wait_until(under_the_reclaimer, timeout_s=10, what="the reclaimer's start")
    await workers.wait_record("end", job=job_id, consumer=other.consumer, timeout_s=15)
    st = await queue.status(job_id)
    assert (st.state, st.attempt, st.result_json) == ("completed", 1, None)
    assert await queue.result(job_id, timeout=1) is None
