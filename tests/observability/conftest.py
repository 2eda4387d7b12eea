"""Fixtures of the observability tests: in-process workers with their observability server,
closed and their keys removed at the end of each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamq import App, Hooks, WorkerManager
from streamq.observe import ObservabilityConfig, ObservabilityServer, start

RunWorker = Callable[..., Awaitable[tuple[WorkerManager, ObservabilityServer]]]


@pytest.fixture
async def run_worker(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> AsyncIterator[RunWorker]:
    """``await run_worker(app, hooks, **config)``: a started manager on this test's prefix and
    its observability server on a free port (``poll_interval_s`` 0.1 s unless given)."""
    made: list[tuple[WorkerManager, ObservabilityServer]] = []

    async def run(
        app: App, hooks: Hooks, *, url: str | None = None, cluster: bool = False, **config: Any
    ) -> tuple[WorkerManager, ObservabilityServer]:
        config.setdefault("metrics_port", 0)
        config.setdefault("host", "127.0.0.1")
        config.setdefault("poll_interval_s", 0.1)
        manager = WorkerManager(
            redis_url=url or redis_url, cluster=cluster, prefix=prefix, hooks=hooks
        )
        manager.register_app(app)
        await manager.start()
        server = await start(manager, ObservabilityConfig(**config))
        made.append((manager, server))
        return manager, server

    yield run
    for manager, server in made:
        await server.close()
        await manager.close_workers(timeout_s=0.5)
    keys = [k async for k in aredis.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await aredis.delete(*keys)
