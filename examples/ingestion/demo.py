"""The one-command demo: a worker, a few thousand jobs, a live progress line and a summary.

``./scripts/demo`` sets up a virtual environment and runs this module, which:

1. uses ``REDIS_URL`` when set, else ensures the embedded Redis of ``STREAMQ_DATA_DIR``;
2. starts ``python -m worker`` as a subprocess with the example's queue flags, under a key
   prefix of its own;
3. enqueues ``--jobs`` jobs with the example producer;
4. shows processed / retried / dead-lettered / queue depth until every queue is empty (the
   depth comes from Redis, the counters from the worker's ``/metrics``);
5. prints a summary, stops the worker with SIGTERM, and removes its keys (and stops the
   embedded Redis when it started it).

    python -m examples.ingestion.demo --jobs 5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import redis.asyncio as aioredis

from examples.ingestion.contracts import CONTRACTS
from examples.ingestion.producer import plan, produce
from streamq import embedded
from streamq.keys import QueueKeys

__all__ = ["main", "run_demo"]

ROOT = Path(__file__).resolve().parents[2]
LANES = [lane for lane in CONTRACTS.lanes()]
WORKER_ENV = {
    "WORKER_APP": "examples.ingestion.app:app",
    "QUEUE_CONSUMER_INGESTION_IS_ENABLED": "true",
    "QUEUE_CONSUMER_INGESTION_SECONDARY_IS_ENABLED": "true",
    "QUEUE_CONSUMER_EVALUATION_IS_ENABLED": "true",
    "QUEUE_CONSUMER_DELETION_IS_ENABLED": "true",
    # The noisy projects' lane gets less concurrency: it cannot crowd out the others.
    "QUEUE_INGESTION_SECONDARY_CONCURRENCY": "10",
    "LOG_FORMAT": "json",
    "LOG_LEVEL": "INFO",
    "METRICS_HOST": "127.0.0.1",
}
COUNTERS = {
    "processed": "streamq_jobs_completed_total",
    "retried": "streamq_jobs_retried_total",
    "dead": "streamq_jobs_dead_lettered_total",
}


@dataclass
class Snapshot:
    """One reading of the queues and the worker's counters."""

    ready: int
    retrying: int
    dead: int
    processed: int
    retried: int | None
    """None when the worker's /metrics is not reachable."""

    @property
    def depth(self) -> int:
        return self.ready + self.retrying


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each counter of :data:`COUNTERS` over its labels, from Prometheus text."""
    sums = dict.fromkeys(COUNTERS, 0.0)
    names = {metric: key for key, metric in COUNTERS.items()}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        key = names.get(name)
        if key is not None and rest:
            sums[key] += float(rest.rsplit(" ", 1)[1])
    return sums


def _scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            return parse_metrics(resp.read().decode())
    except (OSError, ValueError):
        return None


class Monitor:
    """Reads queue depth and dead letters from Redis and counters from the worker."""

    def __init__(self, client: Any, prefix: str, metrics_port: int, enqueued: int) -> None:
        self.client = client
        self.metrics_port = metrics_port
        self.enqueued = enqueued
        self.shards = [s for lane in LANES
                       for s in QueueKeys(prefix, lane.name, lane.shards).shards]

    async def read(self) -> Snapshot:
        pipe = self.client.pipeline(transaction=False)
        for s in self.shards:
            pipe.xlen(s.stream)
            pipe.zcard(s.delayed)
            pipe.xlen(s.dead)
        counts = await pipe.execute()
        ready, retrying, dead = (sum(counts[i::3]) for i in range(3))
        metrics = await asyncio.to_thread(_scrape, self.metrics_port)
        if metrics is None:
            # Without the worker's counters, what left the queues and is not dead completed.
            processed = self.enqueued - ready - retrying - dead
            return Snapshot(ready, retrying, dead, processed, None)
        return Snapshot(ready, retrying, dead, int(metrics["processed"]),
                        int(metrics["retried"]))

    async def dead_reasons(self) -> Counter[str]:
        reasons: Counter[str] = Counter()
        for s in self.shards:
            for _, fields in await self.client.xrange(s.dead):
                reasons[fields.get(b"reason", b"?").decode()] += 1
        return reasons


class Progress:
    """A line updated in place at a terminal; a line a second otherwise."""

    def __init__(self, out: TextIO, total: int) -> None:
        self.out = out
        self.total = total
        self.tty = out.isatty()
        self.last_line = 0.0

    def show(self, elapsed: float, snap: Snapshot, *, final: bool = False) -> None:
        retried = "n/a" if snap.retried is None else str(snap.retried)
        rate = (snap.processed + snap.dead) / elapsed if elapsed > 0 else 0.0
        line = (
            f"{elapsed:5.1f}s  processed {snap.processed}/{self.total}  retried {retried}  "
            f"dead-lettered {snap.dead}  depth {snap.depth} (ready {snap.ready}, "
            f"retrying {snap.retrying})  {rate:,.0f} jobs/s"
        )
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if final else ""))
            self.out.flush()
        elif final or time.monotonic() - self.last_line >= 1.0:
            self.last_line = time.monotonic()
            print(line, file=self.out, flush=True)


def _worker_env(url: str, prefix: str, metrics_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(WORKER_ENV)
    env.update({"REDIS_URL": url, "REDIS_PREFIX": prefix, "METRICS_PORT": str(metrics_port)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


async def _wait_consuming(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with code {proc.returncode}:\n"
                               f"{_tail(log_path)}")
        if _logged(log_path, "consuming"):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the worker did not start within {timeout_s} s:\n{_tail(log_path)}")


def start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m worker`` with ``env``, its output (JSON logs) in ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "worker"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env=env,
        )


def _logged(log_path: Path, message: str) -> bool:
    for line in log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            if json.loads(line).get("message") == message:
                return True
    return False


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no worker log)"


def stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM the worker and wait for it; its exit code (SIGKILL after ``timeout_s``)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


async def _delete_prefix(client: Any, prefix: str) -> None:
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            await client.unlink(*batch)
            batch.clear()
    if batch:
        await client.unlink(*batch)


def _summary(out: TextIO, lanes: Counter[str], snap: Snapshot, reasons: Counter[str],
             elapsed: float, worker_rc: int | None) -> None:
    total = sum(lanes.values())
    finished = snap.processed + snap.dead
    per_lane = ", ".join(f"{name} {n}" for name, n in lanes.items())
    why = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "none"
    retried = "n/a (no /metrics)" if snap.retried is None else str(snap.retried)
    rows = [
        ("jobs enqueued", f"{total}  ({per_lane})"),
        ("processed", str(snap.processed)),
        ("retried", f"{retried}  (failed attempts run again)"),
        ("dead-lettered", f"{snap.dead}  ({why})"),
        ("elapsed", f"{elapsed:.2f} s"),
        ("throughput", f"{finished / elapsed:,.0f} jobs/s" if elapsed > 0 else "n/a"),
    ]
    if worker_rc is not None:
        rows.append(("worker", f"stopped with SIGTERM, exit code {worker_rc}"))
    print("\nSummary", file=out)
    for name, value in rows:
        print(f"  {name:<15}{value}", file=out)


async def _run_jobs(client: Any, url: str, prefix: str, jobs: int, timeout_s: float,
                    log_path: Path, out: TextIO) -> tuple[bool, int | None]:
    metrics_port = _free_port()
    proc = start_worker(_worker_env(url, prefix, metrics_port), log_path)
    worker_rc: int | None = None
    try:
        await _wait_consuming(proc, log_path, timeout_s=20)
        print(f"worker: pid {proc.pid}, keys under {prefix}:*, metrics on "
              f"http://127.0.0.1:{metrics_port}/metrics, log in {log_path}", file=out)
        the_plan = plan(jobs)
        t0 = time.monotonic()
        lanes = await produce(client, the_plan, prefix=prefix)
        print(f"producer: enqueued {len(the_plan)} jobs in {time.monotonic() - t0:.2f} s",
              file=out, flush=True)
        monitor = Monitor(client, prefix, metrics_port, len(the_plan))
        progress = Progress(out, len(the_plan))
        done, snap = False, await monitor.read()
        while time.monotonic() - t0 < timeout_s:
            snap = await monitor.read()
            # Empty queues mean every job settled: settles and retries are atomic scripts,
            # so a job is always in the stream, the delayed set or the dead letters.
            counted = snap.retried is None or snap.processed + snap.dead >= len(the_plan)
            if snap.depth == 0 and counted:
                done = True
                break
            progress.show(time.monotonic() - t0, snap)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - t0
        progress.show(elapsed, snap, final=True)
        if not done:
            print(f"not finished after {timeout_s:.0f} s; worker log:\n{_tail(log_path)}",
                  file=out)
        reasons = await monitor.dead_reasons()
        worker_rc = await asyncio.to_thread(stop_worker, proc)
        _summary(out, lanes, snap, reasons, elapsed, worker_rc)
        return done and worker_rc == 0, worker_rc
    finally:
        if worker_rc is None:
            await asyncio.to_thread(stop_worker, proc)


async def run_demo(*, jobs: int = 5000, timeout_s: float = 50.0, keep_redis: bool = False,
                   out: TextIO = sys.stdout) -> bool:
    """Run the demo; True when every job settled and the worker exited 0."""
    url = os.environ.get("REDIS_URL")
    server: embedded.EmbeddedRedis | None = None
    if url:
        print(f"redis: {url} (REDIS_URL)", file=out)
    else:
        data_dir = Path(os.environ.get("STREAMQ_DATA_DIR", ROOT / ".streamq"))
        port = int(os.environ.get("STREAMQ_EMBEDDED_PORT", embedded.DEFAULT_PORT))
        server = await asyncio.to_thread(embedded.ensure, data_dir, port=port)
        url = server.url
        print(f"redis: {url} (embedded, {'started' if server.started else 'already running'},"
              f" data in {server.data_dir})", file=out)
    prefix = f"demo-{os.urandom(4).hex()}"
    log_path = Path(os.environ.get("STREAMQ_DATA_DIR", ROOT / ".streamq")) / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    client = aioredis.Redis.from_url(url)
    try:
        ok, _ = await _run_jobs(client, url, prefix, jobs, timeout_s, log_path, out)
        return ok
    finally:
        await _delete_prefix(client, prefix)
        await client.aclose()
        if server is not None and server.started and not keep_redis:
            await asyncio.to_thread(server.stop)
            print("redis: stopped the embedded Redis this demo started", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.ingestion.demo",
                                     description="Run the ingestion example end to end.")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs to enqueue (default 5000)")
    parser.add_argument("--timeout", type=float, default=50.0,
                        help="give up after this many seconds (default 50)")
    parser.add_argument("--keep-redis", action="store_true",
                        help="leave an embedded Redis this demo started running")
    ns = parser.parse_args(argv)
    try:
        ok = asyncio.run(run_demo(jobs=ns.jobs, timeout_s=ns.timeout, keep_redis=ns.keep_redis))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
