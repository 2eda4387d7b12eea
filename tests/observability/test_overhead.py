"""The overhead measurement stays runnable (a small run; the figures come from the full one:
``python -m tests.observability.overhead``)."""

from __future__ import annotations

import os

from tests.observability.overhead import MODES, measure
from tests.support.redis_server import RedisServer


async def test_overhead_measurement_runs_every_mode(redis_server: RedisServer) -> None:
    jobs = int(os.environ.get("STREAMQ_SOAK", "200"))
    out = await measure(redis_server.url, jobs=jobs, concurrency=50, rounds=1)
    assert set(out) == {m.name for m in MODES}
    assert out["off"]["process_cpu_us_added"] == 0
    assert all(v["process_jobs_per_s"] > 0 for v in out.values())
