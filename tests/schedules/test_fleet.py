"""Replicas running the same schedule enqueue each tick exactly once: in one process, in
several processes, while replicas start and stop, and with skewed host clocks."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq import Job
from tests.schedules.conftest import MakeManager
from tests.schedules.support import (
    Tick,
    assert_each_tick_once,
    left_in_streams,
    make_app,
    redis_ms,
    tick_of,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]


async def test_three_replicas_starting_and_stopping_enqueue_each_tick_once(
    managers: MakeManager, aredis: aioredis.Redis, prefix: str
) -> None:
    seen: list[tuple[str, int]] = []

    async def record(job: Job[Tick]) -> None:
        seen.append((job.id, await redis_ms(aredis)))

    apps = []

    async def replica() -> object:
        app = make_app(record, every=0.2, grace=2.0)
        apps.append(app)
        m = managers(app)
        await m.start()
        return m

    a, b, c = [await replica() for _ in range(3)]
    await wait_for(lambda: len(seen) >= 4, what="the first ticks")
    await b.close_workers(timeout_s=1)  # type: ignore[attr-defined]
    n = len(seen)
    await wait_for(lambda: len(seen) >= n + 3, what="ticks with two replicas")
    d = await replica()
    await a.close_workers(timeout_s=1)  # type: ignore[attr-defined]
    n = len(seen)
    await wait_for(lambda: len(seen) >= n + 3, what="ticks after a replica came and went")
    await c.close_workers(timeout_s=1)  # type: ignore[attr-defined]
    await d.run_until_idle(timeout_s=10)  # type: ignore[attr-defined]
    await d.close_workers(timeout_s=1)  # type: ignore[attr-defined]

    ids = [i for i, _ in seen] + await left_in_streams(aredis, prefix)
    ticks = [tick_of(i) for i in ids]
    assert len(ticks) >= 10
    assert_each_tick_once(ticks, 200)
    enqueued = sum(app.scheduler.counts["enqueued"] for app in apps)  # type: ignore[union-attr]
    assert enqueued == len(ticks)  # confirmed adds: one per tick across all replicas
    early = [(i, at) for i, at in seen if at < tick_of(i)]
    assert not early


REPLICA = """
import asyncio, sys, time
skew = float(sys.argv[3])
_real = time.time
time.time = lambda: _real() + skew  # this host's clock is off by `skew` seconds
import redis.asyncio as aioredis
from streamq import WorkerManager
from tests.schedules.support import make_app, redis_ms

async def main() -> None:
    url, prefix = sys.argv[1], sys.argv[2]
    client = aioredis.Redis.from_url(url)

    async def record(job):
        await client.rpush(f"{prefix}:test:processed", f"{job.id} {await redis_ms(client)}")

    app = make_app(record, every=0.2, grace=2.0)
    manager = WorkerManager(redis_url=url, prefix=prefix)
    manager.register_app(app)
    print("ready", flush=True)
    if sys.argv[4] == "wait":  # join the fleet when told to
        await asyncio.to_thread(sys.stdin.readline)
    await manager.start()
    print("started", flush=True)
    await manager.run_until_signal()
    await client.hincrby(f"{prefix}:test:counts", "enqueued", app.scheduler.counts["enqueued"])
    await client.aclose()

asyncio.run(main())
"""


def _spawn(
    redis_url: str, prefix: str, skew_s: float, *, wait: bool = False
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", REPLICA, redis_url, prefix, str(skew_s), "wait" if wait else "now"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _says(proc: subprocess.Popen[str], word: str, timeout_s: float = 30.0) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    if line.strip() != word:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"replica did not say {word!r}: {line!r}\n{err}")


async def _started(proc: subprocess.Popen[str]) -> None:
    await _says(proc, "ready")
    await _says(proc, "started")


async def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 30)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, f"replica {proc.args[5]} exited with {code}: {err[-3000:]}"


@pytest.mark.timeout(90)
async def test_replica_processes_with_skewed_clocks_enqueue_each_tick_once_and_never_early(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    procs = [_spawn(redis_url, prefix, skew) for skew in (0.0, 7.0, -7.0)]
    # The replica that joins later (its clock 30 s behind) imports now, to save time.
    late = _spawn(redis_url, prefix, -30.0, wait=True)
    procs.append(late)
    try:
        await asyncio.gather(*(_started(p) for p in procs[:3]), _says(late, "ready"))
        processed = f"{prefix}:test:processed"

        async def count_at_least(n: int) -> None:
            for _ in range(1500):
                if await aredis.llen(processed) >= n:
                    return
                await asyncio.sleep(0.02)
            raise TimeoutError(f"fewer than {n} jobs processed")

        await count_at_least(5)
        await _stop(procs[1])  # the fast clock leaves; the slow one joins
        assert late.stdin is not None
        late.stdin.write("go\n")
        late.stdin.flush()
        await _says(late, "started")
        await count_at_least(await aredis.llen(processed) + 5)
        await asyncio.gather(*(_stop(p) for p in (procs[0], procs[2], late)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    rows = [r.decode().split() for r in await aredis.lrange(processed, 0, -1)]
    seen = [(job_id, int(at)) for job_id, at in rows]
    ids = [i for i, _ in seen] + await left_in_streams(aredis, prefix)
    ticks = [tick_of(i) for i in ids]
    assert len(ticks) >= 10
    assert_each_tick_once(ticks, 200)
    assert int(await aredis.hget(f"{prefix}:test:counts", "enqueued") or 0) == len(ticks)
    early = [(i, at - tick_of(i)) for i, at in seen if at < tick_of(i)]
    assert not early, f"jobs enqueued before their tick (ms early): {early}"
    keys = [k async for k in aredis.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await aredis.delete(*keys)
