"""A real worker process for the chaos tests.

    python -m tests.support.worker_proc --redis-url URL --prefix P --log FILE \\
        [--consumer NAME] [--lock 1.5] [--stalled 0.5] [--concurrency N] \\
        [--mode ok|slow|busy_loop|sleep_forever] [--max-stalled 1] [--shutdown-timeout S] \\
        [--block-timeout S] [--prefetch N] [--limiter MAX/SECONDS] [--app MODULE:FUNC]

It consumes the ``chaos`` queue of :mod:`tests.support.chaos_app` with a ``WorkerManager``
and appends one JSON line per event to ``--log`` (the run-log). Every worker process of a
test appends to the same file: each line is one ``write`` on an ``O_APPEND`` descriptor, so
lines never interleave, and the log survives a Redis outage, SIGKILL and SIGSTOP.

Events (each line also carries ``pid``, ``consumer`` and ``t``, the wall-clock time):

- ``ready``: the manager started and the signal handlers are in place.
- ``start`` / ``end``: one run of a job (``job``, ``attempt``, ``entry``, ``shard``;
  ``end`` adds ``outcome`` and ``error``), from the runtime's hooks.
- ``lock_lost``, ``reclaimed``, ``stalled``, ``dead``, ``payload_lost``, ``redis_error``,
  ``task_crashed``: runtime hooks.
- ``exit``: graceful shutdown finished (``signal``).

SIGTERM/SIGINT shut the manager down gracefully (:meth:`WorkerManager.run_until_signal`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from typing import Any

from streamq.hooks import Hooks, JobInfo
from streamq.options import Limiter
from streamq.runtime import WorkerManager
from streamq.runtime.manager import default_consumer_name
from tests.support.chaos_app import MODES, Chaos, make_app


class RunLog:
    """Appends JSON lines to a file shared by every worker process of a test."""

    def __init__(self, path: str, consumer: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.consumer = consumer
        self.pid = os.getpid()

    def write(self, event: str, **fields: Any) -> None:
        rec = {"ev": event, "pid": self.pid, "consumer": self.consumer, "t": time.time()}
        rec.update(fields)
        os.write(self.fd, (json.dumps(rec, default=str) + "\n").encode())


class RecordingHooks(Hooks):
    """Writes what the runtime reports to the run-log."""

    def __init__(self, log: RunLog) -> None:
        self.log = log

    def job_started(self, job: JobInfo) -> None:
        self.log.write("start", job=job.job_id, attempt=job.attempt, entry=job.entry_id,
                       shard=job.shard)

    def job_finished(
        self, job: JobInfo, outcome: str, duration_s: float, error: BaseException | None = None
    ) -> None:
        self.log.write("end", job=job.job_id, attempt=job.attempt, entry=job.entry_id,
                       shard=job.shard, outcome=outcome, duration_s=duration_s,
                       error=None if error is None else repr(error)[:200])

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: str) -> None:
        self.log.write("dead", shard=shard, job_name=job_name, reason=reason)

    def jobs_reclaimed(self, queue: str, shard: str, count: int) -> None:
        self.log.write("reclaimed", shard=shard, count=count)

    def jobs_stalled(self, queue: str, shard: str, count: int) -> None:
        self.log.write("stalled", shard=shard, count=count)

    def lock_lost(self, queue: str, shard: str, count: int) -> None:
        self.log.write("lock_lost", shard=shard, count=count)

    def payload_lost(self, queue: str, shard: str, count: int) -> None:
        self.log.write("payload_lost", shard=shard, count=count)

    def redis_error(self, queue: str | None, error: BaseException) -> None:
        self.log.write("redis_error", error=repr(error)[:200])

    def task_crashed(self, queue: str | None, task: str) -> None:
        self.log.write("task_crashed", task=task)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.support.worker_proc")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--log", required=True, help="run-log file (JSON lines, appended)")
    p.add_argument("--consumer", default=None, help="consumer name (default: host-pid-rand)")
    p.add_argument("--queue", default=Chaos.queue_name, choices=[Chaos.queue_name])
    p.add_argument("--mode", default="ok", choices=MODES)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--lock", type=float, default=1.5, help="lock_duration, seconds")
    p.add_argument("--stalled", type=float, default=0.5, help="stalled_interval, seconds")
    p.add_argument("--max-stalled", type=int, default=1, help="max_stalled_count")
    p.add_argument("--shutdown-timeout", type=float, default=5.0)
    p.add_argument("--block-timeout", type=float, default=1.0)
    p.add_argument("--attempts", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=0)
    p.add_argument("--limiter", default=None, help="global rate limit MAX_JOBS/SECONDS")
    p.add_argument("--app", default=None,
                   help="MODULE:FUNC building the app from the mode (default: chaos_app)")
    return p.parse_args(argv)


def app_factory(spec: str | None) -> Any:
    if spec is None:
        return make_app
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def limiter(spec: str | None) -> Limiter | None:
    if spec is None:
        return None
    max_jobs, _, seconds = spec.partition("/")
    return Limiter(int(max_jobs), float(seconds or 1))


async def amain(args: argparse.Namespace) -> int:
    consumer = args.consumer or default_consumer_name()
    log = RunLog(args.log, consumer)
    manager = WorkerManager(
        redis_url=args.redis_url,
        prefix=args.prefix,
        consumer_name=consumer,
        hooks=RecordingHooks(log),
    )
    manager.register_app(
        app_factory(args.app)(args.mode),
        overrides={
            args.queue: {
                "concurrency": args.concurrency,
                "lock_duration": args.lock,
                "stalled_interval": args.stalled,
                "max_stalled_count": args.max_stalled,
                "shutdown_timeout": args.shutdown_timeout,
                "block_timeout": args.block_timeout,
                "attempts": args.attempts,
                "promote_interval": 0.1,
                "prefetch": args.prefetch,
                "limiter": limiter(args.limiter),
            }
        },
    )
    await manager.start()
    # Runs at the first suspension inside run_until_signal, after its handlers are in
    # place: a test that sees "ready" may signal at once.
    asyncio.get_running_loop().call_soon(log.write, "ready")
    sig = await manager.run_until_signal()
    log.write("exit", signal=sig.name)
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
