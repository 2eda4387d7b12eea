"""Fixtures of the schedule tests: in-process WorkerManagers on the session Redis, closed and
their keys removed at the end of each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamq.app import App
from streamq.runtime import WorkerManager

MakeManager = Callable[..., WorkerManager]


@pytest.fixture
async def managers(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> AsyncIterator[MakeManager]:
    """``make(app, queues=None, **manager_kwargs)``: a registered, not yet started manager on
    this test's prefix. Every manager made is closed at teardown."""
    made: list[WorkerManager] = []

    def make(app: App[Any], *, queues: list[str] | None = None, **kw: Any) -> WorkerManager:
        kw.setdefault("redis_url", redis_url)
        kw.setdefault("prefix", prefix)
        m = WorkerManager(**kw)
        m.register_app(app, queues=queues)
        made.append(m)
        return m

    yield make
    for m in made:
        await m.close_workers(timeout_s=0.5)
    keys = [k async for k in aredis.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await aredis.delete(*keys)
