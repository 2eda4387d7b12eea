"""A small app for the entry-point tests: two queues, one with a secondary lane.

Notes whose ``n`` is a multiple of 5 fail every attempt (retried once, then dead-lettered),
so the worker logs failures and retries of jobs whose payload carries a canary string; a
note or chore with a negative ``n`` runs for a minute (the chore in a thread).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from pydantic import BaseModel

from streamq import Backoff, JobDefaults, QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.options import Limiter


class Note(BaseModel):
    n: int
    text: str = ""
    token: str = ""


class Notes(
    QueueContract,
    name="notes",
    shards=2,
    secondary_shards=1,
    secret_fields={"token"},
    defaults=JobDefaults(attempts=2, backoff=Backoff.fixed(timedelta(milliseconds=20))),
):
    note = job("note", Note)


class Chores(QueueContract, name="chores"):
    chore = job("chore", Note)


app = App([Notes, Chores])
not_an_app = 42


@app.processor(Notes, concurrency=4, lock_duration=2, stalled_interval=1)
async def handle_note(job: Job[Note]) -> None:
    if job.payload.n < 0:
        await asyncio.sleep(60)  # a long job, to test shutdown while it runs
    if job.payload.n % 5 == 0:
        raise RuntimeError(f"note {job.payload.n} cannot be filed")
    job.logger.debug("note filed")


@app.processor(Chores, lock_duration=2, limiter=Limiter(max_jobs=100, duration=1.0))
def do_chore(job: Job[Note]) -> None:
    if job.payload.n < 0:
        time.sleep(60)  # a sync call that outlives any shutdown timeout
    job.logger.info("chore done")
