"""The contract and processors the chaos tests run in real worker processes.

One queue, two shards, one job (``work``) whose payload says how long a run takes. The
``mode`` picks how a run spends that time, so one contract covers the failure shapes:

============== ==============================================================================
mode           a run of ``work``
============== ==============================================================================
ok             ``await asyncio.sleep(sleep_s)`` then returns (the well-behaved processor)
slow           a *sync* processor: ``time.sleep(sleep_s)`` in the worker's thread pool
busy_loop      blocks the event loop: ``while time.time() < t: pass`` for ``sleep_s``
sleep_forever  awaits forever (only shutdown or a kill ends it)
============== ==============================================================================
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, field_validator

from streamq import QueueContract, job
from streamq.app import App
from streamq.job import Job

MODES = ("ok", "slow", "busy_loop", "sleep_forever")

BUGGY_N = -13
"""A payload with this ``n`` trips a validator bug: it raises TypeError, which pydantic
does not turn into a ValidationError (poison that is not an InvalidPayload)."""


class Work(BaseModel):
    n: int
    sleep_s: float = 0.0

    @field_validator("n")
    @classmethod
    def _buggy_validator(cls, n: int) -> int:
        if n == BUGGY_N:
            raise TypeError("a validator bug")
        return n


class Chaos(QueueContract, name="chaos", shards=2):
    work = job("work", Work)


async def _ok(job: Job[Work]) -> None:
    await asyncio.sleep(job.payload.sleep_s)


def _slow(job: Job[Work]) -> None:
    time.sleep(job.payload.sleep_s)


async def _busy_loop(job: Job[Work]) -> None:
    until = time.time() + job.payload.sleep_s
    while time.time() < until:
        pass


async def _sleep_forever(job: Job[Work]) -> None:
    await asyncio.Event().wait()


_PROCESSORS: dict[str, Any] = {
    "ok": _ok,
    "slow": _slow,
    "busy_loop": _busy_loop,
    "sleep_forever": _sleep_forever,
}


def make_app(mode: str) -> App:
    """An app whose processor of ``Chaos`` behaves as ``mode`` says."""
    if mode not in _PROCESSORS:
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    app = App([Chaos])
    app.processor(Chaos)(_PROCESSORS[mode])
    return app
