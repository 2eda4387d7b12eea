"""Fixtures of the chaos tests: worker processes, their run-log, a producer, key cleanup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq import Queue
from tests.chaos.harness import Workers
from tests.support.chaos_app import Chaos


@pytest.fixture
async def workers(
    redis_url: str, prefix: str, tmp_path: Path, aredis: aioredis.Redis
) -> AsyncIterator[Workers]:
    """Worker processes of this test; every one still running is killed at teardown."""
    w = Workers(redis_url, prefix, tmp_path)
    try:
        yield w
    finally:
        w.cleanup()
        keys = [k async for k in aredis.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await aredis.delete(*keys)


@pytest.fixture
def queue(aredis: aioredis.Redis, prefix: str) -> Queue[Chaos]:
    return Queue(Chaos, aredis, prefix=prefix)

