"""Tenant flags and slots on a real Redis Cluster: each script touches one slot (the queue's
``{<queue>}`` tag), so flagging, reading, routing and slots run with no CROSSSLOT."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import Queue, QueueAdmin, ops
from streamq._redis import run_calls
from streamq.keys import QueueKeys
from tests.tenants.contracts import Tenanted, Work

pytestmark = pytest.mark.cluster


@pytest.fixture
async def cluster(redis_cluster) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    await client.initialize()
    yield client
    await client.aclose()


async def test_flags_route_and_slots_cap_on_a_cluster(cluster: RedisCluster, prefix: str) -> None:
    qk = QueueKeys(prefix, "tn", 2)
    tenant_keys = [qk.tenant_flags, qk.tenant_reasons, qk.tenant_slots("a"), qk.meta]
    assert len({cluster.get_node_from_key(k).name for k in tenant_keys}) == 1

    admin = QueueAdmin(cluster, Tenanted, prefix=prefix)
    await admin.flag_tenant("noisy", 60, reason="429s")
    assert [f.tenant for f in await admin.flagged_tenants()] == ["noisy"]
    queue = Queue(Tenanted, cluster, prefix=prefix, tenant_flags_staleness=0.1)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    await queue.add(Tenanted.work, Work(project_id="quiet"))
    assert Tenanted.secondary is not None
    side = QueueKeys(prefix, Tenanted.secondary.name, Tenanted.secondary.shards)
    assert await cluster.xlen(side.shards[0].stream) == 1
    assert await admin.unflag_tenant("noisy") is True
    await asyncio.sleep(0.1)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await cluster.xlen(side.shards[0].stream) == 1

    grants = await run_calls(cluster, [
        ops.tenant_slot_acquire(qk, "a", cap=1, lease_ms=5000, holder=h) for h in ("h1", "h2")
    ])
    assert [g.granted for g in grants] == [True, False]
    assert (await run_calls(cluster, [ops.tenant_slot_release(qk, "a", ["h1"])]))[0] == 1
    again = await run_calls(cluster, [
        ops.tenant_slot_acquire(qk, "a", cap=1, lease_ms=5000, holder="h2"),
        ops.tenant_slot_renew(qk, "a", lease_ms=5000, holders=["h2", "gone"]),
    ])
    assert again[0].granted
    assert again[1] == ["gone"]
