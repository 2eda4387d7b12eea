"""The one-command demo: a worker, a few thousand jobs, a live progress line and a summary.

``./scripts/demo`` sets up a virtual environment and runs this module, which:

1. uses ``REDIS_URL`` when set, else ensures the embedded Redis of ``STREAMQ_DATA_DIR``;
2. starts ``python -m worker`` as a subprocess with the example's queue flags, under a key
   prefix of its own;
3. enqueues ``--jobs`` jobs with the example producer: a first wave, then (once the worker
   flagged the throttled project) a few late events, which the producer routes to the
   secondary lane by itself;
4. shows processed + in flight + waiting = enqueued (from Redis) with the retry count (from
   the worker's ``/metrics``) until every queue is empty and the retention schedule and the
   cleaner runner have run;
5. prints a summary (with the tenant flag, the per-project cap, the schedule's ticks, the
   runner's runs and the startup hook), stops the worker with SIGTERM, and removes its keys
   (and stops the embedded Redis when it started it).

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

from examples.ingestion.contracts import CONTRACTS, Ingestion, Maintenance
from examples.ingestion.producer import FLAG_STALENESS_S, Enqueued, Plan, plan, produce
from streamq import QueueAdmin, TenantFlag, embedded
from streamq.keys import QueueKeys

__all__ = ["main", "run_demo"]

ROOT = Path(__file__).resolve().parents[2]
LANES = [lane for lane in CONTRACTS.lanes() if lane.contract is not Maintenance]
"""The lanes of the producer's jobs (the maintenance queue's jobs come from the schedule)."""
FLAG_WAIT_S = 10.0
"""How long the late wave waits for the worker to flag the throttled project."""
WORKER_ENV = {
    "WORKER_APP": "examples.ingestion.app:app",
    "QUEUE_CONSUMER_INGESTION_IS_ENABLED": "true",
    "QUEUE_CONSUMER_INGESTION_SECONDARY_IS_ENABLED": "true",
    "QUEUE_CONSUMER_EVALUATION_IS_ENABLED": "true",
    "QUEUE_CONSUMER_DELETION_IS_ENABLED": "true",
    "QUEUE_CONSUMER_MAINTENANCE_IS_ENABLED": "true",
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
    "cap_waits": "streamq_tenant_cap_waits_total",
}
SKIPPED_QUEUES = frozenset({f'queue="{Maintenance.queue_name}"'})
"""Series of the scheduled maintenance jobs: not part of the producer's jobs."""
LOG_MARKS = {
    "startup": "startup hook: event store opened",
    "ticks": "retention applied:",
    "runs": "cleaner ran:",
}
"""What the example app logs (message starts), counted from the worker's log."""


@dataclass
class Snapshot:
    """One reading of the queues (from Redis) and the worker's counters (/metrics).

    ``processed + in_flight + waiting == total`` by construction: a job enqueued and not in
    a stream or the delayed set has completed or been dead-lettered.
    """

    total: int
    """Jobs enqueued so far."""
    ready: int
    in_flight: int
    delayed: int
    dead: int
    completed: int | None
    """From /metrics; None when it is not reachable."""
    retried: int | None
    cap_waits: int | None

    @property
    def waiting(self) -> int:
        return self.ready + self.delayed

    @property
    def processed(self) -> int:
        """Completed or dead-lettered."""
        return self.total - self.in_flight - self.waiting

    @property
    def depth(self) -> int:
        return self.in_flight + self.waiting


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each counter of :data:`COUNTERS` over its labels, from Prometheus text (the
    maintenance queue's series left out)."""
    sums = dict.fromkeys(COUNTERS, 0.0)
    names = {metric: key for key, metric in COUNTERS.items()}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        key = names.get(name)
        if key is not None and rest and not any(q in rest for q in SKIPPED_QUEUES):
            sums[key] += float(rest.rsplit(" ", 1)[1])
    return sums


def count_logged(log_path: Path) -> dict[str, int]:
    """How many lines of the worker's JSON log start with each message of LOG_MARKS."""
    counts = dict.fromkeys(LOG_MARKS, 0)
    with contextlib.suppress(OSError):
        for line in log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                message = str(json.loads(line).get("message", ""))
                for key, mark in LOG_MARKS.items():
                    if message.startswith(mark):
                        counts[key] += 1
    return counts


def _scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            return parse_metrics(resp.read().decode())
    except (OSError, ValueError):
        return None


class Monitor:
    """Reads queue depth and dead letters from Redis and counters from the worker."""

    def __init__(self, client: Any, prefix: str, metrics_port: int, group: str = "streamq"
                 ) -> None:
        self.client = client
        self.metrics_port = metrics_port
        self.group = group
        self.enqueued = 0
        self.lock = asyncio.Lock()
        """Held while jobs are enqueued, so a reading never sees jobs it does not count."""
        self.shards = [s for lane in LANES
                       for s in QueueKeys(prefix, lane.name, lane.shards).shards]

    def wave_done(self, enqueued: int) -> None:
        self.enqueued = enqueued

    async def read(self) -> Snapshot:
        async with self.lock:
            pipe = self.client.pipeline(transaction=True)
            for s in self.shards:
                pipe.xlen(s.stream)
                pipe.xpending(s.stream, self.group)
                pipe.zcard(s.delayed)
                pipe.xlen(s.dead)
            counts = await pipe.execute(raise_on_error=False)
            total = self.enqueued
        length, pending, delayed, dead = 0, 0, 0, 0
        for i in range(0, len(counts), 4):
            n, p, d, x = counts[i:i + 4]
            # No group yet (the worker has not read that stream): nothing is in flight.
            in_flight = int(p.get("pending") or 0) if isinstance(p, dict) else 0
            length, pending = length + int(n), pending + in_flight
            delayed, dead = delayed + int(d), dead + int(x)
        metrics = await asyncio.to_thread(_scrape, self.metrics_port)

        def metric(key: str) -> int | None:
            return None if metrics is None else int(metrics[key])

        return Snapshot(total, max(0, length - pending), pending, delayed, dead,
                        metric("processed"), metric("retried"), metric("cap_waits"))

    async def dead_reasons(self) -> Counter[str]:
        reasons: Counter[str] = Counter()
        for s in self.shards:
            for _, fields in await self.client.xrange(s.dead):
                reasons[fields.get(b"reason", b"?").decode()] += 1
        return reasons


class Progress:
    """A line updated in place at a terminal; a line a second otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last_line = 0.0

    def show(self, elapsed: float, snap: Snapshot, *, final: bool = False) -> None:
        retried = "n/a" if snap.retried is None else str(snap.retried)
        rate = snap.processed / elapsed if elapsed > 0 else 0.0
        line = (
            f"{elapsed:5.1f}s  processed {snap.processed} (completed "
            f"{snap.processed - snap.dead}, dead-lettered {snap.dead}) + in flight "
            f"{snap.in_flight} + waiting {snap.waiting} (ready {snap.ready}, delayed "
            f"{snap.delayed}) = {snap.total} enqueued  retried {retried}  {rate:,.0f} jobs/s"
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


@dataclass
class Story:
    """What the demo saw besides the job counts: the flag, the lanes, the app's log."""

    enqueued: Enqueued
    flags: list[TenantFlag]
    late: int
    logged: dict[str, int]


def _summary(out: TextIO, story: Story, snap: Snapshot, reasons: Counter[str],
             elapsed: float, worker_rc: int | None) -> None:
    lanes = story.enqueued.lanes
    per_lane = ", ".join(f"{name} {n}" for name, n in lanes.items())
    why = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "none"
    retried = "n/a (no /metrics)" if snap.retried is None else str(snap.retried)
    completed = snap.processed - snap.dead if snap.completed is None else snap.completed
    if story.flags:
        f = story.flags[0]
        flag = (f"{f.tenant} flagged by the {f.by or 'worker'} ({f.reason}); "
                f"{story.enqueued.routed} of {story.late} late events routed to "
                f"{Ingestion.queue_name}-secondary")
    else:
        flag = f"no project flagged within {FLAG_WAIT_S:.0f} s; late events not rerouted"
    waits = "n/a" if snap.cap_waits is None else str(snap.cap_waits)
    logged = story.logged
    rows = [
        ("jobs enqueued", f"{snap.total}  ({per_lane})"),
        ("processed", str(completed)),
        ("retried", f"{retried}  (failed attempts run again)"),
        ("dead-lettered", f"{snap.dead}  ({why})"),
        ("tenant flag", flag),
        ("tenant cap", f"evaluation: at most 5 jobs of one project at once; {waits} waits "
                       "for a slot (no attempt spent)"),
        ("schedule", f"retention: {logged['ticks']} ticks run (every 1 s, once per tick "
                     "across the fleet)"),
        ("runner", f"cleaner (singleton): {logged['runs']} runs (every 0.5 s)"),
        ("startup hook", "ran: event store opened" if logged["startup"] else "did not run"),
        ("elapsed", f"{elapsed:.2f} s"),
        ("throughput", f"{snap.processed / elapsed:,.0f} jobs/s" if elapsed > 0 else "n/a"),
    ]
    if worker_rc is not None:
        rows.append(("worker", f"stopped with SIGTERM, exit code {worker_rc}"))
    print("\nSummary", file=out)
    for name, value in rows:
        print(f"  {name:<15}{value}", file=out)


async def _flag_then_wait(admin: QueueAdmin, flags: list[TenantFlag]) -> None:
    """Wait (bounded) until the worker flagged the throttled project, then for the
    producer's staleness bound, so the late wave follows the flag."""
    deadline = time.monotonic() + FLAG_WAIT_S
    while time.monotonic() < deadline:
        found = await admin.flagged_tenants()
        if found:
            flags.extend(found)
            await asyncio.sleep(FLAG_STALENESS_S)
            return
        await asyncio.sleep(0.05)


def _app_ran(log_path: Path) -> bool:
    logged = count_logged(log_path)
    return logged["ticks"] > 0 and logged["runs"] > 0


async def _produce(client: Any, the_plan: Plan, prefix: str, monitor: Monitor,
                   flags: list[TenantFlag]) -> Enqueued:
    admin = QueueAdmin(client, Ingestion, prefix=prefix)

    async def before_late() -> None:
        monitor.lock.release()  # let the progress line run while the flag is awaited
        try:
            await _flag_then_wait(admin, flags)
        finally:
            await monitor.lock.acquire()

    async with monitor.lock:
        return await produce(client, the_plan, prefix=prefix, before_late=before_late,
                             wave_done=monitor.wave_done)


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
        monitor = Monitor(client, prefix, metrics_port)
        flags: list[TenantFlag] = []
        t0 = time.monotonic()
        producing = asyncio.create_task(_produce(client, the_plan, prefix, monitor, flags))
        progress = Progress(out)
        done, snap = False, await monitor.read()
        while time.monotonic() - t0 < timeout_s:
            snap = await monitor.read()
            # Empty queues mean every job settled: settles and retries are atomic scripts,
            # so a job is always in the stream, the delayed set or the dead letters. The
            # demo also waits for a schedule tick and a runner run, to show them.
            counted = snap.completed is None or snap.completed + snap.dead >= snap.total
            if (producing.done() and snap.depth == 0 and counted
                    and await asyncio.to_thread(_app_ran, log_path)):
                done = True
                break
            progress.show(time.monotonic() - t0, snap)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - t0
        progress.show(elapsed, snap, final=True)
        if not done:
            producing.cancel()
            print(f"not finished after {timeout_s:.0f} s; worker log:\n{_tail(log_path)}",
                  file=out)
        enqueued = await producing if done else Enqueued()
        reasons = await monitor.dead_reasons()
        worker_rc = await asyncio.to_thread(stop_worker, proc)
        story = Story(enqueued, flags, len(the_plan.late), count_logged(log_path))
        _summary(out, story, snap, reasons, elapsed, worker_rc)
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
