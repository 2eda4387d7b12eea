"""Schedules on a real Redis Cluster: the clock is read on the node holding the state, and
the state keys of one queue share its slot."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import Schedules
from streamq.runtime import WorkerManager
from tests.schedules.support import assert_each_tick_once, make_app, tick_of, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
async def cluster(redis_cluster) -> AsyncIterator[RedisCluster]:  # type: ignore[no-untyped-def]
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    await client.initialize()
    yield client
    await client.aclose()


async def test_two_cluster_replicas_enqueue_each_tick_once_and_list_works(
    cluster: RedisCluster,
    redis_cluster,
    prefix: str,  # type: ignore[no-untyped-def]
) -> None:
    seen: list[str] = []

    async def record(job) -> None:  # type: ignore[no-untyped-def]
        seen.append(job.id)

    host, port = redis_cluster.startup_nodes[0]
    url = f"redis://{host}:{port}/0"
    managers = []
    try:
        for _ in range(2):
            m = WorkerManager(redis_url=url, cluster=True, prefix=prefix)
            m.register_app(make_app(record, every=0.2, grace=2.0))
            await m.start()
            managers.append(m)
        await wait_for(lambda: len(seen) >= 5, what="ticks on the cluster")
        schedules = Schedules(cluster, make_app(record), prefix=prefix)
        await schedules.pause("beat")
        (info,) = await schedules.list()
        assert info.paused
        assert info.last_run is not None
    finally:
        for m in managers:
            await m.close_workers(timeout_s=1)
    assert_each_tick_once([tick_of(i) for i in seen], 200)
    for node in cluster.get_primaries():
        keys = [k async for k in cluster.scan_iter(match=f"{prefix}:*", target_nodes=node)]
        for k in keys:
            await cluster.delete(k)
