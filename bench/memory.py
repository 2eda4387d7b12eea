"""Redis memory per waiting job: ``used_memory`` delta over N jobs added with ``add_bulk``."""

from __future__ import annotations

import gc
from typing import Any

import redis

from bench.contract import Bench, payload
from bench.producers import stream_key
from streamq import JobRequest, SyncQueue


def _used(r: redis.Redis) -> int:
    gc.collect()
    return int(r.info("memory")["used_memory"])


def per_waiting_job(url: str, prefix: str, n: int, *, with_job_id: bool = False) -> dict[str, Any]:
    """Memory per waiting job beyond its payload bytes (consumer group created, nothing read).

    ``with_job_id`` gives each job a caller id, which adds its dedup marker key.
    """
    r = redis.Redis.from_url(url)
    try:
        q = SyncQueue(Bench, r, prefix=prefix)
        r.xgroup_create(stream_key(prefix), "streamq", id="0", mkstream=True)
        payload_bytes = 0
        before = _used(r)
        for start in range(0, n, 500):
            items = [payload(i) for i in range(start, min(n, start + 500))]
            payload_bytes += sum(len(p.model_dump_json(by_alias=True)) for p in items)
            q.add_bulk(
                JobRequest(Bench.ping, p, job_id=f"job-{p.n:08d}" if with_job_id else None)
                for p in items
            )
        after = _used(r)
        per_job = (after - before) / n
        return {
            "jobs": n,
            "with_job_id": with_job_id,
            "used_memory_delta": after - before,
            "bytes_per_job": per_job,
            "payload_bytes_per_job": payload_bytes / n,
            "overhead_bytes_per_job": per_job - payload_bytes / n,
        }
    finally:
        r.close()
