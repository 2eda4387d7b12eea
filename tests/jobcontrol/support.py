"""Contracts and helpers shared by the job-control tests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from streamq import QueueContract, job
from streamq.keys import QueueKeys

FAST: dict[str, Any] = {"lock_duration": 1, "promote_interval": 0.02}
"""Worker options for quick tests: a 1 s lock renewed every 0.5 s (cancel requests are seen
with renewals), promotion every 20 ms."""


class Item(BaseModel):
    n: int


class Total(BaseModel):
    total: int


class Ctl(QueueContract, name="jc", shards=4):
    plain = job("plain", Item)
    tracked = job("tracked", Item, track=True)
    summed = job("summed", Item, result=Total, keep_result=timedelta(minutes=5))


def qkeys(prefix: str) -> QueueKeys:
    return QueueKeys(prefix, "jc", 4)


async def tracking_keys(r: Any, prefix: str) -> list[str]:
    """Every tracked hash and final record of the test's queue."""
    found = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
    names = [k.decode() if isinstance(k, bytes) else k for k in found]
    return sorted(n for n in names if n.endswith(":tracked") or ":result:" in n)
