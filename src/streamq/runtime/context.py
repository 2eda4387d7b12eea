"""What one lane's consumer is: a frozen context its policy modules share, and the clocks.

Every policy module (fetch, settle, renewal, reclaim, promotion, heartbeat) gets a
:class:`LaneContext` and the collaborators it needs, nothing else: none of them reaches into
another's state.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from streamq.backoff import BackoffLike
from streamq.contracts import Lane, QueueContract
from streamq.hooks import Hooks
from streamq.keys import QueueKeys, ShardKeys
from streamq.options import WorkerOptions

__all__ = ["LaneContext", "ServerClock", "new_token"]


def new_token() -> str:
    """A unique token for one settle call (its memo key) or one delayed record."""
    return os.urandom(8).hex()


class ServerClock:
    """This host's estimate of the Redis server's clock (due dates and idleness are Redis's).

    The offset is refreshed from every script reply that carries the server time (promote
    does, every promote interval), taking the midpoint of the round trip.
    """

    __slots__ = ("offset_ms",)

    def __init__(self) -> None:
        self.offset_ms = 0.0

    def now_ms(self) -> float:
        """Now on the Redis server's clock, in ms."""
        return time.time() * 1000 + self.offset_ms

    def observe(self, server_ms: float, sent_s: float, received_s: float) -> None:
        """Record a server time read by a call sent at ``sent_s`` and answered at
        ``received_s`` (both ``time.time()``)."""
        self.offset_ms = server_ms - (sent_s + received_s) * 500

    async def sync(self, client: Any) -> None:
        """Read the server's ``TIME`` once."""
        before = time.time()
        sec, usec = await client.time()
        self.observe(int(sec) * 1000 + int(usec) / 1000, before, time.time())


@dataclass(frozen=True, slots=True, eq=False)
class LaneContext:
    """One lane's consumer: where it reads, who it is, how it behaves, whom it tells.

    ``client`` is the command connection (settles, scripts, maintenance); blocking reads
    and lock renewal have connections of their own, handed to their modules directly.
    """

    lane: Lane
    keys: QueueKeys
    group: str
    consumer: str
    options: WorkerOptions
    hooks: Hooks
    client: Any
    clock: ServerClock = field(default_factory=ServerClock)
    cluster: bool = False

    @property
    def name(self) -> str:
        return self.lane.name

    @property
    def contract(self) -> type[QueueContract]:
        return self.lane.contract

    @property
    def shards(self) -> tuple[ShardKeys, ...]:
        return self.keys.shards

    @property
    def max_attempts(self) -> int:
        return self.options.attempts or self.contract.defaults.attempts

    @property
    def backoff(self) -> BackoffLike:
        return self.options.backoff or self.contract.defaults.backoff
