"""A producer in its own process, for consumer runs with a producer running concurrently.

Protocol on stdin/stdout: prints ``ready``, waits for a ``go`` line, produces, then prints one
JSON line with what it did.

- ``--mode bulk``: ``add_bulk`` in batches as fast as it can (throughput runs).
- ``--mode rate``: one ``add`` at a time at ``--rate`` jobs/s, each payload carrying its
  ``sent_at`` wall-clock time (latency runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import redis.asyncio as aioredis

from bench.contract import Bench, payload
from streamq import JobRequest, Queue


async def bulk(q: Queue[Bench], n: int, batch: int) -> None:
    for start in range(0, n, batch):
        await q.add_bulk(
            JobRequest(Bench.ping, payload(i)) for i in range(start, min(n, start + batch))
        )


async def paced(q: Queue[Bench], n: int, rate: float) -> None:
    t0 = time.monotonic()
    for i in range(n):
        wait = t0 + i / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await q.add(Bench.ping, payload(i, sent_at=time.time()))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--mode", choices=["bulk", "rate"], default="bulk")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rate", type=float, default=200.0)
    a = ap.parse_args()
    r = aioredis.Redis.from_url(a.url)
    q = Queue(Bench, r, prefix=a.prefix)
    await r.ping()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = time.perf_counter()
    if a.mode == "bulk":
        await bulk(q, a.n, a.batch)
    else:
        await paced(q, a.n, a.rate)
    dt = time.perf_counter() - t0
    await r.aclose()
    print(json.dumps({"jobs": a.n, "seconds": dt, "rate": a.n / dt}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
