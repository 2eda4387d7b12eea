"""The app the browser tests run under ``python -m worker`` with the dashboard enabled.

Queue ``pay`` (2 shards, a secondary lane that the tests leave unconsumed) with secret
fields ``api_key`` and ``number``. A ``charge`` of kind ``heal`` fails for good until
``<REDIS_PREFIX>:healed`` exists; every charge that completes adds its job id to
``<REDIS_PREFIX>:done``. The schedule ``nightly`` and the singleton runner ``reconciler`` give
the schedules page something to show.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import App, Job, PermanentError, QueueContract, job
from streamq.runners import RunnerContext


class Card(BaseModel):
    number: str = ""
    holder: str = ""


class Charge(BaseModel):
    order: str
    kind: str = "ok"
    amount_cents: int = 0
    api_key: str = ""
    card: Card = Card()


class Pay(QueueContract, name="pay", shards=2, secondary_shards=1,
          secret_fields={"api_key", "number"}):
    charge = job("charge", Charge)


app = App([Pay])
app.schedule("nightly", Pay.charge, cron="0 3 * * *", payload=Charge(order="nightly"))
_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    return _client


@app.processor(Pay, attempts=1, lock_duration=5)
async def charge(job: Job[Charge]) -> None:
    prefix = os.environ["REDIS_PREFIX"]
    if job.payload.kind == "heal" and not await _redis().exists(f"{prefix}:healed"):
        raise PermanentError(f"card processor refused order {job.payload.order}")
    await _redis().sadd(f"{prefix}:done", job.id)


@app.runner("reconciler", singleton=True, every=60)
async def reconcile(ctx: RunnerContext[Any]) -> None:
    await asyncio.sleep(0)
