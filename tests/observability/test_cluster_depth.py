"""The depth poller on a real Redis Cluster: shards live on different nodes."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import Queue
from streamq.metrics import PrometheusHooks
from tests.observability.conftest import RunWorker
from tests.observability.support import Behaviour, Obs, Work, make_app, scrape, total, wait_for
from tests.support.redis_server import RedisCluster as ClusterProcess

pytestmark = pytest.mark.cluster


async def test_depth_is_read_per_shard_across_cluster_nodes(
    run_worker: RunWorker, redis_cluster: ClusterProcess, prefix: str
) -> None:
    host, port = redis_cluster.startup_nodes[0]
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    manager = None
    try:
        state = Behaviour()
        hooks = PrometheusHooks()
        manager, server = await run_worker(
            make_app(state, concurrency=1), hooks, url=f"redis://{host}:{port}", cluster=True,
            liveness_wedge_timeout_s=60,
        )
        assert server.port is not None
        queue = Queue(Obs, client, prefix=prefix)
        await queue.add(Obs.work, Work(project_id="p", mode="block"), job_id="b")
        await wait_for(lambda: _true(bool(state.runs)), what="the blocking job to start")
        shards = {queue.shard_for(f"k{i}") for i in range(40)}
        assert shards == {"obs", "obs-1"}
        for i in range(6):
            await queue.add(Obs.work, Work(project_id="p", n=i), sharding_key=f"k{i}")
        await queue.add(Obs.work, Work(project_id="p"), delay=60)

        def backlog(s: dict) -> float:  # type: ignore[type-arg]
            return total(s, "streamq_queue_ready", queue="obs", shard="all") + total(
                s, "streamq_queue_in_flight", queue="obs", shard="all"
            )

        async def seen() -> bool:
            return backlog(await scrape(server.port)) == 7  # type: ignore[arg-type]

        await wait_for(seen, what="the poller to read every shard")
        s = await scrape(server.port)  # type: ignore[arg-type]
        # Each shard has its own reader on a cluster: a reader may hold one fetched entry
        # waiting for the slot, which counts as in flight (delivered, not settled).
        for metric in ("streamq_queue_ready", "streamq_queue_in_flight"):
            assert sum(total(s, metric, queue="obs", shard=n) for n in shards) == total(
                s, metric, queue="obs", shard="all"
            )
        assert total(s, "streamq_queue_in_flight", queue="obs", shard="all") >= 1
        assert total(s, "streamq_queue_delayed", queue="obs", shard="all") == 1
        assert total(s, "streamq_queue_consumers", queue="obs", shard="all") == 1
        state.gate.set()
        await wait_for(lambda: _true(len(state.runs) == 7), what="the backlog to run")
    finally:
        if manager is not None:
            await server.close()
            await manager.close_workers(timeout_s=0.5)
        keys = []
        for node in client.get_primaries():
            keys += [k async for k in client.scan_iter(match=f"{prefix}:*", target_nodes=node)]
        for k in keys:
            await client.delete(k)
        await client.aclose()


async def _true(v: bool) -> bool:
    return v
