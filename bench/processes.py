"""Scenario (e): ``python -m worker`` with one worker process against ``WORKER_PROCESSES=2``.

Each run starts ``python -m worker`` (``WORKER_APP=bench.worker_app:app``: the processor of
scenario (a), one ``INCR`` per job, concurrency 10) on a fresh prefix of the benchmark's
Redis, no ``METRICS_PORT``. Once every worker process is consuming (each one has written its
heartbeat to the queue's ``workers`` hash and answers marks, and a further 0.3 s has passed
for its loops to be reading) and has drained a warm-up backlog of 100 jobs per process (its
processor's connections open then), one Lua script adds the whole backlog at once: Redis
runs nothing else meanwhile, so no job starts before the script returns. The clock starts when
it returns and stops when ``XLEN`` (polled every millisecond) reaches 0: every job processed,
acknowledged and deleted. Startup is not measured.

Queue commands per job are those the worker processes sent between two marks (counted in
each process, see :mod:`bench.worker_app`), the processor's ``INCR`` and connection
handshakes left out; server commands and Redis CPU are read around the drain.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import stats
from bench.contract import Bench
from bench.producers import stream_key
from streamq.keys import QueueKeys

_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 900.0
WARMUP_PER_PROCESS = 100
"""Jobs drained before the measured backlog, per process: its processor's first calls open
its connections, which the measurement should not include."""

_FILL = """
local n = tonumber(ARGV[1])
local fields, idpos = {}, nil
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
for i = 1, #fields, 2 do if fields[i] == 'id' then idpos = i + 1 end end
for i = 0, n - 1 do
  fields[idpos] = string.format('%032x', i)
  redis.call('XADD', KEYS[1], '*', unpack(fields))
end
return n
"""


class Fleet:
    """``python -m worker`` with ``processes`` worker processes on ``prefix``."""

    def __init__(self, url: str, prefix: str, processes: int, concurrency: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="streamq-bench-e-"))
        self.log = open(self.dir.parent / f"{self.dir.name}.log", "w+b")  # noqa: SIM115
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("METRICS_", "QUEUE_", "WORKER_", "PROMETHEUS_"))}
        env.update({
            "PYTHONPATH": os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            "WORKER_APP": "bench.worker_app:app", "REDIS_URL": url, "REDIS_PREFIX": prefix,
            "QUEUE_CONSUMER_BENCH_IS_ENABLED": "true", "WORKER_PROCESSES": str(processes),
            "BENCH_CONCURRENCY": str(concurrency), "BENCH_SNAP_DIR": str(self.dir),
            "LOG_FORMAT": "json", "LOG_LEVEL": os.environ.get("BENCH_WORKER_LOG_LEVEL", "WARNING"),
        })
        self.processes = processes
        self.proc = subprocess.Popen([sys.executable, "-m", "worker"], cwd=_ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self._marks = 0

    def _check(self) -> None:
        if self.proc.poll() is not None:
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"python -m worker exited ({self.proc.returncode}): {tail}")

    def wait_consuming(self, r: redis.Redis, workers_key: str) -> None:
        """Until every worker process has started (heartbeat written) and answers marks."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self._check()
            consumers = int(r.hlen(workers_key))
            alive = [p for p in os.listdir(self.dir) if p.startswith("alive-")]
            if consumers >= self.processes and len(alive) >= self.processes:
                time.sleep(0.3)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.processes} worker process(es) not consuming after "
                                   f"{START_TIMEOUT_S:g} s ({consumers} consumers)")
            time.sleep(0.05)

    def mark(self) -> Counter[str]:
        """The commands every process has sent so far, summed."""
        k = self._marks
        self._marks += 1
        pids = [p.removeprefix("alive-") for p in os.listdir(self.dir) if p.startswith("alive-")]
        (self.dir / f"mark-{k}").touch()
        total: Counter[str] = Counter()
        deadline = time.monotonic() + 10
        for pid in pids:
            f = self.dir / f"counts-{pid}-{k}.json"
            while not f.exists():
                self._check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker process {pid} did not answer mark {k}")
                time.sleep(0.001)
            total.update(json.loads(f.read_text()))
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)
        shutil.rmtree(self.dir, ignore_errors=True)


def _drain(r: redis.Redis, key: str) -> None:
    """Until the stream is empty: every job processed, acknowledged and deleted."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while r.xlen(key):
        if time.monotonic() > deadline:
            raise RuntimeError(f"backlog not drained: {r.xlen(key)} left")
        time.sleep(0.001)


def measure(url: str, template: dict[bytes, bytes], prefix: str, processes: int,
            concurrency: int, n: int) -> dict[str, Any]:
    """How fast ``processes`` worker processes drain a backlog of ``n`` jobs."""
    from bench.scenarios import NOT_QUEUE

    key = stream_key(prefix)
    r = redis.Redis.from_url(url)
    fleet = Fleet(url, prefix, processes, concurrency)
    try:
        fleet.wait_consuming(r, QueueKeys(prefix, Bench.queue_name, 1).workers)
        fields: list[Any] = []
        for f, v in template.items():
            fields += [f, v]
        # A warm-up backlog first: each process's first jobs open the processor's connections.
        warm = WARMUP_PER_PROCESS * processes
        r.eval(_FILL, 1, key, warm, *fields)
        _drain(r, key)
        sent0 = fleet.mark()
        r.eval(_FILL, 1, key, n, *fields)
        t0 = time.perf_counter()
        before = stats.snapshot(r)
        _drain(r, key)
        dt = time.perf_counter() - t0
        after = stats.snapshot(r)
        sent1 = fleet.mark()
        client = {k: v for k, v in (sent1 - sent0).items() if v > 0}
        done = int(r.get(f"{prefix}:counter") or 0)
        if done < warm + n:
            raise RuntimeError(f"backlog drained but only {done - warm} of {n} jobs processed")
        cost = stats.cost(dataclasses.replace(before, client={}),
                          dataclasses.replace(after, client=client), n)
        queue_cmds = sum(v for k, v in cost["client_commands"].items() if k not in NOT_QUEUE)
        server_cmds = sum(v for k, v in cost["server_commands"].items() if k not in NOT_QUEUE)
        return {"jobs": n, "seconds": dt, "rate": n / dt, "processes": processes,
                "concurrency": concurrency, **cost, "queue_cmds_per_job": queue_cmds / n,
                "server_queue_cmds_per_job": server_cmds / n}
    finally:
        fleet.stop()
        r.close()
