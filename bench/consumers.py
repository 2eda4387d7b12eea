"""Consumer throughput and cost: raw redis-py consume loops against one streamq worker.

Every consumer here runs **in the benchmark process**, which is the one worker process while
it is measured (nothing else runs in it then); a concurrent producer is a separate process
(:mod:`bench.producer_proc`). Queues are pre-filled with entries of streamq's exact envelope.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import stats
from bench.contract import Bench, Ping
from bench.producers import stream_key
from streamq import App, Hooks
from streamq.job import Job
from streamq.runtime.manager import WorkerManager

RAW_COUNT = 100
RAW_GROUP = "raw"
LOCK_S = 4.0
"""Lock duration of the benchmark worker: renewal (every 2 s) and the stalled-job reclaim
(every 2 s) both run several times during a measurement instead of never (defaults: 30 s)."""
STALLED_S = 2.0
RUN_TIMEOUT_S = 900.0

_ROOT = Path(__file__).resolve().parent.parent
_metrics: tuple[Hooks | None, str] | None = None


def metrics_hooks() -> tuple[Hooks | None, str]:
    """The Prometheus hooks adapter when streamq ships one, made once per process."""
    global _metrics
    if _metrics is None:
        try:
            from streamq.metrics import PrometheusHooks
        except ImportError:
            _metrics = (None, "off: streamq.metrics.PrometheusHooks is not available")
        else:
            try:
                from prometheus_client import CollectorRegistry

                hooks = PrometheusHooks(registry=CollectorRegistry())
            except TypeError:
                hooks = PrometheusHooks()
            _metrics = (hooks, "on: streamq.metrics.PrometheusHooks")
    return _metrics


# -- queue set-up ----------------------------------------------------------------------------
def prefill(url: str, prefix: str, template: dict[bytes, bytes], n: int) -> None:
    """``n`` waiting jobs of the benchmark queue, each with its own job id."""
    key = stream_key(prefix)
    r = redis.Redis.from_url(url)
    try:
        for start in range(0, n, 1000):
            with r.pipeline(transaction=False) as p:
                for i in range(start, min(n, start + 1000)):
                    f = dict(template)
                    f[b"id"] = b"%032x" % i
                    p.xadd(key, f)  # type: ignore[arg-type]
                p.execute()
    finally:
        r.close()


def drop(url: str, prefix: str) -> None:
    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


class ProducerProcess:
    """:mod:`bench.producer_proc` in a child process, started now, producing on :meth:`go`."""

    def __init__(self, url: str, prefix: str, n: int, *, mode: str = "bulk",
                 batch: int = 100, rate: float = 200.0) -> None:
        args = [sys.executable, "-m", "bench.producer_proc", "--url", url, "--prefix", prefix,
                "--n", str(n), "--mode", mode, "--batch", str(batch), "--rate", str(rate)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=_ROOT, env=env, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"producer process did not start (said {line!r})")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float = 600) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        if self.proc.returncode != 0:
            raise RuntimeError(f"producer process failed ({self.proc.returncode})")
        return dict(json.loads(out.strip().splitlines()[-1]))


def _entries(reply: Any) -> list[Any]:
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        return [e for entries in reply.values() for e in (entries[0] if entries and
                isinstance(entries[0], list) else entries)]
    return [e for _stream, entries in reply for e in entries]


# -- raw redis-py consume loops --------------------------------------------------------------
async def raw_consume_async(url: str, prefix: str, n: int,
                            producer: ProducerProcess | None = None) -> dict[str, Any]:
    """XREADGROUP COUNT 100, then XACK + XDEL of the batch in one pipeline, until ``n``."""
    key = stream_key(prefix)
    r = aioredis.Redis.from_url(url)
    sr = redis.Redis.from_url(url)
    try:
        await r.xgroup_create(key, RAW_GROUP, id="0", mkstream=True)
        before = stats.snapshot(sr)
        t0 = time.perf_counter()
        if producer:
            producer.go()
        done = 0
        while done < n:
            batch = _entries(await r.xreadgroup(RAW_GROUP, "c1", {key: ">"},
                                                count=RAW_COUNT, block=1000))
            if not batch:
                continue
            ids = [eid for eid, _fields in batch]
            async with r.pipeline(transaction=False) as p:
                p.xack(key, RAW_GROUP, *ids)
                p.xdel(key, *ids)
                await p.execute()
            done += len(ids)
        dt = time.perf_counter() - t0
        after = stats.snapshot(sr)
        return {"jobs": done, "seconds": dt, "rate": done / dt,
                **stats.cost(before, after, done)}
    finally:
        await r.aclose()
        sr.close()


def raw_consume_sync(url: str, prefix: str, n: int,
                     producer: ProducerProcess | None = None) -> dict[str, Any]:
    """The sync twin of :func:`raw_consume_async`."""
    key = stream_key(prefix)
    r = redis.Redis.from_url(url)
    try:
        r.xgroup_create(key, RAW_GROUP, id="0", mkstream=True)
        before = stats.snapshot(r)
        t0 = time.perf_counter()
        if producer:
            producer.go()
        done = 0
        while done < n:
            batch = _entries(r.xreadgroup(RAW_GROUP, "c1", {key: ">"}, count=RAW_COUNT,
                                          block=1000))
            if not batch:
                continue
            ids = [eid for eid, _fields in batch]
            with r.pipeline(transaction=False) as p:
                p.xack(key, RAW_GROUP, *ids)
                p.xdel(key, *ids)
                p.execute()
            done += len(ids)
        dt = time.perf_counter() - t0
        after = stats.snapshot(r)
        return {"jobs": done, "seconds": dt, "rate": done / dt,
                **stats.cost(before, after, done)}
    finally:
        r.close()


# -- one streamq worker ----------------------------------------------------------------------
class _Counter:
    """Counts processor starts (thread-safe for sync processors) and fires at a target."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._next = itertools.count(1)
        self.loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self.latencies_ms: list[float] = []

    def hit(self) -> None:
        if next(self._next) == self.target:
            self.loop.call_soon_threadsafe(self.reached.set)


def _app(counter: _Counter, processor: str, concurrency: int, latency: bool) -> App:
    app = App([Bench])
    opts: dict[str, Any] = {"concurrency": concurrency, "lock_duration": LOCK_S,
                            "stalled_interval": STALLED_S}
    if processor == "async":
        if latency:
            @app.processor(Bench, **opts)
            async def timed(job: Job[Ping]) -> None:
                counter.latencies_ms.append((time.time() - job.payload.sent_at) * 1000)
                counter.hit()
        else:
            @app.processor(Bench, **opts)
            async def noop(job: Job[Ping]) -> None:
                counter.hit()
    else:
        @app.processor(Bench, **opts)
        def noop_sync(job: Job[Ping]) -> None:
            counter.hit()
    return app


async def sq_consume(url: str, prefix: str, n: int, *, concurrency: int, processor: str,
                     producer: ProducerProcess | None = None, backlog: int | None = None,
                     latency: bool = False) -> dict[str, Any]:
    """One streamq worker processes ``n`` jobs with a no-op processor.

    With ``backlog`` (a pre-filled queue larger than ``n``), the run stops after ``n``
    starts and the cost is divided by the jobs settled by then (backlog minus XLEN).
    Otherwise it runs until all ``n`` are settled.
    """
    counter = _Counter(n)
    hooks, _ = metrics_hooks()
    manager = WorkerManager(redis_url=url, prefix=prefix, hooks=hooks)
    manager.register_app(_app(counter, processor, concurrency, latency))
    sr = redis.Redis.from_url(url)
    try:
        before = stats.snapshot(sr)
        await manager.start()
        t0 = time.perf_counter()
        if producer:
            producer.go()
        w = manager.get_worker(Bench.queue_name)
        assert w is not None
        try:
            await asyncio.wait_for(counter.reached.wait(), RUN_TIMEOUT_S)
            if backlog is None:
                deadline = time.monotonic() + 30
                while not w.local_idle():
                    if time.monotonic() > deadline:
                        raise TimeoutError("worker never became idle")
                    await asyncio.sleep(0.001)
        except TimeoutError:
            raise RuntimeError(f"benchmark run stuck: {w.stats()} settler pending "
                               f"{w.settler.pending}") from None
        dt = time.perf_counter() - t0
        after = stats.snapshot(sr)
        left = int(sr.xlen(stream_key(prefix)))
        jobs = (backlog - left) if backlog is not None else n
        out = {"jobs": jobs, "seconds": dt, "rate": jobs / dt, "left": left,
               **stats.cost(before, after, jobs)}
        if latency:
            out["latencies_ms"] = counter.latencies_ms
        return out
    finally:
        await manager.close_workers(timeout_s=5)
        sr.close()
