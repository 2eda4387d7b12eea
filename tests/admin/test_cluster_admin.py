"""Dead letters and queue admin on a real Redis Cluster, where a queue's shards live on
different nodes: every request spans slots, so nothing may be sent as one transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.cluster
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import DeadLetters, QueueAdmin, SyncDeadLetters
from streamq.admin import SyncQueueAdmin
from tests.admin.contracts import Adm
from tests.admin.test_deadletters import raw_dead, shard_keys

pytestmark = pytest.mark.cluster


@pytest.fixture
async def cluster(redis_cluster: Any) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    await client.initialize()
    yield client
    await client.aclose()


@pytest.fixture
def sync_cluster(redis_cluster: Any) -> Iterator[redis.cluster.RedisCluster]:
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in redis_cluster.startup_nodes]
    client = redis.cluster.RedisCluster(startup_nodes=nodes)
    yield client
    client.close()


async def test_dead_letters_and_depth_work_across_cluster_nodes(
    cluster: RedisCluster, sync_cluster: redis.cluster.RedisCluster, prefix: str
) -> None:
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    assert cluster.get_node_from_key(s0.dead).name != cluster.get_node_from_key(s1.dead).name
    a = await raw_dead(cluster, s0, "a")
    await raw_dead(cluster, s1, "b", reason="error")
    c = await raw_dead(cluster, s1, "c")
    dead = DeadLetters(cluster, Adm, prefix=prefix)
    assert await dead.purge([f"adm-1/{c}"]) == 1

    assert {d.job_id for d in await dead.list()} == {"a", "b"}
    assert await dead.count(by_reason=True) == {"permanent": 1, "error": 1}
    depth = await QueueAdmin(cluster, Adm, prefix=prefix).depth()
    assert [(s.ready, s.in_flight, s.dead) for s in depth.shards] == [(0, 0, 1), (0, 0, 1)]

    assert await dead.retry([f"adm/{a}"]) == 1
    assert SyncDeadLetters(sync_cluster, Adm, prefix=prefix).retry(all=True) == 1
    depth = SyncQueueAdmin(sync_cluster, Adm, prefix=prefix).depth()
    assert [(s.ready, s.dead) for s in depth.shards] == [(1, 0), (1, 0)]
    assert await dead.purge(all=True) == 0
    admin = QueueAdmin(cluster, Adm, prefix=prefix)
    await admin.pause()
    assert await admin.is_paused()
    assert [c.name for c in await admin.consumers()] == ["c1"]
