"""Driving real worker processes: start, signal, kill, and read their shared run-log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from streamq.keys import QueueKeys, ShardKeys
from tests.support.chaos_app import Chaos

ROOT = Path(__file__).resolve().parents[2]
GROUP = "streamq"
READY_S = 30.0
"""Deadline for a worker process to report ready: an interpreter start-up and imports take
well under a second idle, several seconds on a loaded CI machine."""

Record = dict[str, Any]


class RunLog:
    """The JSON-lines run-log every worker process of one test appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def records(self, ev: str | None = None, **match: Any) -> list[Record]:
        out: list[Record] = []
        with self.path.open("rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break  # a line being written right now
                rec = json.loads(line)
                if ev is not None and rec["ev"] != ev:
                    continue
                if all(rec.get(k) == v for k, v in match.items()):
                    out.append(rec)
        return out

    def runs(self, job: str) -> list[Record]:
        """The ``start`` records of ``job``, in log order."""
        return self.records("start", job=job)


class WorkerProc:
    """One ``python -m tests.support.worker_proc`` process."""

    def __init__(self, consumer: str, popen: subprocess.Popen[bytes], stderr: Path) -> None:
        self.consumer = consumer
        self.popen = popen
        self.stderr = stderr

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> float:
        """Send ``sig``; returns the wall-clock time it was sent."""
        at = time.time()
        self.popen.send_signal(sig)
        return at

    def kill(self) -> float:
        """SIGKILL and reap; returns the wall-clock time of the kill."""
        at = self.signal(signal.SIGKILL)
        self.popen.wait(10)
        return at

    async def wait_exit(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.consumer} still running after {timeout_s} s")
            await asyncio.sleep(0.02)
        return self.popen.returncode

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Workers:
    """Starts worker processes for one test and cleans them up; waits on the run-log."""

    def __init__(self, redis_url: str, prefix: str, tmp: Path) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.tmp = tmp
        self.log = RunLog(tmp / "runs.jsonl")
        self.procs: list[WorkerProc] = []
        self.keys = QueueKeys(prefix, Chaos.queue_name, Chaos.primary.shards)

    # -- processes -------------------------------------------------------------------------
    def spawn(self, consumer: str, **options: Any) -> WorkerProc:
        """Start a worker process; ``options`` are worker_proc flags (``lock=1.5``)."""
        args = [
            sys.executable, "-m", "tests.support.worker_proc",
            "--redis-url", options.pop("redis_url", self.redis_url),
            "--prefix", self.prefix,
            "--log", str(self.log.path),
            "--consumer", consumer,
        ]
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        stderr = self.tmp / f"{consumer}.stderr"
        with stderr.open("ab") as err:
            popen = subprocess.Popen(
                args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=err, stderr=err
            )
        proc = WorkerProc(consumer, popen, stderr)
        self.procs.append(proc)
        return proc

    async def start(
        self, consumer: str, *, timeout_s: float = READY_S, **options: Any
    ) -> WorkerProc:
        """Spawn a worker and wait until it reports ready."""
        proc = self.spawn(consumer, **options)
        await self.ready(proc, timeout_s=timeout_s)
        return proc

    async def start_all(self, *consumers: str, **options: Any) -> dict[str, WorkerProc]:
        """Spawn workers side by side (start-up overlaps) and wait until all are ready."""
        procs = {c: self.spawn(c, **dict(options)) for c in consumers}
        for p in procs.values():
            await self.ready(p)
        return procs

    async def ready(self, proc: WorkerProc, *, timeout_s: float = READY_S) -> None:
        await self.wait_for(
            lambda: self.log.records("ready", pid=proc.pid),
            timeout_s=timeout_s,
            what=f"worker {proc.consumer} ready",
            procs=[proc],
        )

    def cleanup(self) -> None:
        for p in self.procs:
            if p.alive:
                p.popen.send_signal(signal.SIGCONT)  # a stopped process must die too
                p.popen.kill()
            p.popen.wait(10)

    def diagnostics(self, procs: list[WorkerProc] | None = None, log_lines: int = 25) -> str:
        parts = []
        for p in procs if procs is not None else self.procs:
            state = "running" if p.alive else f"exit {p.popen.returncode}"
            parts.append(f"--- {p.consumer} (pid {p.pid}, {state}) stderr:\n{p.stderr_tail()}")
        # The run-log says what the workers did last, which a bare timeout does not.
        tail = self.log.records()[-log_lines:]
        t0 = tail[0]["t"] if tail else 0.0
        parts.append(f"--- last {len(tail)} run-log records (t relative to the first shown):")
        for rec in tail:
            fields = {k: v for k, v in rec.items() if k not in ("ev", "t", "pid")}
            parts.append(f"{rec['t'] - t0:8.3f} {rec['ev']:<12} {fields}")
        return "\n".join(parts)

    # -- waiting ---------------------------------------------------------------------------
    async def wait_for(
        self,
        probe: Callable[[], Any],
        *,
        timeout_s: float,
        what: str,
        procs: list[WorkerProc] | None = None,
    ) -> Any:
        """Poll ``probe`` (sync or async) until it returns something truthy; return that."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = probe()
            if asyncio.iscoroutine(got):
                got = await got
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {what}\n"
                    + self.diagnostics(procs)
                    + await self.redis_state()
                )
            await asyncio.sleep(0.02)

    async def wait_record(
        self, ev: str, *, timeout_s: float, what: str | None = None, **match: Any
    ) -> Record:
        """The first run-log record of ``ev`` matching ``match``, once there is one."""
        recs = await self.wait_for(
            lambda: self.log.records(ev, **match),
            timeout_s=timeout_s,
            what=what or f"{ev} {match}",
        )
        return recs[0]  # type: ignore[no-any-return]

    # -- Redis state -----------------------------------------------------------------------
    async def redis_state(self) -> str:
        """What the queue holds in Redis, per shard, for a timeout's diagnostics."""
        lines = ["\n--- Redis state:"]
        r = aioredis.Redis.from_url(
            self.redis_url, socket_timeout=2, socket_connect_timeout=2
        )
        try:
            for s in self.keys.shards:
                lines.append(
                    f"{s.name}: stream {await r.xlen(s.stream)}, "
                    f"delayed {await r.zcard(s.delayed)}, jobs {await r.hlen(s.jobs)}, "
                    f"dead {await r.xlen(s.dead)}"
                )
                for g in await r.xinfo_groups(s.stream):
                    lines.append(f"  group {g}")
                for c in await r.xinfo_consumers(s.stream, GROUP):
                    lines.append(f"  consumer {c}")
        except Exception as exc:  # Redis may be what the test took down
            lines.append(f"(unavailable: {exc!r})")
        finally:
            await r.aclose()
        return "\n".join(lines)

    def shard(self, name: str) -> ShardKeys:
        """The keys of shard ``name`` (``chaos`` or ``chaos-1``)."""
        return next(s for s in self.keys.shards if s.name == name)

    async def pending_entry(self, r: Any, shard: str, entry: str) -> dict[str, Any] | None:
        """XPENDING details of one entry (consumer, times_delivered), or None."""
        rows = await r.xpending_range(self.shard(shard).stream, GROUP, entry, entry, 1)
        return rows[0] if rows else None

    async def drained(self, r: Any) -> bool:
        """True when nothing of the queue is ready, in flight or delayed."""
        for s in self.keys.shards:
            if await r.xlen(s.stream) or await r.zcard(s.delayed) or await r.hlen(s.jobs):
                return False
            summary = await r.xpending(s.stream, GROUP)
            if summary["pending"]:
                return False
        return True

    async def dead_letters(self, r: Any) -> list[dict[str, str]]:
        out = []
        for s in self.keys.shards:
            for _eid, fields in await r.xrange(s.dead):
                out.append(
                    {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
                )
        return out

    async def consumers(self, r: Any) -> set[str]:
        """Consumer names of the group, over all shards."""
        names: set[str] = set()
        for s in self.keys.shards:
            for c in await r.xinfo_consumers(s.stream, GROUP):
                n = c["name"]
                names.add(n.decode() if isinstance(n, bytes) else n)
        return names


def completed_jobs(log: RunLog) -> dict[str, list[Record]]:
    """Job id -> its ``end`` records with outcome ``completed``."""
    out: dict[str, list[Record]] = {}
    for rec in log.records("end", outcome="completed"):
        out.setdefault(rec["job"], []).append(rec)
    return out


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))
