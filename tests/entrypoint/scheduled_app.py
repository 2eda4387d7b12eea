"""An app for the schedule, runner and startup-hook flags of ``python -m worker``.

The schedule ``heartbeat`` enqueues a ``beat`` every 0.2 s; each beat run counts one in
``<REDIS_PREFIX>:beats``. The runners ``writer-a`` and ``writer-b`` add their process's pid to
``<REDIS_PREFIX>:ran:<runner>`` and then wait to be cancelled. The startup hook
``open_database`` raises a ``ConnectionRefusedError`` (its own database refusing, not Redis)
when ``SCHEDULED_APP_DATABASE_DOWN`` is set.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.runners import RunnerContext


class Beat(BaseModel):
    note: str = ""


class Beats(QueueContract, name="beats"):
    beat = job("beat", Beat)


app = App([Beats])
app.schedule("heartbeat", Beats.beat, every=0.2, grace=2.0)
_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:  # one per process, made on its event loop
        _client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    return _client


@app.on_startup
def open_database() -> None:
    if os.environ.get("SCHEDULED_APP_DATABASE_DOWN"):
        raise ConnectionRefusedError(111, "the app's database refused the connection")


@app.processor(Beats, lock_duration=2)
async def count_beat(job: Job[Beat]) -> None:
    await _redis().incr(f"{os.environ['REDIS_PREFIX']}:beats")


async def _record(ctx: RunnerContext[Any]) -> None:
    await ctx.client.sadd(f"{ctx.prefix}:ran:{ctx.name}", os.getpid())
    await asyncio.Event().wait()  # until the worker stops


app.runner("writer-a")(_record)
app.runner("writer-b")(_record)
