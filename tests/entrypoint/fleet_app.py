"""An app for the several-processes tests: every run records which process ran it.

A task waits ``sleep_s`` (so jobs are in flight when a process is killed or stopped), then
adds its ``n`` to the set ``<REDIS_PREFIX>:done`` and counts one run for its process in the
hash ``<REDIS_PREFIX>:runs`` (pid -> runs). A task with ``block_s`` first blocks its
process's event loop that long: a process that cannot answer a signal.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import QueueContract, job
from streamq.app import App
from streamq.job import Job


class Work(BaseModel):
    n: int
    sleep_s: float = 0.0
    block_s: float = 0.0


class Tasks(QueueContract, name="tasks", shards=2):
    task = job("task", Work)


app = App([Tasks])
_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:  # one per process, made on its event loop
        _client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    return _client


@app.processor(Tasks, concurrency=8, lock_duration=2, stalled_interval=0.5)
async def run_task(job: Job[Work]) -> None:
    if job.payload.block_s:
        time.sleep(job.payload.block_s)  # on purpose: the loop cannot run meanwhile
    if job.payload.sleep_s:
        await asyncio.sleep(job.payload.sleep_s)
    prefix = os.environ["REDIS_PREFIX"]
    pipe = _redis().pipeline(transaction=False)
    pipe.sadd(f"{prefix}:done", job.payload.n)
    pipe.hincrby(f"{prefix}:runs", str(os.getpid()), 1)
    await pipe.execute()
