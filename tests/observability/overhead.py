"""Overhead of metrics and tracing on no-op throughput, every mode in the same run.

    python -m tests.observability.overhead --jobs 5000 --concurrency 50 --rounds 5

Each round runs every mode once (interleaved, so drift hits all modes alike) on a fresh key
prefix: enqueue ``--jobs`` no-op jobs with ``add_bulk`` (producer hooks on), then start a
worker and time until the queue is drained. Prints the median of each mode and its cost
relative to no instrumentation: wall-clock throughput, and CPU time of this process per job
(steadier than wall time on a shared machine; Redis runs in its own process and is not
counted). Tracing uses the SDK with a batch processor and an exporter
that drops spans, so the SDK's own cost is counted but no network.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from streamq import App, CompositeHooks, Hooks, Job, JobRequest, Queue, WorkerManager
from streamq.metrics import PrometheusHooks
from streamq.observe import JobLogHooks
from streamq.tracing import TracingHooks, current_trace_ids
from tests.observability.support import Obs, Work


class DropSpans(SpanExporter):
    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@dataclass
class Mode:
    name: str
    make: Callable[[], tuple[Hooks, Callable[[], None]]]


def _tracer() -> tuple[TracerProvider, DropSpans]:
    exporter = DropSpans()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    return provider, exporter


def _off() -> tuple[Hooks, Callable[[], None]]:
    return Hooks(), lambda: None


def _metrics() -> tuple[Hooks, Callable[[], None]]:
    return PrometheusHooks(), lambda: None


def _tracing() -> tuple[Hooks, Callable[[], None]]:
    provider, _ = _tracer()
    return TracingHooks(provider), provider.shutdown


def _tracing_sampled_out() -> tuple[Hooks, Callable[[], None]]:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    return TracingHooks(provider), provider.shutdown


def _both() -> tuple[Hooks, Callable[[], None]]:
    provider, _ = _tracer()
    return CompositeHooks([TracingHooks(provider), PrometheusHooks()]), provider.shutdown


def _both_and_logs() -> tuple[Hooks, Callable[[], None]]:
    provider, _ = _tracer()
    logger = logging.getLogger("streamq.jobs.bench")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(io.StringIO())
    logger.handlers = [handler]
    hooks = CompositeHooks([
        TracingHooks(provider), PrometheusHooks(),
        JobLogHooks(logger=logger, trace_ids=current_trace_ids),
    ])
    return hooks, provider.shutdown


MODES = [
    Mode("off", _off),
    Mode("metrics", _metrics),
    Mode("tracing", _tracing),
    Mode("tracing, sampled out", _tracing_sampled_out),
    Mode("metrics+tracing", _both),
    Mode("metrics+tracing+job logs", _both_and_logs),
]


def _app(concurrency: int) -> App:
    app = App([Obs])

    @app.processor(
        Obs, concurrency=concurrency, block_timeout=timedelta(milliseconds=200),
        promote_interval=timedelta(milliseconds=50),
    )
    async def noop(job: Job[Work]) -> None:
        return None

    return app


async def run_once(url: str, mode: Mode, jobs: int, concurrency: int) -> dict[str, float]:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    hooks, shutdown = mode.make()
    client = aioredis.Redis.from_url(url)
    try:
        queue = Queue(Obs, client, prefix=prefix, hooks=hooks)
        t0, c0 = time.perf_counter(), time.process_time()
        await queue.add_bulk(JobRequest(Obs.work, Work(project_id="p", n=i)) for i in range(jobs))
        enqueue_s, enqueue_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        manager = WorkerManager(redis_url=url, prefix=prefix, hooks=hooks)
        manager.register_app(_app(concurrency))
        t0, c0 = time.perf_counter(), time.process_time()
        await manager.start()
        await manager.run_until_idle(timeout_s=300)
        process_s, process_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        w = manager.get_worker("obs")
        if w is None or w.started_total != jobs:
            raise RuntimeError(f"expected {jobs} jobs started: {w and w.stats()}")
        await manager.close_workers(timeout_s=1)
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        shutdown()
        await client.aclose()
    return {"enqueue_s": enqueue_s, "process_s": process_s, "enqueue_cpu_s": enqueue_cpu_s,
            "process_cpu_s": process_cpu_s}


async def measure(url: str, *, jobs: int, concurrency: int, rounds: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {m.name: [] for m in MODES}
    await run_once(url, MODES[0], min(jobs, 500), concurrency)  # warm up scripts, imports
    for _ in range(rounds):
        for mode in MODES:
            results[mode.name].append(await run_once(url, mode, jobs, concurrency))
    summary: dict[str, Any] = {}

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    for name in results:
        summary[name] = {
            "process_jobs_per_s": round(jobs / med(name, "process_s")),
            "process_cpu_us_per_job": round(med(name, "process_cpu_s") / jobs * 1e6, 1),
            "process_cpu_us_added": round(
                (med(name, "process_cpu_s") - med("off", "process_cpu_s")) / jobs * 1e6, 1
            ),
            "enqueue_jobs_per_s": round(jobs / med(name, "enqueue_s")),
            "enqueue_cpu_us_per_job": round(med(name, "enqueue_cpu_s") / jobs * 1e6, 1),
            "enqueue_cpu_us_added": round(
                (med(name, "enqueue_cpu_s") - med("off", "enqueue_cpu_s")) / jobs * 1e6, 1
            ),
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    ns = parser.parse_args(argv)
    server = None
    url = ns.redis_url
    if url is None:
        from tests.support.redis_server import RedisServer, find_binary

        binary = find_binary()
        if binary is None:
            raise SystemExit("no redis-server found; pass --redis-url")
        server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
        url = server.url
    try:
        out = asyncio.run(measure(url, jobs=ns.jobs, concurrency=ns.concurrency,
                                  rounds=ns.rounds))
    finally:
        if server is not None:
            server.stop(kill=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
