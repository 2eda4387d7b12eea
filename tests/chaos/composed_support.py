"""Helpers of the composed-fault tests: a flaky app, private servers, and the fleet's ledger.

The ledger reads the run-log every worker process of a test appends to and says, per job,
what the fleet reported: its runs (``start``) and its confirmed outcomes (``end``). The
composed tests prove their invariants on it: each job completed exactly once in
``completed`` end records, no job lost.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from streamq.app import App
from streamq.job import Job
from tests.chaos.harness import GROUP, RunLog, Workers
from tests.support.chaos_app import Chaos, Work
from tests.support.redis_server import RedisServer, find_binary

FLAKY_EVERY = 4
"""With :func:`make_flaky_app`, a job whose ``n`` is a multiple of this fails its first
attempt after its sleep (a retry: new envelope in the delayed set, which needs memory) and
then succeeds."""

FLAKY_APP = "tests.chaos.composed_support:make_flaky_app"
"""The ``--app`` flag of a worker process running :func:`make_flaky_app`."""


def is_flaky(n: int) -> bool:
    return n % FLAKY_EVERY == 0


class FlakyError(RuntimeError):
    """The first attempt of a flaky job."""


async def _flaky(job: Job[Work]) -> None:
    await asyncio.sleep(job.payload.sleep_s)
    if job.attempt == 1 and is_flaky(job.payload.n):
        raise FlakyError(f"first attempt of job n={job.payload.n} fails")


def make_flaky_app(mode: str) -> App:
    """The chaos contract with an ``ok``-mode processor whose flaky jobs fail once."""
    if mode != "ok":
        raise ValueError(f"the flaky app only runs mode 'ok', not {mode!r}")
    app = App([Chaos])
    app.processor(Chaos)(_flaky)
    return app


@contextmanager
def private_server(*, appendonly: bool = False, extra: list[str] | None = None
                   ) -> Iterator[RedisServer]:
    """A redis-server of this test's own (to restart it, or change its config)."""
    import pytest  # not at the top: worker processes import this module for the flaky app

    binary = find_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server binary found")
        pytest.skip("no redis-server binary found")
    server = RedisServer(
        binary, appendonly=appendonly,
        extra=["--maxmemory-policy", "noeviction", *(extra or [])],
    ).start()
    try:
        yield server
    finally:
        server.stop(kill=True)
        shutil.rmtree(server.dir, ignore_errors=True)


async def pending_of(r: Any, workers: Workers, consumer: str) -> list[str]:
    """Entries pending for ``consumer`` (XPENDING by consumer) over every shard, each as
    ``<shard>/<entry id>`` (an entry id is unique within its shard's stream only)."""
    out: list[str] = []
    for s in workers.keys.shards:
        rows = await r.xpending_range(s.stream, GROUP, min="-", max="+", count=10_000,
                                      consumername=consumer)
        out += [f"{s.name}/{row['message_id'].decode()}" for row in rows]
    return out


class Ledger:
    """What the fleet's run-log says about every job."""

    def __init__(self, log: RunLog) -> None:
        self.starts = log.records("start")
        self.ends = log.records("end")
        self.completed = Counter(r["job"] for r in self.ends if r["outcome"] == "completed")
        self.outcomes = Counter(r["outcome"] for r in self.ends)
        self.runs = Counter(r["job"] for r in self.starts)

    def completed_total(self) -> int:
        return sum(self.completed.values())

    def not_once(self, ids: list[str]) -> dict[str, int]:
        """Jobs of ``ids`` not completed exactly once, with their completed count."""
        return {j: self.completed[j] for j in ids if self.completed[j] != 1}

    def run_more_than_once(self, ids: list[str]) -> dict[str, int]:
        return {j: self.runs[j] for j in ids if self.runs[j] > 1}

    def extra(self, ids: list[str]) -> set[str]:
        """Completed jobs that are not in ``ids``."""
        return set(self.completed) - set(ids)


def assert_each_completed_once(log: RunLog, ids: list[str], *, but: Collection[str] = ()
                               ) -> Ledger:
    """Every job of ``ids`` but ``but`` has exactly one ``completed`` end record, the jobs of
    ``but`` none, and the fleet's completed total is exactly the number completed."""
    ledger = Ledger(log)
    want = [j for j in ids if j not in but]
    assert ledger.not_once(want) == {}, "jobs not completed exactly once"
    assert {j: ledger.completed[j] for j in but if ledger.completed[j]} == {}
    assert ledger.extra(ids) == set()
    assert ledger.completed_total() == len(want)
    return ledger


@asynccontextmanager
async def fleet_on(server: RedisServer, prefix: str, tmp: Path
                   ) -> AsyncIterator[tuple[Workers, aioredis.Redis]]:
    """Worker processes and a client on ``server``; workers killed and keys dropped after."""
    workers = Workers(server.url, prefix, tmp)
    client = aioredis.Redis(port=server.port)
    try:
        yield workers, client
    finally:
        workers.cleanup()
        await client.aclose()


GRACE_S = 3.0
"""How long a drained queue may still owe completed records (a settle Redis applied whose
reply the worker is still turning into its end record)."""


async def wait_all_completed(workers: Workers, r: Any, ids: list[str], *, timeout_s: float
                             ) -> Ledger:
    """Wait until every job of ``ids`` has a ``completed`` end record and the queue is
    drained. Fails with the fleet's outcomes, not a bare timeout: at the deadline, or once the
    queue stayed drained for ``GRACE_S`` with jobs still not completed (nothing left to run)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    drained_since: float | None = None
    while True:
        ledger = Ledger(workers.log)
        missing = [j for j in ids if not ledger.completed[j]]
        drained = await workers.drained(r)
        if drained and not missing:
            return ledger
        now = loop.time()
        drained_since = (drained_since or now) if drained else None
        stuck = drained_since is not None and now - drained_since > GRACE_S
        if stuck or now > deadline:
            why = "the queue drained" if stuck else f"{timeout_s} s passed"
            example = {j: [(e["ev"], e["consumer"], e["shard"], e["entry"], e.get("outcome"))
                           for e in workers.log.records(job=j)] for j in missing[:3]}
            raise AssertionError(
                f"{why} with {len(missing)} of {len(ids)} jobs not completed; outcomes "
                f"{dict(ledger.outcomes)}; the first ones' runs: {example}\n"
                + workers.diagnostics()
            )
        await asyncio.sleep(0.05)
