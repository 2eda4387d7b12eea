"""Small helpers shared by the script tests: keys, groups, reads and Redis state probes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from streamq import ops
from streamq._redis import Call, run_calls
from streamq.envelope import encode_fields
from streamq.keys import QueueKeys, ShardKeys
from tests.support.redis_server import RedisServer, find_binary

GROUP = "g"
QUEUE = "q"


def shard(prefix: str, queue: str = QUEUE, index: int = 0) -> ShardKeys:
    return ShardKeys(prefix, queue, index)


def queue_keys(prefix: str, queue: str = QUEUE, shards: int = 1) -> QueueKeys:
    return QueueKeys(prefix, queue, shards)


def job_values(
    job_id: str, *, name: str = "work", attempt: int = 1, ts: int = 1
) -> list[str | bytes]:
    return encode_fields(
        job_id=job_id,
        name=name,
        timestamp_ms=ts,
        payload_json=f'{{"n":"{job_id}"}}',
        attempt=attempt,
    )


def item(job_id: str, *, delay_ms: int = 0, dedup: bool = False, **kw: Any) -> ops.EnqueueItem:
    return ops.EnqueueItem(job_id, job_values(job_id, **kw), delay_ms=delay_ms, dedup=dedup)


async def run1(r: Any, call: Call) -> Any:
    return (await run_calls(r, [call]))[0]


async def make_group(r: Any, sk: ShardKeys, group: str = GROUP) -> None:
    await r.execute_command("XGROUP", "CREATE", sk.stream, group, "0", "MKSTREAM")


async def enqueue(r: Any, sk: ShardKeys, *job_ids: str, window_ms: int = 60_000) -> list[bool]:
    return await run1(r, ops.enqueue(sk, [item(j) for j in job_ids], dedup_window_ms=window_ms))  # type: ignore[no-any-return]


@dataclass
class Entry:
    id: str
    fields: dict[str, str]


def _fields(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        items = list(flat.items())
    else:
        items = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    return {_s(k): _s(v) for k, v in items}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def read(
    r: Any, sk: ShardKeys, consumer: str, count: int = 100, group: str = GROUP
) -> list[Entry]:
    """XREADGROUP new entries as ``consumer`` (enters the PEL)."""
    reply = await r.xreadgroup(group, consumer, {sk.stream: ">"}, count=count)
    if not reply:
        return []
    return [Entry(_s(eid), _fields(f)) for eid, f in reply[0][1]]


async def xrange(r: Any, key: str) -> list[Entry]:
    return [Entry(_s(eid), _fields(f)) for eid, f in await r.xrange(key)]


async def raw_fields(r: Any, key: str) -> list[list[str]]:
    """Each entry's field names in stream order (redis-py keeps the order in its dict)."""
    return [[_s(k) for k in flat] for _eid, flat in await r.xrange(key)]


@dataclass
class Pending:
    consumer: str
    deliveries: int
    idle_ms: int


async def pending(r: Any, sk: ShardKeys, group: str = GROUP) -> dict[str, Pending]:
    rows = await r.xpending_range(sk.stream, group, "-", "+", 10_000)
    return {
        _s(p["message_id"]): Pending(
            _s(p["consumer"]), int(p["times_delivered"]), int(p["time_since_delivered"])
        )
        for p in rows
    }


async def server_ms(r: Any) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def wait_until(
    pred: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


async def wait_idle(
    r: Any, sk: ShardKeys, ids: Sequence[str], min_idle_ms: int, group: str = GROUP
) -> None:
    """Wait until every entry in ``ids`` has been idle at least ``min_idle_ms`` (PEL clock)."""

    async def idle() -> bool:
        p = await pending(r, sk, group)
        return all(p[i].idle_ms >= min_idle_ms for i in ids)

    await wait_until(idle, what=f"entries idle >= {min_idle_ms} ms")


async def delivered(r: Any, sk: ShardKeys, consumer: str, *job_ids: str) -> list[Entry]:
    """A fresh group, ``job_ids`` enqueued and read by ``consumer``: entries pending for it."""
    await make_group(r, sk)
    await enqueue(r, sk, *job_ids)
    entries = await read(r, sk, consumer, count=len(job_ids))
    assert [e.fields["id"] for e in entries] == list(job_ids)
    return entries


async def steal(r: Any, sk: ShardKeys, consumer: str) -> list[str]:
    """Another worker reclaims every pending entry (as after a lock expiry)."""
    call = ops.reclaim(
        sk, GROUP, consumer, min_idle_ms=0, count=10_000, max_stalled_count=10, dead_cap=0
    )
    page = await run1(r, call)
    return [e.entry_id for e in page.entries]


def token() -> str:
    """A fresh settle token (the runtime makes one per call)."""
    return uuid.uuid4().hex


async def starts(r: Any, sk: ShardKeys) -> dict[str, int]:
    """The stall budget: entry id -> runs started without a settle (absent = 1)."""
    return {_s(k): int(v) for k, v in (await r.hgetall(sk.starts)).items()}


@asynccontextmanager
async def own_redis() -> AsyncIterator[aioredis.Redis]:
    """A redis-server of this test's own (noeviction), for tests that change its config."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
    client = aioredis.Redis(port=server.port)
    try:
        yield client
    finally:
        await client.aclose()
        server.stop(kill=True)


async def out_of_memory(r: aioredis.Redis) -> None:
    """Pin maxmemory well below what is in use: every write that can grow memory is refused
    (noeviction) while reads, XACK, XDEL and HDEL still run."""
    used = int((await r.info("memory"))["used_memory"])
    await r.config_set("maxmemory", used - 256 * 1024)
    try:
        await r.set("probe", "x")
    except OutOfMemoryError:
        return
    raise AssertionError("redis still accepts writes")
