"""The benchmark's queue contract: one queue, one shard, a small payload."""

from __future__ import annotations

from pydantic import BaseModel

from streamq import QueueContract, job


class Ping(BaseModel):
    """A small payload (about 60 bytes of JSON); ``sent_at`` carries the enqueue time."""

    n: int
    tenant: str = "tenant-0001"
    sent_at: float = 0.0


class Bench(QueueContract, name="bench"):
    ping = job("ping", Ping)


def payload(n: int, sent_at: float = 0.0) -> Ping:
    return Ping(n=n, sent_at=sent_at)
