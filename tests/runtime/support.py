"""Helpers of the runtime tests: waiting on conditions, server time, recording hooks,
reading dead letters and pending entries."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamq.hooks import Hooks, JobInfo
from streamq.keys import QueueKeys, ShardKeys


def s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def wait_until(
    pred: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``pred`` (sync or async) until true; fail loudly after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def server_ms(r: Any) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


def keys(prefix: str, lane: str, shards: int = 1) -> QueueKeys:
    return QueueKeys(prefix, lane, shards)


async def dead_entries(r: Any, qk: QueueKeys) -> list[dict[str, str]]:
    """Every dead letter of every shard of a lane, fields decoded, with ``_shard``."""
    out: list[dict[str, str]] = []
    for sk in qk.shards:
        for _eid, flat in await r.xrange(sk.dead):
            d = {s(k): s(v) for k, v in flat.items()}
            d["_shard"] = sk.name
            out.append(d)
    return out


async def stream_entries(r: Any, sk: ShardKeys) -> list[tuple[str, dict[str, str]]]:
    rows = await r.xrange(sk.stream)
    return [(s(eid), {s(k): s(v) for k, v in flat.items()}) for eid, flat in rows]


@dataclass
class PendingRow:
    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int


async def pending(r: Any, sk: ShardKeys, group: str = "streamq") -> list[PendingRow]:
    rows = await r.xpending_range(sk.stream, group, "-", "+", 10_000)
    return [
        PendingRow(s(p["message_id"]), s(p["consumer"]), int(p["time_since_delivered"]),
                   int(p["times_delivered"]))
        for p in rows
    ]


async def consumers(r: Any, sk: ShardKeys, group: str = "streamq") -> dict[str, int]:
    """Consumer name -> pending count."""
    rows = await r.xinfo_consumers(sk.stream, group)
    return {s(c["name"]): int(c["pending"]) for c in rows}


@dataclass
class RecordingHooks(Hooks):
    """Counts every hook call it gets (thread-safe); keeps finished attempts."""

    counts: Counter[str] = field(default_factory=Counter)
    finished: list[tuple[JobInfo, str, BaseException | None]] = field(default_factory=list)
    dead: list[tuple[str, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def job_finished(
        self, job: JobInfo, outcome: str, duration_s: float, error: BaseException | None = None
    ) -> None:
        with self._lock:
            self.finished.append((job, outcome, error))
            self.counts[f"finished:{outcome}"] += 1

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: str) -> None:
        with self._lock:
            self.dead.append((queue, job_name, reason))
            self.counts[f"dead:{reason}"] += 1

    def lock_lost(self, queue: str, shard: str, count: int) -> None:
        with self._lock:
            self.counts["lock_lost"] += count

    def jobs_reclaimed(self, queue: str, shard: str, count: int) -> None:
        with self._lock:
            self.counts["reclaimed"] += count

    def promoted(self, queue: str, shard: str, count: int) -> None:
        with self._lock:
            self.counts["promoted"] += count

    def job_started(self, job: JobInfo) -> None:
        with self._lock:
            self.counts["started"] += 1

    def redis_error(self, queue: str | None, error: BaseException) -> None:
        with self._lock:
            self.counts["redis_error"] += 1

    def task_crashed(self, queue: str | None, task: str) -> None:
        with self._lock:
            self.counts[f"crashed:{task}"] += 1

    def outcomes(self) -> Counter[str]:
        with self._lock:
            return Counter(o for _, o, _ in self.finished)
