"""Durable adds on a Redis Cluster with replicas: the enqueue and its WAIT go to the primary
of each shard's slot on one connection, and a slot that moved (a manual failover) is
followed to its new primary."""

from __future__ import annotations

import time

import pytest
import redis
from pydantic import BaseModel
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from streamq import Durability, JobRequest, Queue, QueueContract, SyncQueue, job
from streamq.keys import QueueKeys

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

SHARDS = 6


class Item(BaseModel):
    n: int


class Spread(QueueContract, name="durable-cluster", shards=SHARDS):
    item = job("item", Item)


def _on_replicas(cluster, prefix: str) -> int:
    """Jobs held by the replicas of the shards' primaries, read from the replicas."""
    total = 0
    for s in QueueKeys(prefix, "durable-cluster", SHARDS).shards:
        primary = cluster.primary_port_for_key(s.stream)
        for _, port in cluster.startup_nodes:
            with redis.Redis(port=port) as r:
                info = r.info("replication")
                if info.get("role") == "slave" and int(info["master_port"]) == primary:
                    r.execute_command("READONLY")
                    total += r.xlen(s.stream)
    return total


def _swap_roles(cluster, key: str) -> tuple[int, int]:
    """``CLUSTER FAILOVER`` on the replica of ``key``'s primary: both stay up, roles swap."""
    old = cluster.primary_port_for_key(key)
    for _, port in cluster.startup_nodes:
        with redis.Redis(port=port) as r:
            info = r.info("replication")
            if info.get("role") == "slave" and int(info["master_port"]) == old:
                r.execute_command("CLUSTER", "FAILOVER")
                new = port
                break
    deadline = time.monotonic() + 30
    while cluster.primary_port_for_key(key) != new:
        assert time.monotonic() < deadline, "the manual failover did not complete"
        time.sleep(0.05)
    cluster.wait_ok(30)
    return old, new


async def test_durable_adds_over_every_node_are_on_the_replicas_when_they_return(
    replicated_cluster, prefix
):
    client = AsyncRedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in replicated_cluster.startup_nodes]
    )
    try:
        queue = Queue(Spread, client, prefix=prefix, durable=Durability(replicas=1, timeout=5))
        await queue.add_bulk(JobRequest(Spread.item, Item(n=n)) for n in range(300))
        for n in range(20):
            await queue.add(Spread.item, Item(n=n), job_id=f"one-{n}")
        assert _on_replicas(replicated_cluster, prefix) == 320

        # The slot of shard 0 moves to its replica; the client still thinks it is where it
        # was, gets MOVED, refreshes its slot table and sends the add to the new primary.
        target = QueueKeys(prefix, "durable-cluster", SHARDS).shards[0]
        old, new = _swap_roles(replicated_cluster, target.stream)
        key = next(f"k{i}" for i in range(10_000)
                   if queue.shard_for(f"k{i}") == target.name)
        assert client.get_node_from_key(target.stream).port == old  # stale on purpose
        await queue.for_key(key).add(Spread.item, Item(n=1), job_id="after-move")
        assert client.get_node_from_key(target.stream).port == new  # MOVED refreshed it
        with redis.Redis(port=new) as r:
            assert r.xlen(target.stream) >= 1
        with redis.Redis(port=old) as r:  # the demoted node, now a replica, has it too
            r.execute_command("READONLY")
            ids = [f[b"id"] for _, f in r.xrange(target.stream)]
        assert b"after-move" in ids
    finally:
        await client.aclose()


def test_sync_durable_adds_follow_a_moved_slot_on_a_cluster(replicated_cluster, prefix):
    client = redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p)
                       for h, p in replicated_cluster.startup_nodes]
    )
    try:
        queue = SyncQueue(Spread, client, prefix=prefix,
                          durable=Durability(replicas=1, timeout=5))
        queue.add_bulk(JobRequest(Spread.item, Item(n=n)) for n in range(60))
        assert _on_replicas(replicated_cluster, prefix) == 60
        target = QueueKeys(prefix, "durable-cluster", SHARDS).shards[1]
        _swap_roles(replicated_cluster, target.stream)
        key = next(f"k{i}" for i in range(10_000)
                   if queue.shard_for(f"k{i}") == target.name)
        queue.for_key(key).add(Spread.item, Item(n=1), job_id="sync-after-move")
        assert _on_replicas(replicated_cluster, prefix) == 61
    finally:
        client.close()
