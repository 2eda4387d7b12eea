"""Run the benchmark suite: ``python -m bench.run [--quick | --full] [--out DIR]``.

One run starts its own redis-server and measures raw redis-py baselines and streamq on it,
so every figure is a ratio taken on the same machine at the same time. Writes
``latest.json`` (every figure and ratio), ``latest.md`` (tables) and ``throughput.png``
(throughput against concurrency) to ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.utils

from bench import consumers, memory, producers, report, scenarios, stats
from bench.redis_server import BenchRedis

CONCURRENCY = (1, 10, 100)
PROCESSORS = ("async", "sync")


@dataclass(frozen=True)
class Sizes:
    one_n: int
    bulk_n: int
    batch: int
    raw_consume_n: int
    consume_n: dict[int, int]
    latency_rate: float
    latency_s: float
    memory_n: int
    backlogs: tuple[int, ...]
    backlog_jobs: int
    repeat: int
    scenario_n: dict[str, int]
    """Jobs per run of each processing scenario (:data:`bench.scenarios.SCENARIOS`)."""
    scaling_concurrency: int = 100
    labels: dict[str, str] = field(default_factory=dict)


QUICK = Sizes(one_n=300, bulk_n=2_000, batch=500, raw_consume_n=2_000,
              consume_n={1: 200, 10: 1_000, 100: 2_000}, latency_rate=200, latency_s=1.0,
              memory_n=2_000, backlogs=(500, 2_000, 5_000), backlog_jobs=400, repeat=1,
              scenario_n={"a-c10": 300, "a-c100": 1_000, "b-c10": 300, "c-c100": 1_000,
                          "d-c1": 2_000, "e-c10": 1_000})
FULL = Sizes(one_n=20_000, bulk_n=200_000, batch=500, raw_consume_n=200_000,
             consume_n={1: 10_000, 10: 50_000, 100: 200_000}, latency_rate=200,
             latency_s=10.0, memory_n=100_000, backlogs=(10_000, 100_000, 1_000_000),
             backlog_jobs=8_000, repeat=3,
             scenario_n={"a-c10": 20_000, "a-c100": 30_000, "b-c10": 20_000, "c-c100": 50_000,
                         "d-c1": 100_000, "e-c10": 30_000})


class Runner:
    def __init__(self, url: str, sizes: Sizes, log: Callable[[str], None]) -> None:
        self.url = url
        self.sizes = sizes
        self.log = log
        self._n = 0
        self.template = producers.template_fields(url, self.prefix())

    def prefix(self) -> str:
        self._n += 1
        return f"bench{self._n}"

    def rounds(
        self, runs: list[tuple[str, Callable[[], dict[str, Any]]]]
    ) -> dict[str, dict[str, Any]]:
        """Run every measurement once per round, ``repeat`` rounds, interleaved so that a
        raw baseline and its streamq counterpart see the same machine load; keep each one's
        run with the median rate (every rate is kept in ``rates``)."""
        got: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in runs}
        for r in range(self.sizes.repeat):
            for name, fn in runs:
                gc.collect()
                got[name].append(fn())
                if r == self.sizes.repeat - 1:
                    rates = sorted(x["rate"] for x in got[name])
                    self.log(f"  {name:44s} {statistics.median(rates):>10,.0f} jobs/s"
                             + (f"  (runs: {', '.join(f'{x:,.0f}' for x in rates)})"
                                if len(rates) > 1 else ""))
        out = {}
        for name, results in got.items():
            results.sort(key=lambda x: x["rate"])
            best = dict(results[len(results) // 2])
            best["rates"] = [x["rate"] for x in results]
            out[name] = best
        return out

    # -- sections --------------------------------------------------------------------------
    def producer(self) -> dict[str, Any]:
        s = self.sizes
        self.log("producer")
        out: dict[str, Any] = {"batch": s.batch}
        fields = self.template
        u = self.url
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("raw_xadd_sync", lambda: producers.raw_xadd_sync(u, self.prefix(), fields, s.one_n)),
            ("sq_add_sync", lambda: producers.sq_add_sync(u, self.prefix(), s.one_n)),
            ("raw_xadd_async", lambda: asyncio.run(
                producers.raw_xadd_async(u, self.prefix(), fields, s.one_n))),
            ("sq_add_async", lambda: asyncio.run(
                producers.sq_add_async(u, self.prefix(), s.one_n))),
            ("raw_pipe_sync", lambda: producers.raw_pipe_sync(
                u, self.prefix(), fields, s.bulk_n, s.batch)),
            ("sq_bulk_sync", lambda: producers.sq_bulk_sync(u, self.prefix(), s.bulk_n, s.batch)),
            ("raw_pipe_async", lambda: asyncio.run(
                producers.raw_pipe_async(u, self.prefix(), fields, s.bulk_n, s.batch))),
            ("sq_bulk_async", lambda: asyncio.run(
                producers.sq_bulk_async(u, self.prefix(), s.bulk_n, s.batch))),
        ]
        out.update(self.rounds(runs))
        return out

    def _filled(self, n: int) -> str:
        p = self.prefix()
        consumers.prefill(self.url, p, self.template, n)
        return p

    def _consume(self, kind: str, n: int, *, concurrency: int = 0, processor: str = "",
                 with_producer: bool = False) -> dict[str, Any]:
        p = self.prefix() if with_producer else self._filled(n)
        producer = consumers.ProducerProcess(self.url, p, n) if with_producer else None
        try:
            if kind == "raw_async":
                res = asyncio.run(consumers.raw_consume_async(self.url, p, n, producer))
            elif kind == "raw_sync":
                res = consumers.raw_consume_sync(self.url, p, n, producer)
            else:
                res = asyncio.run(consumers.sq_consume(
                    self.url, p, n, concurrency=concurrency, processor=processor,
                    producer=producer))
            if producer is not None:
                res["producer"] = producer.result()
            return res
        finally:
            if producer is not None and producer.proc.poll() is None:
                producer.proc.kill()
            consumers.drop(self.url, p)

    def consumer(self) -> dict[str, Any]:
        s = self.sizes
        self.log("consumer (one worker process: the benchmark process; producer: a child)")
        out: dict[str, Any] = {"raw": {}, "streamq": []}
        for mode in ("prefilled", "with_producer"):
            wp = mode == "with_producer"
            runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                (f"{kind}_{mode}",
                 functools.partial(self._consume, kind, s.raw_consume_n, with_producer=wp))
                for kind in ("raw_async", "raw_sync")
            ]
            runs += [
                (f"streamq {proc} processor c={c} {mode}",
                 functools.partial(self._consume, "sq", s.consume_n[c], concurrency=c,
                                   processor=proc, with_producer=wp))
                for proc in PROCESSORS for c in CONCURRENCY
            ]
            got = self.rounds(runs)
            for kind in ("raw_async", "raw_sync"):
                out["raw"][f"{kind}_{mode}"] = got[f"{kind}_{mode}"]
            for proc in PROCESSORS:
                for c in CONCURRENCY:
                    row = got[f"streamq {proc} processor c={c} {mode}"]
                    row.update({"processor": proc, "concurrency": c, "mode": mode})
                    out["streamq"].append(row)
        return out

    def scenarios(self) -> dict[str, Any]:
        self.log("processing scenarios (each run in a process of its own; per-job work)")
        got = self.rounds(scenarios.runs(self.url, self.template, self.prefix,
                                         self.sizes.scenario_n))
        return scenarios.collect(got)

    def latency(self) -> dict[str, Any]:
        s = self.sizes
        self.log("latency")
        n = int(s.latency_rate * s.latency_s)
        p = self.prefix()
        producer = consumers.ProducerProcess(self.url, p, n, mode="rate", rate=s.latency_rate)
        try:
            res = asyncio.run(consumers.sq_consume(self.url, p, n, concurrency=10,
                                                   processor="async", producer=producer,
                                                   latency=True))
            sent = producer.result()
        finally:
            consumers.drop(self.url, p)
        lat = sorted(res.pop("latencies_ms"))

        def pct(q: float) -> float:
            return float(lat[min(len(lat) - 1, int(q * len(lat)))])

        out = {"rate": s.latency_rate, "jobs": len(lat), "concurrency": 10,
               "producer_rate": sent["rate"], "p50_ms": pct(0.50), "p95_ms": pct(0.95),
               "p99_ms": pct(0.99), "max_ms": lat[-1], "mean_ms": statistics.fmean(lat)}
        self.log(f"  enqueue->start p50 {out['p50_ms']:.2f} ms  p95 {out['p95_ms']:.2f} ms  "
                 f"p99 {out['p99_ms']:.2f} ms")
        return out

    def memory(self) -> dict[str, Any]:
        self.log("memory")
        out = {}
        for with_id in (False, True):
            p = self.prefix()
            try:
                m = memory.per_waiting_job(self.url, p, self.sizes.memory_n, with_job_id=with_id)
            finally:
                consumers.drop(self.url, p)
            out["with_job_id" if with_id else "plain"] = m
            self.log(f"  {'with job_id' if with_id else 'plain':12s} "
                     f"{m['overhead_bytes_per_job']:.0f} bytes/job beyond the payload")
        return out

    def scaling(self) -> list[dict[str, Any]]:
        s = self.sizes
        self.log(f"scaling with backlog (async processor, c={s.scaling_concurrency})")
        out = []
        for backlog in s.backlogs:
            p = self._filled(backlog)
            try:
                # Stop well before the backlog runs out: the queue stays that deep throughout.
                n = min(s.backlog_jobs, backlog * 4 // 5)
                res = asyncio.run(consumers.sq_consume(
                    self.url, p, n, concurrency=s.scaling_concurrency,
                    processor="async", backlog=backlog))
            finally:
                consumers.drop(self.url, p)
            res["backlog"] = backlog
            out.append(res)
            self.log(f"  backlog {backlog:>9,}: {res['client_cmds_per_job']:.3f} cmds/job, "
                     f"{res['server_us_per_job']:.2f} us/job, {res['rate']:,.0f} jobs/s")
        return out


def meta(args: argparse.Namespace, server: BenchRedis, url: str) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    try:
        info = r.info("server")
    finally:
        r.close()
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        commit = ""
    return {
        "mode": "quick" if args.quick else "full",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": commit,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "redis_server": info.get("redis_version"),
        "redis_py": redis.__version__,
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "metrics": consumers.metrics_hooks()[1],
        "worker_process": "in-process: the benchmark process is the one worker process while "
                          "it measures; a concurrent producer runs in a child process; each "
                          "processing-scenario run is a process of its own (scenario e: "
                          "`python -m worker` with 1 or 2 worker processes)",
        "worker_options": {"lock_duration_s": consumers.LOCK_S,
                           "stalled_interval_s": consumers.STALLED_S},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    g.add_argument("--full", action="store_true", help="full sizes (default)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                    help="directory for latest.json, latest.md and throughput.png")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per throughput figure (median kept; default 1 quick, 3 full)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeat:
        sizes = Sizes(**{**sizes.__dict__, "repeat": args.repeat})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    stats.ClientCommands.install()
    started = time.perf_counter()
    with BenchRedis() as server:
        url = server.url
        runner = Runner(url, sizes, log)
        results: dict[str, Any] = {"meta": meta(args, server, url)}
        log(f"redis {results['meta']['redis_server']} on {url}; hiredis "
            f"{results['meta']['hiredis']}; metrics {results['meta']['metrics']}")
        results["producer"] = runner.producer()
        results["consumer"] = runner.consumer()
        results["scenarios"] = runner.scenarios()
        results["latency"] = runner.latency()
        results["memory"] = runner.memory()
        results["scaling"] = runner.scaling()
    results["meta"]["seconds"] = time.perf_counter() - started
    results["redis_cost"] = report.redis_cost(results)
    results["ratios"] = report.ratios(results)
    results["targets"] = report.targets(results)
    (out_dir / "latest.json").write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    (out_dir / "latest.md").write_text(report.markdown(results))
    chart = report.chart(results, out_dir / "throughput.png")
    log(report.markdown(results))
    log(f"wrote {out_dir}/latest.json, latest.md" + (", throughput.png" if chart else
                                                    " (no chart: matplotlib not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
