"""Producer throughput: raw redis-py XADD against streamq's ``add`` and ``add_bulk``.

Every raw baseline adds an entry of the same shape as streamq's envelope (the same fields,
the same payload bytes), so the difference is what streamq does on top: validation,
encoding, sharding, dedup and the atomic script.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import stats
from bench.contract import Bench, Ping, payload
from streamq import JobRequest, Queue, SyncQueue
from streamq.keys import ShardKeys

WARMUP = 200


def stream_key(prefix: str) -> str:
    return ShardKeys(prefix, Bench.queue_name, 0).stream


def template_fields(url: str, prefix: str) -> dict[bytes, bytes]:
    """The stream fields of one real streamq job (added, read back, then deleted)."""
    r = redis.Redis.from_url(url)
    try:
        SyncQueue(Bench, r, prefix=prefix).add(Bench.ping, payload(1))
        key = stream_key(prefix)
        entries: Any = r.xrange(key, count=1)
        r.delete(key)
        return dict(entries[0][1])
    finally:
        r.close()


def _result(n: int, seconds: float, cost: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": n, "seconds": seconds, "rate": n / seconds, **cost}


def _frozen() -> None:
    # The payloads built before timing are many live objects: without this, every full
    # collection during the run would walk them all, taxing whichever side allocates more.
    gc.collect()
    gc.freeze()


def _measure_sync(url: str, key: str, n: int, run: Callable[[int], None]) -> dict[str, Any]:
    sr = redis.Redis.from_url(url)
    try:
        run(WARMUP)
        sr.delete(key)
        _frozen()
        before = stats.snapshot(sr)
        t0 = time.perf_counter()
        run(n)
        dt = time.perf_counter() - t0
        after = stats.snapshot(sr)
        sr.delete(key)
        return _result(n, dt, stats.cost(before, after, n))
    finally:
        gc.unfreeze()
        sr.close()


async def _measure_async(url: str, key: str, n: int, run: Any) -> dict[str, Any]:
    sr = redis.Redis.from_url(url)
    try:
        await run(WARMUP)
        sr.delete(key)
        _frozen()
        before = stats.snapshot(sr)
        t0 = time.perf_counter()
        await run(n)
        dt = time.perf_counter() - t0
        after = stats.snapshot(sr)
        sr.delete(key)
        return _result(n, dt, stats.cost(before, after, n))
    finally:
        gc.unfreeze()
        sr.close()


def _payloads(n: int) -> list[Ping]:
    # Built before timing: constructing the model is the caller's work, not the queue's.
    return [payload(i) for i in range(n)]


# -- raw redis-py ------------------------------------------------------------------------------
def raw_xadd_sync(url: str, prefix: str, fields: dict[bytes, bytes], n: int) -> dict[str, Any]:
    key = stream_key(prefix)
    r = redis.Redis.from_url(url)

    def run(k: int) -> None:
        for _ in range(k):
            r.xadd(key, fields)  # type: ignore[arg-type]

    try:
        return _measure_sync(url, key, n, run)
    finally:
        r.close()


def raw_pipe_sync(
    url: str, prefix: str, fields: dict[bytes, bytes], n: int, batch: int
) -> dict[str, Any]:
    key = stream_key(prefix)
    r = redis.Redis.from_url(url)

    def run(k: int) -> None:
        for start in range(0, k, batch):
            with r.pipeline(transaction=False) as p:
                for _ in range(min(batch, k - start)):
                    p.xadd(key, fields)  # type: ignore[arg-type]
                p.execute()

    try:
        return _measure_sync(url, key, n, run)
    finally:
        r.close()


async def raw_xadd_async(
    url: str, prefix: str, fields: dict[bytes, bytes], n: int
) -> dict[str, Any]:
    key = stream_key(prefix)
    r = aioredis.Redis.from_url(url)

    async def run(k: int) -> None:
        for _ in range(k):
            await r.xadd(key, fields)  # type: ignore[arg-type]

    try:
        return await _measure_async(url, key, n, run)
    finally:
        await r.aclose()


async def raw_pipe_async(
    url: str, prefix: str, fields: dict[bytes, bytes], n: int, batch: int
) -> dict[str, Any]:
    key = stream_key(prefix)
    r = aioredis.Redis.from_url(url)

    async def run(k: int) -> None:
        for start in range(0, k, batch):
            async with r.pipeline(transaction=False) as p:
                for _ in range(min(batch, k - start)):
                    p.xadd(key, fields)  # type: ignore[arg-type]
                await p.execute()

    try:
        return await _measure_async(url, key, n, run)
    finally:
        await r.aclose()


# -- streamq -----------------------------------------------------------------------------------
def sq_add_sync(url: str, prefix: str, n: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    q = SyncQueue(Bench, r, prefix=prefix)
    items = _payloads(max(n, WARMUP))

    def run(k: int) -> None:
        add, spec = q.add, Bench.ping
        for i in range(k):
            add(spec, items[i])

    try:
        return _measure_sync(url, stream_key(prefix), n, run)
    finally:
        r.close()


def sq_bulk_sync(url: str, prefix: str, n: int, batch: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    q = SyncQueue(Bench, r, prefix=prefix)
    items = _payloads(max(n, WARMUP))

    def run(k: int) -> None:
        for start in range(0, k, batch):
            q.add_bulk(JobRequest(Bench.ping, p) for p in items[start : min(k, start + batch)])

    try:
        return _measure_sync(url, stream_key(prefix), n, run)
    finally:
        r.close()


async def sq_add_async(url: str, prefix: str, n: int) -> dict[str, Any]:
    r = aioredis.Redis.from_url(url)
    q = Queue(Bench, r, prefix=prefix)
    items = _payloads(max(n, WARMUP))

    async def run(k: int) -> None:
        add, spec = q.add, Bench.ping
        for i in range(k):
            await add(spec, items[i])

    try:
        return await _measure_async(url, stream_key(prefix), n, run)
    finally:
        await r.aclose()


async def sq_bulk_async(url: str, prefix: str, n: int, batch: int) -> dict[str, Any]:
    r = aioredis.Redis.from_url(url)
    q = Queue(Bench, r, prefix=prefix)
    items = _payloads(max(n, WARMUP))

    async def run(k: int) -> None:
        for start in range(0, k, batch):
            await q.add_bulk(
                JobRequest(Bench.ping, p) for p in items[start : min(k, start + batch)]
            )

    try:
        return await _measure_async(url, stream_key(prefix), n, run)
    finally:
        await r.aclose()


def run_all(url: str, prefix: str, *, one_n: int, bulk_n: int, batch: int) -> dict[str, Any]:
    """Every producer figure, raw and streamq, on the same Redis."""
    fields = template_fields(url, prefix)
    out: dict[str, Any] = {"batch": batch, "entry_fields": len(fields)}
    out["raw_xadd_sync"] = raw_xadd_sync(url, prefix, fields, one_n)
    out["sq_add_sync"] = sq_add_sync(url, prefix, one_n)
    out["raw_xadd_async"] = asyncio.run(raw_xadd_async(url, prefix, fields, one_n))
    out["sq_add_async"] = asyncio.run(sq_add_async(url, prefix, one_n))
    out["raw_pipe_sync"] = raw_pipe_sync(url, prefix, fields, bulk_n, batch)
    out["sq_bulk_sync"] = sq_bulk_sync(url, prefix, bulk_n, batch)
    out["raw_pipe_async"] = asyncio.run(raw_pipe_async(url, prefix, fields, bulk_n, batch))
    out["sq_bulk_async"] = asyncio.run(sq_bulk_async(url, prefix, bulk_n, batch))
    return out
