"""One failover run on a replicated Redis Cluster, measured.

A producer adds jobs with ids from a counter and keeps a ledger of every add that returned
success; an in-process worker (the full runtime: readers, settler, renewal thread, reclaimer)
records each run. The primary serving shard 0 is SIGKILLed mid-stream, a replica takes over,
and the killed node is started again (it rejoins as the new primary's replica, as an operator
or orchestrator would bring it back). Neither producer nor worker is restarted.

The figures: how long the producer and the worker took to succeed again on the shards of the
killed primary, how many acknowledged adds never ran (lost), and how many jobs ran twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from streamq import (
    App,
    Durability,
    Job,
    NotReplicated,
    Queue,
    QueueContract,
    RedisUnavailable,
    job,
)
from streamq.keys import QueueKeys
from streamq.runtime import WorkerManager
from tests.support.redis_server import RedisCluster

SHARDS = 6


class Item(BaseModel):
    n: int


class Failover(QueueContract, name="failover", shards=SHARDS):
    item = job("item", Item)


@dataclass
class Figures:
    """What one run measured (times in seconds from the SIGKILL)."""

    acknowledged: int = 0
    not_replicated: int = 0
    unavailable: int = 0
    producer_recovery_s: float | None = None
    worker_recovery_s: float | None = None
    lost: list[str] = field(default_factory=list)
    ran_twice: list[str] = field(default_factory=list)
    runs: int = 0

    def line(self, mode: str) -> str:
        return (
            f"[failover figures] mode={mode} acknowledged={self.acknowledged} "
            f"runs={self.runs} lost={len(self.lost)} ran_twice={len(self.ran_twice)} "
            f"unavailable_adds={self.unavailable} not_replicated_adds={self.not_replicated} "
            f"producer_recovery_s={_fmt(self.producer_recovery_s)} "
            f"worker_recovery_s={_fmt(self.worker_recovery_s)}"
        )


def _fmt(v: float | None) -> str:
    return "never" if v is None else f"{v:.2f}"


class _Run:
    def __init__(self, cluster: RedisCluster, prefix: str, durable: Durability | None) -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.durable = durable
        self.keys = QueueKeys(prefix, "failover", SHARDS)
        self.acked: dict[str, float] = {}  # job id -> when its add returned
        self.runs: list[tuple[str, float]] = []
        self.figures = Figures()
        self.killed_at: float | None = None
        self.hit_shards: set[str] = set()
        self.stop = False

    def shard_of(self, job_id: str) -> str:
        return self.keys.for_key(job_id).name

    async def produce(self, queue: Queue[Failover]) -> None:
        n = 0
        while not self.stop:
            n += 1
            job_id = f"j{n}"
            try:
                await queue.add(Failover.item, Item(n=n), job_id=job_id)
            except NotReplicated:
                self.figures.not_replicated += 1
                await asyncio.sleep(0.01)
                continue
            except RedisUnavailable:
                self.figures.unavailable += 1
                await asyncio.sleep(0.01)
                continue
            now = time.monotonic()
            self.acked[job_id] = now
            if (self.killed_at is not None and self.figures.producer_recovery_s is None
                    and self.shard_of(job_id) in self.hit_shards):
                self.figures.producer_recovery_s = now - self.killed_at
            # A steady, modest rate: the run measures failover, not throughput.
            if n % 20 == 0:
                await asyncio.sleep(0.005)

    def ran(self, job_id: str) -> None:
        now = time.monotonic()
        self.runs.append((job_id, now))
        added = self.acked.get(job_id)
        if (self.killed_at is not None and self.figures.worker_recovery_s is None
                and added is not None and added > self.killed_at
                and self.shard_of(job_id) in self.hit_shards):
            self.figures.worker_recovery_s = now - self.killed_at


async def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


async def run_failover(
    cluster: RedisCluster, prefix: str, *, durable: Durability | None, steady_s: float = 1.5
) -> Figures:
    """Produce and process, SIGKILL a primary, bring it back, drain; return the figures."""
    run = _Run(cluster, prefix, durable)
    app = App([Failover])

    @app.processor(Failover, concurrency=20, lock_duration=5, block_timeout=0.2)
    async def handle(job: Job[Item]) -> None:
        run.ran(job.id)

    host, port = cluster.startup_nodes[0]
    manager = WorkerManager(redis_url=f"redis://{host}:{port}/0", cluster=True, prefix=prefix)
    manager.register_app(app)
    client = AsyncRedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes],
        socket_timeout=5, socket_connect_timeout=2,
    )
    await client.initialize()
    await manager.start()
    producer: asyncio.Task[None] | None = None
    try:
        queue = Queue(Failover, client, prefix=prefix, durable=durable)
        producer = asyncio.create_task(run.produce(queue))
        await _wait(lambda: len(run.runs) >= 200, 30, "the first runs")
        await asyncio.sleep(steady_s)

        target = run.keys.shards[0].stream
        old = cluster.primary_port_for_key(target)
        run.hit_shards = {s.name for s in run.keys.shards
                          if cluster.primary_port_for_key(s.stream) == old}
        run.killed_at = time.monotonic()
        cluster.kill_primary(target)
        await asyncio.to_thread(cluster.wait_failover, target, old, 30)
        # The old primary comes back as the replica of the node that replaced it.
        await asyncio.to_thread(cluster.node_at(old).start)
        await _wait(lambda: run.figures.worker_recovery_s is not None
                    and run.figures.producer_recovery_s is not None,
                    40, "producer and worker to succeed again on the failed-over shards")
        await asyncio.sleep(1.0)
        run.stop = True
        await producer
        await manager.run_until_idle(timeout_s=30)
    finally:
        run.stop = True
        if producer is not None and not producer.done():
            producer.cancel()
        await manager.close_workers(timeout_s=2)
        await client.aclose()

    ran = Counter(j for j, _ in run.runs)
    f = run.figures
    f.acknowledged = len(run.acked)
    f.runs = len(run.runs)
    f.lost = sorted(set(run.acked) - set(ran))
    f.ran_twice = sorted(j for j, c in ran.items() if c > 1)
    return f
