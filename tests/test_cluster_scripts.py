"""The scripts on a real Redis Cluster: the shards of one queue live on different nodes and
every script touches one slot, so a batch spanning shards runs with no CROSSSLOT."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.cluster
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamq import ops
from streamq._redis import run_calls, run_calls_sync
from streamq.keys import QueueKeys
from streamq.ops import SettleStatus
from tests.scripts.helpers import GROUP, item, token

pytestmark = pytest.mark.cluster

SHARDS = 8


@pytest.fixture
async def cluster(redis_cluster) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.startup_nodes])
    await client.initialize()
    yield client
    await client.aclose()


def _node(client: RedisCluster, key: str) -> str:
    return client.get_node_from_key(key).name


async def _read(client: RedisCluster, stream: str, consumer: str) -> list[tuple[str, dict]]:
    reply = await client.xreadgroup(GROUP, consumer, {stream: ">"}, count=100)
    return [(eid.decode(), f) for eid, f in reply[0][1]] if reply else []


async def test_shards_of_one_queue_land_on_different_nodes_and_every_script_runs(
    cluster, redis_cluster, prefix
):
    qk = QueueKeys(prefix, "ingest", SHARDS)
    nodes = {sk.index: _node(cluster, sk.stream) for sk in qk.shards}
    assert len(set(nodes.values())) == len(redis_cluster.nodes), nodes  # every primary
    for sk in qk.shards:
        shard_keys = [*sk.all_static(), sk.dedup("x"), sk.settled(token())]
        assert {_node(cluster, k) for k in shard_keys} == {nodes[sk.index]}
        await cluster.xgroup_create(sk.stream, GROUP, id="0", mkstream=True)

    # enqueue: one call per shard, all in one pipelined batch across nodes.
    replies = await run_calls(
        cluster,
        [
            ops.enqueue(
                sk,
                [item(f"now{sk.index}", dedup=True), item(f"later{sk.index}", delay_ms=60_000)],
                dedup_window_ms=60_000,
            )
            for sk in qk.shards
        ],
    )
    assert replies == [[True, True]] * SHARDS
    dup = await run_calls(
        cluster,
        [
            ops.enqueue(sk, [item(f"now{sk.index}", dedup=True)], dedup_window_ms=60_000)
            for sk in qk.shards
        ],
    )
    assert dup == [[False]] * SHARDS

    # promote: make the delayed jobs due (a score long past on any node's clock), then move.
    for sk in qk.shards:
        (member,) = await cluster.zrange(sk.delayed, 0, -1)
        await cluster.zadd(sk.delayed, {member: 1_000}, xx=True)
    promoted = await run_calls(cluster, [ops.promote(sk) for sk in qk.shards])
    assert [p.moved for p in promoted] == [1] * SHARDS

    # read, complete one entry per shard; leave the other to be reclaimed.
    held = {}
    for sk in qk.shards:
        entries = await _read(cluster, sk.stream, "w1")
        assert [f[b"id"].decode() for _eid, f in entries] == [f"now{sk.index}", f"later{sk.index}"]
        held[sk.index] = [eid for eid, _f in entries]
    done = await run_calls(
        cluster,
        [ops.complete(sk, GROUP, "w1", held[sk.index][:1], token=token()) for sk in qk.shards],
    )
    assert done == [[SettleStatus.APPLIED]] * SHARDS
    renewed = await run_calls(
        cluster, [ops.renew(sk, GROUP, "w1", held[sk.index][1:]) for sk in qk.shards]
    )
    assert renewed == [[]] * SHARDS

    # reclaim: another worker takes the held entries over; the stale worker is fenced out.
    pages = await run_calls(
        cluster,
        [
            ops.reclaim(sk, GROUP, "w2", min_idle_ms=0, count=10, max_stalled_count=1, dead_cap=10)
            for sk in qk.shards
        ],
    )
    for sk, page in zip(qk.shards, pages, strict=True):
        assert page.cursor == "0-0"
        assert [(e.entry_id, e.starts) for e in page.entries] == [(held[sk.index][1], 2)]
        assert await cluster.hget(sk.starts, held[sk.index][1]) == b"2"
    stale = await run_calls(
        cluster,
        [ops.complete(sk, GROUP, "w1", held[sk.index][1:], token=token()) for sk in qk.shards],
    )
    assert stale == [[SettleStatus.OTHER_OWNER]] * SHARDS
    fails = [
        ops.fail(
            sk,
            GROUP,
            "w2",
            entry_id=held[sk.index][1],
            dead_fields=["a", "b"],
            dead_cap=10,
            token=token(),
        )
        for sk in qk.shards
    ]
    assert await run_calls(cluster, fails) == [SettleStatus.APPLIED] * SHARDS
    # The same calls again (their replies lost): answered from each shard's memo.
    assert await run_calls(cluster, fails) == [SettleStatus.APPLIED] * SHARDS
    for sk in qk.shards:
        assert await cluster.xlen(sk.stream) == 0
        assert await cluster.xlen(sk.dead) == 1
        assert await cluster.hlen(sk.starts) == 0
        assert await cluster.xpending(sk.stream, GROUP) == {
            "pending": 0,
            "min": None,
            "max": None,
            "consumers": [],
        }


async def test_release_and_retry_run_on_every_node(cluster, prefix):
    qk = QueueKeys(prefix, "settle", SHARDS)
    for sk in qk.shards:
        await cluster.xgroup_create(sk.stream, GROUP, id="0", mkstream=True)
    await run_calls(
        cluster,
        [
            ops.enqueue(sk, [item(f"a{sk.index}"), item(f"b{sk.index}")], dedup_window_ms=1)
            for sk in qk.shards
        ],
    )
    held = {
        sk.index: [eid for eid, _f in await _read(cluster, sk.stream, "w1")] for sk in qk.shards
    }

    released = await run_calls(
        cluster,
        [ops.release(sk, GROUP, "w1", held[sk.index][:1], token=token()) for sk in qk.shards],
    )
    retried = await run_calls(
        cluster,
        [
            ops.retry(
                sk,
                GROUP,
                "w1",
                entry_id=held[sk.index][1],
                member=token(),
                delay_ms=60_000,
                values=item(f"b{sk.index}").values,
                token=token(),
            )
            for sk in qk.shards
        ],
    )

    assert released == [[SettleStatus.APPLIED]] * SHARDS
    assert retried == [SettleStatus.APPLIED] * SHARDS
    for sk in qk.shards:
        assert await cluster.xlen(sk.stream) == 1
        assert await cluster.zcard(sk.delayed) == 1


async def test_queue_wide_limiter_runs_on_the_cluster(cluster, prefix):
    qk = QueueKeys(prefix, "ingest", SHARDS)
    grants = await run_calls(
        cluster, [ops.limiter(qk, max_jobs=5, window_ms=60_000, want=2) for _ in range(4)]
    )
    assert sum(g.granted for g in grants) in (5, 2 * 4)  # 5 unless the window rolled over


async def test_script_flush_on_every_node_then_a_cross_node_batch_reloads(cluster, prefix):
    qk = QueueKeys(prefix, "flush", SHARDS)
    await cluster.script_flush()  # sent to every primary

    replies = await run_calls(
        cluster, [ops.enqueue(sk, [item(f"j{sk.index}")], dedup_window_ms=1) for sk in qk.shards]
    )

    assert replies == [[True]] * SHARDS
    for sk in qk.shards:
        assert await cluster.xlen(sk.stream) == 1


def test_sync_runner_batches_across_nodes_and_reloads_after_flush(redis_cluster, prefix):
    client = redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in redis_cluster.startup_nodes]
    )
    try:
        qk = QueueKeys(prefix, "sync", SHARDS)
        client.script_flush()
        calls = [ops.enqueue(sk, [item(f"j{sk.index}")], dedup_window_ms=1) for sk in qk.shards]

        assert run_calls_sync(client, calls) == [[True]] * SHARDS
        assert [client.xlen(sk.stream) for sk in qk.shards] == [1] * SHARDS
    finally:
        client.close()
