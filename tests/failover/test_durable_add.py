"""Durable adds (``Queue(..., durable=Durability(...))``) on a real primary and replica:
an add returns once a replica confirmed it, and says so loudly when none did."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import (
    ConfigurationError,
    Durability,
    JobRequest,
    NotReplicated,
    Queue,
    QueueContract,
    SyncQueue,
    job,
)
from streamq.keys import QueueKeys

pytestmark = pytest.mark.timeout(60)


class Item(BaseModel):
    n: int


class Durable(QueueContract, name="durable", shards=4):
    item = job("item", Item)


def _stream_total(port: int, prefix: str) -> int:
    with redis.Redis(port=port) as client:
        return sum(client.xlen(s.stream) for s in QueueKeys(prefix, "durable", 4).shards)


def _delayed_total(port: int, prefix: str) -> int:
    with redis.Redis(port=port) as client:
        return sum(client.zcard(s.delayed) for s in QueueKeys(prefix, "durable", 4).shards)


async def test_durable_add_returns_once_the_replica_holds_the_job(primary, replica, prefix):
    client = aioredis.Redis(port=primary.port)
    try:
        queue = Queue(Durable, client, prefix=prefix,
                      durable=Durability(replicas=1, timeout=timedelta(seconds=5)))
        await queue.add(Durable.item, Item(n=1))
        await queue.add(Durable.item, Item(n=2), job_id="with-id")
        await queue.add(Durable.item, Item(n=3), delay=timedelta(hours=1))
        # Read at once from the replica: WAIT returned only after it applied the writes.
        assert _stream_total(replica.port, prefix) == 2
        assert _delayed_total(replica.port, prefix) == 1
    finally:
        await client.aclose()


async def test_durable_bulk_add_over_every_shard_is_on_the_replica_when_it_returns(
    primary, replica, prefix
):
    client = aioredis.Redis(port=primary.port)
    try:
        queue = Queue(Durable, client, prefix=prefix, durable=Durability(replicas=1))
        ids = await queue.add_bulk(JobRequest(Durable.item, Item(n=n)) for n in range(200))
        assert len(ids) == 200
        assert _stream_total(replica.port, prefix) == 200
    finally:
        await client.aclose()


async def test_durable_add_without_enough_replicas_raises_not_replicated_naming_the_job(
    primary, prefix
):
    client = aioredis.Redis(port=primary.port)
    try:
        queue = Queue(Durable, client, prefix=prefix,
                      durable=Durability(replicas=1, timeout=0.05))
        with pytest.raises(NotReplicated) as err:
            await queue.add(Durable.item, Item(n=1), job_id="lonely-1")
        e = err.value
        assert (e.queue, e.job_id, e.job_ids, e.replicas, e.wanted) == (
            "durable", "lonely-1", ["lonely-1"], 0, 1
        )
        assert "lonely-1" in str(e)
        assert "0 of 1 replica" in str(e)
        # Not rolled back: the job is on the primary and will run if the primary survives.
        assert _stream_total(primary.port, prefix) == 1
    finally:
        await client.aclose()


async def test_durable_add_asking_more_replicas_than_exist_waits_its_timeout_then_raises(
    primary, replica, prefix
):
    client = aioredis.Redis(port=primary.port)
    try:
        queue = Queue(Durable, client, prefix=prefix,
                      durable=Durability(replicas=2, timeout=0.1))
        with pytest.raises(NotReplicated) as err:
            await queue.add_bulk(JobRequest(Durable.item, Item(n=n)) for n in range(10))
        assert (err.value.replicas, err.value.wanted) == (1, 2)
        assert len(err.value.job_ids) == 10
    finally:
        await client.aclose()


async def test_durable_add_loads_flushed_scripts_and_still_waits_for_the_replica(
    primary, replica, prefix
):
    client = aioredis.Redis(port=primary.port)
    try:
        queue = Queue(Durable, client, prefix=prefix, durable=Durability(replicas=1))
        await client.script_flush()
        await queue.add(Durable.item, Item(n=1), job_id="after-flush")
        assert await queue.add(Durable.item, Item(n=1), job_id="after-flush") == "after-flush"
        assert _stream_total(replica.port, prefix) == 1
    finally:
        await client.aclose()


def test_sync_durable_add_returns_once_the_replica_holds_the_job(primary, replica, prefix):
    client = redis.Redis(port=primary.port)
    try:
        queue = SyncQueue(Durable, client, prefix=prefix, durable=Durability(replicas=1))
        queue.add(Durable.item, Item(n=1), job_id="sync-1")
        queue.add_bulk(JobRequest(Durable.item, Item(n=n)) for n in range(20))
        assert _stream_total(replica.port, prefix) == 21
        lonely = SyncQueue(Durable, client, prefix=prefix,
                           durable=Durability(replicas=3, timeout=0.05))
        with pytest.raises(NotReplicated, match="1 of 3 replica"):
            lonely.add(Durable.item, Item(n=2))
    finally:
        client.close()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"replicas": 0}, "replicas must be an integer >= 1"),
        ({"replicas": True}, "replicas must be an integer >= 1"),
        ({"timeout": 0}, "at least 1 ms"),
        ({"timeout": timedelta(0)}, "at least 1 ms"),
        ({"timeout": "1s"}, "timedelta or a number of seconds"),
    ],
)
def test_durability_refuses_options_wait_cannot_honour(kwargs, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        Durability(**kwargs)


def test_queue_refuses_a_durable_option_that_is_not_a_durability(redis_server):
    client = redis.Redis(port=redis_server.port)
    try:
        with pytest.raises(ConfigurationError, match="durable must be a Durability"):
            SyncQueue(Durable, client, durable=1)  # type: ignore[arg-type]
    finally:
        client.close()


async def test_durable_add_runs_under_the_producer_acl_role(primary, replica, prefix):
    from streamq.security import acl_rules

    with redis.Redis(port=primary.port) as admin:
        admin.execute_command("ACL", "SETUSER", "durable-producer", "on", ">pw",
                              *acl_rules("producer", prefix=prefix))
    client = aioredis.Redis(port=primary.port, username="durable-producer", password="pw")
    try:
        queue = Queue(Durable, client, prefix=prefix, durable=Durability(replicas=1))
        await queue.add(Durable.item, Item(n=1), job_id="acl-1")
        assert _stream_total(replica.port, prefix) == 1
    finally:
        await client.aclose()
