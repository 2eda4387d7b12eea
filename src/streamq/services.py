"""Services: long-lived parts of a worker process beside its queue consumers.

A :class:`Service` (the scheduler, a runner) is started by :class:`WorkerManager` after its
queue workers and closed before them, with a :class:`ServiceContext` that gives it the
process's Redis connections, key prefix, consumer name, hooks and Redis status. Apps declare
services (``app.services``); ``WorkerManager.register_app`` takes them along.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from streamq.hooks import Hooks
from streamq.runtime.supervise import RedisStatus

__all__ = ["Service", "ServiceContext"]


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """What a service gets from the worker process.

    Attributes:
        client: the manager's async command client (not for blocking reads).
        sync_client: makes a new synchronous client of its own (for a renewal thread).
        async_client: makes a new async client of its own (for blocking reads).
        prefix: the key prefix shared with producers.
        consumer: this process's consumer name (unique per process).
        hooks: instrumentation.
        status: Redis reachability as the runtime sees it (report errors there).
        lanes: the queue lanes this process consumes.
        state: the app's state object (see ``App.state``).
    """

    client: Any
    sync_client: Callable[[], Any]
    async_client: Callable[[], Any]
    prefix: str
    consumer: str
    hooks: Hooks
    status: RedisStatus
    lanes: Sequence[str]
    state: Any = None


@runtime_checkable
class Service(Protocol):
    """Something a worker process runs beside its consumers."""

    name: str

    async def start(self, ctx: ServiceContext) -> None:
        """Start (return once running; run loops as tasks). Raising stops the worker."""

    async def close(self) -> None:
        """Stop and release what it holds; called once, even after a failed start."""
