"""One failover run on a replicated Redis Cluster, measured for plain and durable adds.

Two producers add jobs side by side, each to its own queue: one with plain adds, one with
durable adds (``Durability(replicas=1)``). Each keeps a ledger of the adds that returned
success. One in-process worker (the whole runtime: readers, settler, renewal thread,
reclaimer) consumes both queues and records each run. The primary serving shard 0 of the
plain queue (and shards of the durable one) is SIGKILLed mid-stream; a replica takes over;
the killed node is started again and rejoins as the new primary's replica, as an operator
or orchestrator would bring it back. Neither the producers nor the worker is restarted.

The figures, per mode: how long the producer and the worker took to succeed again on the
shards of the killed primary, how many acknowledged adds never ran (lost), and how many
jobs ran more than once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

import redis
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


class Plain(QueueContract, name="failover-plain", shards=SHARDS):
    item = job("item", Item)


class Durable(QueueContract, name="failover-durable", shards=SHARDS):
    item = job("item", Item)


@dataclass
class Figures:
    """What one mode measured (times in seconds from the SIGKILL; the recovery fields are
    those of the last kill, the worst ones over every kill of the run)."""

    mode: str
    acknowledged: int = 0
    not_replicated: int = 0
    unavailable: int = 0
    producer_recovery_s: float | None = None
    worker_recovery_s: float | None = None
    lost: list[str] = field(default_factory=list)
    ran_twice: list[str] = field(default_factory=list)
    runs: int = 0
    worst_producer_s: float = 0.0
    worst_worker_s: float = 0.0

    def line(self) -> str:
        return (
            f"[failover figures] mode={self.mode} acknowledged={self.acknowledged} "
            f"runs={self.runs} lost={len(self.lost)} ran_twice={len(self.ran_twice)} "
            f"unavailable_adds={self.unavailable} not_replicated_adds={self.not_replicated} "
            f"producer_recovery_s={_fmt(self.producer_recovery_s)} "
            f"worker_recovery_s={_fmt(self.worker_recovery_s)} (worst over kills: "
            f"producer {_fmt(self.worst_producer_s)}, worker {_fmt(self.worst_worker_s)})"
        )


def _fmt(v: float | None) -> str:
    return "never" if v is None else f"{v:.2f}"


class _Ledger:
    """One producer's acknowledged adds and the worker's runs of its queue."""

    def __init__(self, contract: type[QueueContract], prefix: str, mode: str) -> None:
        self.contract = contract
        self.keys = QueueKeys(prefix, contract.queue_name, SHARDS)
        self.acked: dict[str, float] = {}  # job id -> when its (successful) add was sent
        self.runs: list[str] = []
        self.figures = Figures(mode)
        self.killed_at: float | None = None
        self.hit_shards: set[str] = set()
        self.shards_run_since_kill: set[str] = set()

    def hit(self, job_id: str) -> bool:
        return self.killed_at is not None and self.keys.for_key(job_id).name in self.hit_shards

    async def produce(self, queue: Queue[QueueContract], stop: asyncio.Event) -> None:
        spec = self.contract.jobs["item"]
        n = 0
        while not stop.is_set():
            n += 1
            job_id = f"{self.figures.mode}-{n}"
            started = time.monotonic()
            try:
                await queue.add(spec, Item(n=n), job_id=job_id)
            except NotReplicated:
                self.figures.not_replicated += 1
                await asyncio.sleep(0.01)
                continue
            except RedisUnavailable:
                self.figures.unavailable += 1
                await asyncio.sleep(0.01)
                continue
            now = time.monotonic()
            self.acked[job_id] = started
            # Recovered: an add sent after the kill, to a shard of the killed node, succeeded.
            if (self.figures.producer_recovery_s is None and self.hit(job_id)
                    and started > self.killed_at):  # type: ignore[operator]
                self.figures.producer_recovery_s = now - self.killed_at  # type: ignore[operator]
            if n % 20 == 0:  # a steady, modest rate: the run measures failover, not speed
                await asyncio.sleep(0.005)

    def ran(self, job_id: str) -> None:
        self.runs.append(job_id)
        added = self.acked.get(job_id)
        if added is not None and self.killed_at is not None and added > self.killed_at:
            self.shards_run_since_kill.add(self.keys.for_key(job_id).name)
        if (self.figures.worker_recovery_s is None and added is not None
                and self.hit(job_id) and added > self.killed_at):  # type: ignore[operator]
            self.figures.worker_recovery_s = time.monotonic() - self.killed_at  # type: ignore[operator]

    def recovered(self) -> bool:
        f = self.figures
        return f.producer_recovery_s is not None and f.worker_recovery_s is not None

    def every_shard_running(self) -> bool:
        """Recovered, and jobs added after the kill ran on every shard: the readers of the
        shards on live nodes must not be stuck on the dead one either."""
        return self.recovered() and len(self.shards_run_since_kill) == SHARDS

    def finish(self) -> Figures:
        ran = Counter(self.runs)
        f = self.figures
        if f.producer_recovery_s is not None and f.worker_recovery_s is not None:
            f.worst_producer_s = max(f.worst_producer_s, f.producer_recovery_s)
            f.worst_worker_s = max(f.worst_worker_s, f.worker_recovery_s)
        f.acknowledged = len(self.acked)
        f.runs = len(self.runs)
        f.lost = sorted(set(self.acked) - set(ran))
        f.ran_twice = sorted(j for j, c in ran.items() if c > 1)
        return f


async def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


async def run_failover(
    cluster: RedisCluster,
    prefix: str,
    *,
    kills: int = 1,
    steady_s: float = 1.5,
    durability: Durability | None = None,
    lag_s: float = 0.0,
) -> tuple[Figures, Figures]:
    """Produce and process, SIGKILL a primary ``kills`` times (bringing it back each time),
    drain; return the figures of plain and durable adds.

    With ``lag_s``, the replica that will be promoted falls behind for that long just before
    the kill, as a replica on a slow or congested link would: it is stopped (SIGSTOP) and the
    primary drops its link, so what the primary acknowledges meanwhile stays in its backlog
    only; the primary is SIGKILLed, then the replica resumes (SIGCONT) and is promoted. What
    plain adds were acknowledged in that window is lost; durable adds raise NotReplicated.
    Keep ``lag_s`` under the cluster-node-timeout, or the cluster fails the replica too.
    The worker is held busy from the lag until the failover, so that the jobs added in the
    window wait in the streams (as under load) instead of running at once from the primary
    that is about to die."""
    plain = _Ledger(Plain, prefix, "plain")
    durable = _Ledger(Durable, prefix, "durable")
    app = App([Plain, Durable])
    busy_until = asyncio.Event()  # cleared while the worker is to be held busy
    busy_until.set()
    for ledger in (plain, durable):
        @app.processor(ledger.contract, concurrency=20, lock_duration=5, block_timeout=0.2)
        async def handle(job: Job[Item], ledger: _Ledger = ledger) -> None:
            await busy_until.wait()
            ledger.ran(job.id)

    host, port = cluster.startup_nodes[0]
    manager = WorkerManager(redis_url=f"redis://{host}:{port}/0", cluster=True, prefix=prefix)
    manager.register_app(app)
    client = AsyncRedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes],
        socket_timeout=5, socket_connect_timeout=2,
    )
    await client.initialize()
    await manager.start()
    stop = asyncio.Event()
    producers: list[asyncio.Task[None]] = []
    try:
        producers = [
            asyncio.create_task(plain.produce(Queue(Plain, client, prefix=prefix), stop)),
            asyncio.create_task(durable.produce(Queue(
                Durable, client, prefix=prefix,
                durable=durability or Durability(replicas=1, timeout=0.5),
            ), stop)),
        ]
        await _wait(lambda: len(plain.runs) >= 200 and len(durable.runs) >= 200, 30,
                    "the first runs")
        for _ in range(kills):
            await asyncio.sleep(steady_s)
            await _kill_and_return(cluster, plain, durable, lag_s=lag_s, busy=busy_until)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*producers)
        await manager.run_until_idle(timeout_s=30)
    finally:
        stop.set()
        for p in producers:
            if not p.done():
                p.cancel()
        await manager.close_workers(timeout_s=2)
        await client.aclose()
    return plain.finish(), durable.finish()


def _replica_of(cluster: RedisCluster, primary_port: int) -> int:
    return next(port for _, port in cluster.startup_nodes
                if _master_port(port) == primary_port)


def _master_port(port: int) -> int | None:
    with redis.Redis(port=port) as r:
        info = r.info("replication")
    return int(info["master_port"]) if info.get("role") == "slave" else None


async def _kill_and_return(
    cluster: RedisCluster, *ledgers: _Ledger, lag_s: float, busy: asyncio.Event
) -> None:
    # Kill the primary of slot 0: redis-py's cluster clients take it as their default node,
    # the one they ask which keys a command has; its death once left every reader failing
    # for good. Each queue has shards there (their hash tags are fixed by the queue names).
    old = cluster.primary_port_for_slot(0)
    target = next(s.stream for s in ledgers[0].keys.shards
                  if cluster.primary_port_for_key(s.stream) == old)
    for ledger in ledgers:
        ledger.hit_shards = {s.name for s in ledger.keys.shards
                             if cluster.primary_port_for_key(s.stream) == old}
        assert ledger.hit_shards, f"no shard of {ledger.contract.queue_name} on the node"
        f = ledger.figures
        if f.producer_recovery_s is not None and f.worker_recovery_s is not None:
            f.worst_producer_s = max(f.worst_producer_s, f.producer_recovery_s)
            f.worst_worker_s = max(f.worst_worker_s, f.worker_recovery_s)
        f.producer_recovery_s = f.worker_recovery_s = None
        ledger.shards_run_since_kill = set()
    lagging = cluster.node_at(_replica_of(cluster, old)) if lag_s else None
    if lagging is not None and lagging.proc is not None:
        busy.clear()
        lagging.proc.send_signal(signal.SIGSTOP)
        with redis.Redis(port=old) as r:
            r.execute_command("CLIENT", "KILL", "TYPE", "replica")
        await asyncio.sleep(lag_s)
    killed_at = time.monotonic()
    for ledger in ledgers:
        ledger.killed_at = killed_at
    cluster.kill_primary(target)
    if lagging is not None and lagging.proc is not None:
        lagging.proc.send_signal(signal.SIGCONT)
    await asyncio.to_thread(cluster.wait_failover, target, old, 30)
    busy.set()
    # Plain adds and the worker must recover while the killed node is still down (a node
    # that answers again would hide a client still talking to it)...
    await _wait(ledgers[0].every_shard_running, 40,
                "plain adds and the worker to recover on every shard while the killed node "
                "is down")
    # ...then the old primary comes back as the replica of the node that replaced it, and
    # durable adds to its shards can be confirmed again.
    await asyncio.to_thread(cluster.node_at(old).start)
    await _wait(lambda: all(ledger.recovered() for ledger in ledgers), 40,
                "producers and worker to succeed again on the failed-over shards")
    # Ready for the next kill only once the returned node holds a full copy again.
    await asyncio.to_thread(cluster.wait_replicas_linked, 30)
