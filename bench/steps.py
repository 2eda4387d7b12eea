"""Where a processed job's CPU goes: ``python -m bench.steps [--n N] [--rounds R]``.

Two kinds of figure, both CPU time of this process (``time.process_time``), so they hold on
a busy machine better than a rate does:

- **Whole job**: one worker (concurrency 100, pre-filled queue, no-op async processor) with
  Prometheus metrics on and off, and the raw ``redis.asyncio`` consume loop
  (``XREADGROUP COUNT 100`` + one ``XACK``/``XDEL`` pipeline) over the same entries:
  CPU µs per job, the least of ``--rounds`` runs.
- **Steps**: each per-job step of the worker timed alone on the benchmark's real entry
  (``timeit``, the least of 7 repeats, on a running event loop): decoding the entry,
  validating the payload, the job and hook objects, the metrics of a start and a finish, the
  asyncio task a job runs in, the future its settle answer arrives on.

The steps do not add up to the whole: the rest is the event loop and socket I/O (shared by
the raw loop), the reads and settles amortised over many jobs, and the wiring between steps.
Prints a Markdown table; ``docs/performance.md`` ("What bounds per-job processing") quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit
from collections.abc import Callable

import redis.asyncio as aioredis

from bench import consumers, producers
from bench.contract import Bench, Ping
from bench.redis_server import BenchRedis

N_DEFAULT = 20_000


async def _worker_cpu(url: str, prefix: str, n: int, *, metrics: bool) -> float:
    from streamq import App, Job, WorkerManager

    app = App([Bench])
    left = [n]
    done = asyncio.Event()

    @app.processor(Bench, concurrency=100, lock_duration=consumers.LOCK_S,
                   stalled_interval=consumers.STALLED_S)
    async def noop(job: Job[Ping]) -> None:
        left[0] -= 1
        if left[0] == 0:
            done.set()

    hooks = consumers.metrics_hooks()[0] if metrics else None
    manager = WorkerManager(redis_url=url, prefix=prefix, hooks=hooks)
    manager.register_app(app)
    c0 = time.process_time()
    await manager.start()
    await asyncio.wait_for(done.wait(), 600)
    await manager.run_until_idle(timeout_s=30)
    cpu = time.process_time() - c0
    await manager.close_workers(timeout_s=5)
    return cpu / n * 1e6


async def _raw_cpu(url: str, stream: str, n: int) -> float:
    r = aioredis.Redis.from_url(url)
    await r.xgroup_create(stream, "raw", id="0")
    c0 = time.process_time()
    done = 0
    while done < n:
        reply = await r.xreadgroup("raw", "c1", {stream: ">"}, count=100, block=1000)
        ids = [eid for _s, entries in reply for eid, _f in entries]
        async with r.pipeline(transaction=False) as p:
            p.xack(stream, "raw", *ids)
            p.xdel(stream, *ids)
            await p.execute()
        done += len(ids)
    cpu = time.process_time() - c0
    await r.aclose()
    return cpu / n * 1e6


def _best(fn: Callable[[], object], number: int = 20_000) -> float:
    """µs per call: the least of 7 repeats."""
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


async def _steps(template: dict[bytes, bytes]) -> list[tuple[str, float]]:
    from streamq.envelope import decode_entry, validate_payload
    from streamq.hooks import JobInfo
    from streamq.job import Job
    from streamq.metrics import PrometheusHooks

    fields = dict(template)
    fields[b"id"] = b"%032x" % 7
    raw = decode_entry(b"1700000000000-0", fields)
    payload = validate_payload(raw, Ping, queue="bench")
    hooks = PrometheusHooks()
    info = JobInfo(queue="bench", shard="bench", job_id=raw.id, job_name=raw.name, attempt=1,
                   max_attempts=3, entry_id=raw.entry_id, wait_ms=3.0)

    def objects() -> None:
        JobInfo(queue="bench", shard="bench", job_id=raw.id, job_name=raw.name, attempt=1,
                max_attempts=3, entry_id=raw.entry_id, wait_ms=3.0)
        Job(id=raw.id, name=raw.name, queue="bench", shard="bench", payload=payload,
            attempt=1, max_attempts=3, timestamp=raw.timestamp_ms,
            retry_baggage=raw.retry_baggage, trace_context=raw.trace_context, tenant=None,
            extend_lock=lambda: None)

    def metrics() -> None:
        hooks.job_started(info)
        hooks.job_finished(info, "completed", 0.001)
        hooks.active_changed("bench", 5)

    loop = asyncio.get_running_loop()

    async def nothing() -> None:
        return None

    async def tasks(k: int) -> float:
        t0 = time.process_time()
        for _ in range(k // 100):
            await asyncio.gather(*[loop.create_task(nothing()) for _ in range(100)])
        return (time.process_time() - t0) / k * 1e6

    async def futures(k: int) -> float:
        t0 = time.process_time()
        for _ in range(k):
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut
        return (time.process_time() - t0) / k * 1e6

    out = [
        ("decode the stream entry (`decode_entry`)",
         _best(lambda: decode_entry(b"1700000000000-0", fields))),
        ("validate the payload (pydantic `model_validate_json`)",
         _best(lambda: validate_payload(raw, Ping, queue="bench"))),
        ("build `JobInfo` and `Job`", _best(objects)),
        ("metrics of one job (start, finish, active gauge; gathered, written in bulk)",
         _best(metrics)),
        ("an asyncio task per job (create, run, gather)",
         min([await tasks(20_000) for _ in range(5)])),
        ("a future for the settle's answer (create, resolve, await)",
         min([await futures(20_000) for _ in range(5)])),
    ]
    hooks.flush()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.steps")
    ap.add_argument("--n", type=int, default=N_DEFAULT)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    whole: dict[str, list[float]] = {"metrics": [], "bare": [], "raw": []}
    with BenchRedis() as server:
        url = server.url
        template = producers.template_fields(url, "tpl")
        for r in range(a.rounds):
            for kind in ("metrics", "bare"):
                prefix = f"s{r}{kind}"
                consumers.prefill(url, prefix, template, a.n)
                whole[kind].append(asyncio.run(_worker_cpu(url, prefix, a.n,
                                                           metrics=kind == "metrics")))
                consumers.drop(url, prefix)
            prefix = f"s{r}raw"
            consumers.prefill(url, prefix, template, a.n)
            whole["raw"].append(asyncio.run(_raw_cpu(url, consumers.stream_key(prefix), a.n)))
            consumers.drop(url, prefix)
        steps = asyncio.run(_steps(template))
    print("| per processed job (no-op processor, concurrency 100) | CPU µs |")
    print("| --- | ---: |")
    print(f"| streamq worker, Prometheus metrics on | {min(whole['metrics']):.1f} |")
    print(f"| streamq worker, no hooks | {min(whole['bare']):.1f} |")
    raw = min(whole["raw"])
    print(f"| raw `redis.asyncio` consume loop (COUNT 100, XACK + XDEL) | {raw:.1f} |")
    for name, us in steps:
        print(f"| step: {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
