"""Fixtures of the failover tests: a primary with a replica, and a Redis Cluster with one
replica per primary, all started by the tests on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.conftest import _binary_or_stop
from tests.support.redis_server import RedisCluster, RedisServer


@pytest.fixture
def primary() -> Iterator[RedisServer]:
    """A lone redis-server: the primary of :func:`replica`."""
    server = RedisServer(_binary_or_stop()).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def replica(primary: RedisServer) -> Iterator[RedisServer]:
    """A replica of :func:`primary`, its first sync done."""
    server = RedisServer(
        _binary_or_stop(), extra=["--replicaof", "127.0.0.1", str(primary.port)]
    ).start()
    wait_linked(server.port)
    yield server
    server.stop(kill=True)


def wait_linked(port: int, timeout_s: float = 20.0) -> None:
    """Wait until the replica on ``port`` has finished its sync with its primary."""
    import time

    deadline = time.monotonic() + timeout_s
    with redis.Redis(port=port) as client:
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica on port {port} did not link to its primary")
            time.sleep(0.02)


@pytest.fixture
def replicated_cluster() -> Iterator[RedisCluster]:
    """A real Redis Cluster of three primaries, each with one replica, that fails over
    within about two seconds of losing a primary (``cluster-node-timeout`` 1000 ms)."""
    cluster = RedisCluster(
        _binary_or_stop(), _binary_or_stop("redis-cli"), replicas=1, node_timeout_ms=1000
    ).start()
    yield cluster
    cluster.stop()
