"""One measurement of a processing scenario, in a process of its own.

Run by :mod:`bench.scenarios`, which pre-fills the queue and reads the Redis server's figures
around the run. Protocol on stdin/stdout: prints ``ready <json>`` (resident memory before
any job), waits for ``go``, processes ``--n`` jobs, prints one JSON line (rate, the commands
this process sent, resident memory), then waits for ``stop`` before it shuts down, so the
server figures never include the shutdown.

Sides:

- ``streamq``: one worker (``WorkerManager`` + ``App``, metrics on) whose processor does the
  scenario's per-job work. Its idle memory is read from a first worker started on an empty
  queue (``--idle-prefix``) and closed again; the measured worker starts at ``go``.
- ``raw``: a raw redis-py consume loop at the same concurrency: ``XREADGROUP COUNT c``, the
  per-job work of the batch run concurrently (tasks sharing one ``redis.asyncio`` client, or
  ``c`` threads sharing one ``redis.Redis`` client), then ``XACK`` + ``XDEL`` of the batch in
  one pipeline. This process imports no streamq.
- ``pure``: the per-job work alone, no queue: ``c`` tasks (or threads) sharing one client,
  each looping over the call until ``--n`` calls are done.

Work (``--work``): ``incr-async`` (``await r.incr(key)``), ``incr-sync`` (``r.incr(key)`` from
a thread), ``sleep`` (``await asyncio.sleep(0.005)``), ``noop-batch`` (nothing, handed to a
batch processor, ``Batch(max_size=100, max_wait=0.005)``; the raw loop reads ``COUNT 100``
and does nothing between the read and the ``XACK`` + ``XDEL`` pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import stats

RAW_GROUP = "raw"
SLEEP_S = 0.005
BATCH_SIZE = 100
BATCH_WAIT_S = 0.005


# -- resident memory -------------------------------------------------------------------------
def rss_mb() -> float:
    """This process's resident set size now, in MiB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """Samples the resident set size every 10 ms on a thread of its own; keeps the peak."""

    def __init__(self) -> None:
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


# -- the per-job work ------------------------------------------------------------------------
class Work:
    """The scenario's per-job work and the clients it uses (the processor's own, not the
    queue's)."""

    def __init__(self, kind: str, url: str, key: str) -> None:
        self.kind, self.key = kind, key
        self.aclient = aioredis.Redis.from_url(url)
        self.sclient = redis.Redis.from_url(url)

    async def run_async(self) -> None:
        if self.kind == "noop-batch":
            return
        if self.kind == "sleep":
            await asyncio.sleep(SLEEP_S)
        else:
            await self.aclient.incr(self.key)

    def run_sync(self) -> None:
        self.sclient.incr(self.key)

    @property
    def is_sync(self) -> bool:
        return self.kind == "incr-sync"

    @property
    def is_batch(self) -> bool:
        return self.kind == "noop-batch"

    async def connect(self, n: int) -> None:
        """Open ``n`` connections of each client now, so that the run does not."""
        apool, spool = self.aclient.connection_pool, self.sclient.connection_pool
        aconns = [await apool.get_connection() for _ in range(n)]  # type: ignore[no-untyped-call]
        for c in aconns:
            await apool.release(c)
        sconns = [spool.get_connection() for _ in range(n)]
        for c in sconns:
            spool.release(c)

    async def close(self) -> None:
        await self.aclient.aclose()
        self.sclient.close()


def _entries(reply: Any) -> list[Any]:
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        return [e for entries in reply.values() for e in (entries[0] if entries and
                isinstance(entries[0], list) else entries)]
    return [e for _stream, entries in reply for e in entries]


# -- raw redis-py consume loop and the work alone -----------------------------------------------
async def raw_consume(a: argparse.Namespace, work: Work) -> int:
    """XREADGROUP COUNT c, the batch's work as concurrent tasks, XACK + XDEL in one pipeline.

    For ``noop-batch``: XREADGROUP COUNT 100 and straight to the XACK + XDEL pipeline."""
    r = aioredis.Redis.from_url(a.url)
    count = BATCH_SIZE if work.is_batch else a.concurrency
    done = 0
    try:
        while done < a.n:
            batch = _entries(await r.xreadgroup(RAW_GROUP, "c1", {a.stream: ">"},
                                                count=count, block=1000))
            if not batch:
                continue
            if not work.is_batch:
                await asyncio.gather(*(work.run_async() for _ in batch))
            ids = [eid for eid, _fields in batch]
            async with r.pipeline(transaction=False) as p:
                p.xack(a.stream, RAW_GROUP, *ids)
                p.xdel(a.stream, *ids)
                await p.execute()
            done += len(ids)
    finally:
        await r.aclose()
    return done


def raw_consume_threads(a: argparse.Namespace, work: Work) -> int:
    """The sync twin: redis-py reads and acks, ``c`` threads run the batch's work."""
    r = redis.Redis.from_url(a.url)
    done = 0
    try:
        with ThreadPoolExecutor(a.concurrency) as pool:
            while done < a.n:
                batch = _entries(r.xreadgroup(RAW_GROUP, "c1", {a.stream: ">"},
                                              count=a.concurrency, block=1000))
                if not batch:
                    continue
                for f in [pool.submit(work.run_sync) for _ in batch]:
                    f.result()
                ids = [eid for eid, _fields in batch]
                with r.pipeline(transaction=False) as p:
                    p.xack(a.stream, RAW_GROUP, *ids)
                    p.xdel(a.stream, *ids)
                    p.execute()
                done += len(ids)
    finally:
        r.close()
    return done


async def pure_work(a: argparse.Namespace, work: Work) -> int:
    """The work alone, no queue: c tasks (threads for sync work) sharing one client."""
    left = itertools.count()
    n: int = a.n

    if work.is_sync:
        def thread() -> None:
            while next(left) < n:
                work.run_sync()

        with ThreadPoolExecutor(a.concurrency) as pool:
            for f in [pool.submit(thread) for _ in range(a.concurrency)]:
                f.result()
        return n

    async def task() -> None:
        while next(left) < n:
            await work.run_async()

    await asyncio.gather(*(task() for _ in range(a.concurrency)))
    return n


# -- one streamq worker --------------------------------------------------------------------------
class Done:
    """Counts finished processor calls (from any thread) and fires at the target."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._next = itertools.count(1)
        self.loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self._done = 0

    def hit(self) -> None:
        if next(self._next) == self.target:
            self.loop.call_soon_threadsafe(self.reached.set)

    def hit_many(self, k: int) -> None:
        """``k`` calls at once (a batch processor's list; on the event loop)."""
        self._done += k
        if self._done >= self.target and not self.reached.is_set():
            self.reached.set()


def streamq_app(work: Work, done: Done, concurrency: int) -> Any:
    from bench.consumers import LOCK_S, STALLED_S
    from bench.contract import Bench, Ping
    from streamq import App, Batch, Job

    app = App([Bench])
    opts: dict[str, Any] = {"concurrency": concurrency, "lock_duration": LOCK_S,
                            "stalled_interval": STALLED_S}
    if work.is_batch:
        # prefetch one batch: the next batch is fetched while one runs, as the docs advise.
        opts["prefetch"] = BATCH_SIZE

        @app.processor(Bench, batch=Batch(max_size=BATCH_SIZE, max_wait=BATCH_WAIT_S), **opts)
        async def per_batch(jobs: list[Job[Ping]]) -> None:
            done.hit_many(len(jobs))
    elif work.is_sync:
        @app.processor(Bench, **opts)
        def per_job_sync(job: Job[Ping]) -> None:
            work.run_sync()
            done.hit()
    else:
        @app.processor(Bench, **opts)
        async def per_job(job: Job[Ping]) -> None:
            await work.run_async()
            done.hit()
    return app


def _manager(url: str, prefix: str, app: Any) -> Any:
    from bench.consumers import metrics_hooks
    from streamq import WorkerManager

    manager = WorkerManager(redis_url=url, prefix=prefix, hooks=metrics_hooks()[0])
    manager.register_app(app)
    return manager


async def streamq_idle_rss(a: argparse.Namespace, work: Work) -> float:
    """Resident memory of a started worker with nothing to do (its own empty queue)."""
    manager = _manager(a.url, a.idle_prefix, streamq_app(work, Done(1), a.concurrency))
    await manager.start()
    try:
        await asyncio.sleep(0.3)  # its loops, threads and connections all up
        return rss_mb()
    finally:
        await manager.close_workers(timeout_s=5)


async def streamq_consume(manager: Any, done: Done) -> int:
    """Start ``manager`` on the pre-filled queue; return once ``done`` fired and every
    started job settled."""
    from bench.contract import Bench

    await manager.start()
    await asyncio.wait_for(done.reached.wait(), 900)
    w = manager.get_worker(Bench.queue_name)
    local_idle = getattr(w, "local_idle", None)
    if local_idle is None:  # a runtime without it: the public wait (it polls Redis too)
        await manager.run_until_idle(timeout_s=30)
        return done.target
    deadline = time.monotonic() + 30
    while not local_idle():  # every started job settled
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker never became idle: {w.stats()}")
        await asyncio.sleep(0.001)
    return done.target


# -- the protocol ------------------------------------------------------------------------------
async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=["streamq", "raw", "pure"], required=True)
    ap.add_argument("--work", choices=["incr-async", "incr-sync", "sleep", "noop-batch"],
                    required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--idle-prefix", default="")
    ap.add_argument("--stream", default="")
    a = ap.parse_args()
    stats.ClientCommands.install()
    work = Work(a.work, a.url, f"{a.prefix}:counter")
    manager, done = None, Done(a.n)
    if a.side == "raw":
        r = aioredis.Redis.from_url(a.url)
        await r.xgroup_create(a.stream, RAW_GROUP, id="0", mkstream=True)
        await r.aclose()
    await work.connect(a.concurrency)
    idle = await streamq_idle_rss(a, work) if a.side == "streamq" else rss_mb()
    if a.side == "streamq":
        manager = _manager(a.url, a.prefix, streamq_app(work, done, a.concurrency))
    print("ready " + json.dumps({"rss_idle_mb": idle}), flush=True)
    await _line()
    before = stats.ClientCommands.snapshot()
    t0 = time.perf_counter()
    with PeakRss() as peak:
        if manager is not None:
            jobs = await streamq_consume(manager, done)
        elif a.side == "raw" and work.is_sync:
            jobs = await asyncio.get_running_loop().run_in_executor(
                None, raw_consume_threads, a, work)
        elif a.side == "raw":
            jobs = await raw_consume(a, work)
        else:
            jobs = await pure_work(a, work)
    dt = time.perf_counter() - t0
    after = stats.ClientCommands.snapshot()
    sent = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    print(json.dumps({"jobs": jobs, "seconds": dt, "rate": jobs / dt, "client_commands": sent,
                      "rss_idle_mb": idle, "rss_peak_mb": peak.peak,
                      "rss_after_mb": rss_mb()}), flush=True)
    await _line()
    if manager is not None:
        await manager.close_workers(timeout_s=5)
    await work.close()


if __name__ == "__main__":
    asyncio.run(main())
