"""A queue whose jobs say how to behave, for the shared behavioural tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import BaseModel

from streamq import App, Backoff, JobDefaults, PermanentError, QueueContract, Retry, job
from streamq.job import Job


class Step(BaseModel):
    n: int
    # ok; fail_until:<k> (raise until attempt k); always_fail; permanent; later (Retry once)
    act: str = "ok"


class Steps(
    QueueContract,
    name="steps",
    shards=2,
    defaults=JobDefaults(attempts=3, backoff=Backoff.fixed(timedelta(milliseconds=50))),
):
    step = job("step", Step)


@dataclass
class Seen:
    runs: list[tuple[int, int]] = field(default_factory=list)  # (n, attempt)
    started_at: dict[int, float] = field(default_factory=dict)


def build_app() -> tuple[App[None], Seen]:
    """A fresh app and the record of what its processor saw."""
    app = App([Steps])
    seen = Seen()

    @app.processor(Steps, concurrency=4, block_timeout=0.2, shutdown_timeout=2)
    async def run_step(job: Job[Step]) -> None:
        seen.runs.append((job.payload.n, job.attempt))
        seen.started_at.setdefault(job.payload.n, time.time())
        act = job.payload.act
        if act.startswith("fail_until:") and job.attempt < int(act.split(":")[1]):
            raise RuntimeError(f"step {job.payload.n} not yet")
        if act == "always_fail":
            raise RuntimeError(f"step {job.payload.n} is broken")
        if act == "permanent":
            raise PermanentError(f"step {job.payload.n} cannot ever run")
        if act == "later" and [n for n, _ in seen.runs].count(job.payload.n) == 1:
            raise Retry(delay=timedelta(milliseconds=100))

    return app, seen
