"""Contracts and a worker harness for the admin tests (also loaded by the CLI tests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from streamq import App, ContractSet, Job, PermanentError, QueueContract, WorkerManager, job
from streamq.keys import shard_index


class Credential(BaseModel):
    token: str = ""
    label: str = ""


class Task(BaseModel):
    n: int
    kind: str = "ok"  # "ok", "permanent" (PermanentError) or "error" (RuntimeError)
    token: str = ""
    creds: list[Credential] = []


class Adm(QueueContract, name="adm", shards=2, secret_fields={"token"}):
    task = job("task", Task)


class Solo(QueueContract, name="solo"):
    task = job("task", Task)


CONTRACTS = ContractSet(Adm, Solo)


def key_for(contract: type[QueueContract], shard: int) -> str:
    """A sharding key that lands on ``shard``."""
    i = 0
    while shard_index(f"k{i}", contract.shards) != shard:
        i += 1
    return f"k{i}"


@dataclass
class Harness:
    manager: WorkerManager
    seen: list[tuple[str, int, int]] = field(default_factory=list)
    started: list[int] = field(default_factory=list)


async def wait_for(
    pred: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running_worker(
    redis_url: str,
    prefix: str,
    contract: type[QueueContract] = Adm,
    *,
    gate: asyncio.Event | None = None,
    **options: Any,
) -> AsyncIterator[Harness]:
    """A WorkerManager consuming ``contract``: kind 'permanent' raises PermanentError, kind
    'error' raises RuntimeError (one attempt: dead at once), anything else completes. With
    ``gate``, jobs wait for it to be set before finishing."""
    app = App([contract])
    manager = WorkerManager(redis_url=redis_url, prefix=prefix)
    h = Harness(manager)
    opts: dict[str, Any] = {
        "concurrency": 4,
        "lock_duration": 2,
        "stalled_interval": 1,
        "block_timeout": 0.1,
        "attempts": 1,
        "shutdown_timeout": 2,
    }
    opts.update(options)

    @app.processor(contract, **opts)
    async def process(job: Job[Task]) -> None:
        h.started.append(job.payload.n)
        if gate is not None:
            await gate.wait()
        h.seen.append((job.id, job.attempt, job.payload.n))
        if job.payload.kind == "permanent":
            raise PermanentError(f"project of job {job.payload.n} is gone")
        if job.payload.kind == "error":
            raise RuntimeError(f"upstream answered 503 for job {job.payload.n}")

    manager.register_app(app)
    await manager.start()
    try:
        yield h
    finally:
        await manager.close_workers(timeout_s=2)


SCHEDULED_APP: App[None] = App([Adm, Solo])
SCHEDULED_APP.schedule("nightly", Adm.task, cron="0 3 * * *", payload=Task(n=0))
SCHEDULED_APP.schedule("heartbeat", Solo.task, every=30, payload=Task(n=1))
