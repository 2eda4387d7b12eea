"""A whole worker on a real Redis Cluster: each shard is read on its own (its keys live in
their own slot), settles, retries, delays and lock renewal all route by key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import BaseModel
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import App, Backoff, Job, JobDefaults, JobRequest, Queue, QueueContract, job
from streamq.keys import QueueKeys
from streamq.runtime import WorkerManager
from tests.runtime.support import wait_until

pytestmark = pytest.mark.cluster


class Item(BaseModel):
    n: int


class Spread(
    QueueContract,
    name="cl-worker",
    shards=6,
    defaults=JobDefaults(attempts=3, backoff=Backoff.fixed(timedelta(milliseconds=50))),
):
    item = job("item", Item)


@pytest.fixture
async def cluster(redis_cluster) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    await client.initialize()
    yield client
    await client.aclose()


async def test_worker_in_cluster_mode_runs_every_job_of_every_shard_once(
    cluster, redis_cluster, prefix
):
    nodes = {cluster.get_node_from_key(s.stream).name
             for s in QueueKeys(prefix, "cl-worker", 6).shards}
    assert len(nodes) > 1, "the shards should spread over several nodes"

    runs: list[tuple[int, int]] = []
    app = App([Spread])

    @app.processor(Spread, concurrency=20, lock_duration=2, block_timeout=0.2,
                   promote_interval=0.05)
    async def handle(job: Job[Item]) -> None:
        runs.append((job.payload.n, job.attempt))
        if job.payload.n % 10 == 0 and job.attempt == 1:
            raise RuntimeError("first attempt of every tenth job fails")

    host, port = redis_cluster.startup_nodes[0]
    manager = WorkerManager(redis_url=f"redis://{host}:{port}/0", cluster=True, prefix=prefix)
    manager.register_app(app)
    await manager.start()
    try:
        queue = Queue(Spread, cluster, prefix=prefix)
        await queue.add_bulk(JobRequest(Spread.item, Item(n=n)) for n in range(1, 201))
        await queue.add(Spread.item, Item(n=1001), delay=timedelta(milliseconds=300))
        await wait_until(lambda: len({n for n, _ in runs}) == 201, timeout_s=30,
                         what="every job to run")
        await manager.run_until_idle(timeout_s=30)
    finally:
        await manager.close_workers(timeout_s=1)

    finished = {n for n, _ in runs}
    assert finished == {*range(1, 201), 1001}
    retried = sorted(n for n, attempt in runs if attempt == 2)
    assert retried == list(range(10, 201, 10))
    assert len(runs) == 201 + len(retried)
    for s in QueueKeys(prefix, "cl-worker", 6).shards:
        assert await cluster.xlen(s.stream) == 0
        assert await cluster.xlen(s.dead) == 0
