"""The producers (async ``Queue``, sync ``SyncQueue``) against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, Field
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq import (
    ConfigurationError,
    Hooks,
    InvalidPayload,
    JobDefaults,
    JobRequest,
    PayloadTooLarge,
    QueueContract,
    RedisOutOfMemory,
    RedisRefused,
    RedisUnavailable,
    SyncQueue,
    UnknownJob,
    job,
    ops,
)
from streamq import Queue as AsyncQueue
from streamq._redis import run_calls
from streamq.envelope import FIELD_NAMES, Envelope, decode_entry
from streamq.keys import QueueKeys, shard_index
from tests.support.redis_server import RedisServer, find_binary, free_port


class Event(BaseModel):
    project_id: str
    event_id: str
    body: str = ""


class Other(BaseModel):
    project_id: str
    n: int


class Ingestion(
    QueueContract, name="ingestion", shards=4, secondary_shards=2, tenant_field="project_id"
):
    ingest_event = job("ingest-event", Event)
    other = job("other", Other)


class Seven(QueueContract, name="seven", shards=7):
    ev = job("ev", Event)


class Tiny(QueueContract, name="tiny", defaults=JobDefaults(max_payload_bytes=64)):
    ev = job("ev", Event)


class Quick(QueueContract, name="quick", defaults=JobDefaults(dedup_window=0.05)):
    ev = job("ev", Event)


class Stranger(QueueContract, name="stranger"):
    ingest_event = job("ingest-event", Event)


def ev(i: int | str = 1, project: str = "p1", body: str = "") -> Event:
    return Event(project_id=project, event_id=f"e{i}", body=body)


# -- helpers reading the real Redis state ---------------------------------------------------------


async def all_keys(r: aioredis.Redis, prefix: str) -> list[str]:
    return sorted([k.decode() async for k in r.scan_iter(match=f"{prefix}:*")])


async def shard_entries(
    r: aioredis.Redis, prefix: str, lane: str = "ingestion", shards: int = 4
) -> list[list[tuple[str, dict[bytes, bytes]]]]:
    out = []
    for sk in QueueKeys(prefix, lane, shards).shards:
        out.append([(eid.decode(), f) for eid, f in await r.xrange(sk.stream)])
    return out


def job_ids(entries: list[list[tuple[str, dict[bytes, bytes]]]]) -> list[str]:
    return [f[b"id"].decode() for shard in entries for _, f in shard]


async def server_ms(r: aioredis.Redis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def delayed_records(
    r: aioredis.Redis, prefix: str, shard: int, lane: str = "ingestion", shards: int = 4
) -> list[tuple[str, int, dict[str, str]]]:
    """Each delayed record of a shard, soonest first: its member, due score and fields."""
    sk = QueueKeys(prefix, lane, shards).shards[shard]
    out = []
    for member, score in await r.zrange(sk.delayed, 0, -1, withscores=True):
        stored = json.loads(await r.hget(sk.jobs, member) or b"[]")
        out.append(
            (member.decode(), int(score), dict(zip(stored[0::2], stored[1::2], strict=True)))
        )
    return out


@pytest.fixture
def queue(aredis: aioredis.Redis, prefix: str) -> AsyncQueue[Ingestion]:
    return AsyncQueue(Ingestion, aredis, prefix=prefix)


class Recorder(Hooks):
    """Records every producer hook call."""

    def __init__(self, carrier: dict[str, str] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.carrier = carrier

    def enqueue_context(
        self, queue: str, job_name: str, job_id: str, tenant: str | None
    ) -> AbstractContextManager[dict[str, str] | None]:
        self.calls.append(("context", queue, job_name, tenant))
        return nullcontext(self.carrier)

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        self.calls.append(("enqueued", queue, shard, job_name, delayed))

    def enqueue_duplicate(self, queue: str, shard: str, job_name: str) -> None:
        self.calls.append(("duplicate", queue, shard, job_name))

    def enqueue_rejected(self, queue: str, job_name: str, reason: str) -> None:
        self.calls.append(("rejected", queue, job_name, reason))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == kind]


# -- add and sharding -----------------------------------------------------------------------------


async def test_add_returns_the_id_and_writes_one_entry_on_the_keys_shard(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    before = int(time.time() * 1000)
    job_id = await queue.for_key("project-1").add(Ingestion.ingest_event, ev(7))
    assert isinstance(job_id, str)
    assert len(job_id) == 32
    entries = await shard_entries(aredis, prefix)
    assert [len(s) for s in entries] == [0, 0, 0, 1]  # sha256 pins "project-1" to shard 3
    eid, fields = entries[3][0]
    assert list(fields) == [n.encode() for n in FIELD_NAMES]
    raw = decode_entry(eid, fields)
    env = Envelope.from_raw(raw, Event)
    assert (env.id, env.name, env.attempt, env.payload) == (job_id, "ingest-event", 1, ev(7))
    assert fields[b"due"] == b""
    assert before <= env.timestamp <= int(time.time() * 1000)
    assert await all_keys(aredis, prefix) == [
        f"{prefix}:{{ingestion:3}}:stream",
        f"{prefix}:{{ingestion}}:meta",  # the contract record, written by the first send
    ]


async def test_sharding_key_argument_matches_for_key(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    await queue.add(Ingestion.ingest_event, ev(1), sharding_key="project-2")
    await queue.for_key("project-2").add(Ingestion.ingest_event, ev(2))
    entries = await shard_entries(aredis, prefix)
    assert [len(s) for s in entries] == [2, 0, 0, 0]
    assert queue.shard_for("project-2") == "ingestion"


GOLDEN_KEYS = [
    "",
    "a",
    "project-1",
    "project-2",
    "tenant-42-event-7",
    "user@example.com",
    "ünïcödé",
    "0",
    "the quick brown fox",
    "x" * 300,
]
GOLDEN_4 = [2, 2, 3, 0, 0, 1, 2, 2, 2, 1]
GOLDEN_7 = [1, 2, 3, 5, 5, 2, 0, 6, 5, 3]


def test_shard_for_matches_golden_vectors_for_4_and_7_shards(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q4 = AsyncQueue(Ingestion, aredis, prefix=prefix)
    q7 = AsyncQueue(Seven, aredis, prefix=prefix)
    assert [shard_index(k, 4) for k in GOLDEN_KEYS] == GOLDEN_4
    assert [shard_index(k, 7) for k in GOLDEN_KEYS] == GOLDEN_7
    assert [q4.shard_for(k) for k in GOLDEN_KEYS] == [q4.shard_names()[i] for i in GOLDEN_4]
    assert [q7.shard_for(k) for k in GOLDEN_KEYS] == [q7.shard_names()[i] for i in GOLDEN_7]


async def test_golden_keys_land_on_their_pinned_shard_in_redis(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q7 = AsyncQueue(Seven, aredis, prefix=prefix)
    for i, key in enumerate(GOLDEN_KEYS):
        await q7.for_key(key).add(Seven.ev, ev(i))
    entries = await shard_entries(aredis, prefix, "seven", 7)
    where = {f[b"payload"]: s for s, shard in enumerate(entries) for _, f in shard}
    for i in range(len(GOLDEN_KEYS)):
        assert where[ev(i).model_dump_json().encode()] == GOLDEN_7[i]


async def test_one_key_never_spreads_over_shards(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    keyed = queue.for_key("tenant-42-event-7")
    for i in range(20):
        await keyed.add(Ingestion.ingest_event, ev(i))
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [20, 0, 0, 0]


async def test_jobs_without_a_key_spread_over_all_shards(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    for i in range(40):
        await queue.add(Ingestion.ingest_event, ev(i))
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [10, 10, 10, 10]


async def test_short_lived_producers_do_not_all_write_to_shard_zero(
    aredis: aioredis.Redis, prefix: str
) -> None:
    for i in range(40):
        await AsyncQueue(Ingestion, aredis, prefix=prefix).add(Ingestion.ingest_event, ev(i))
    used = [len(s) for s in await shard_entries(aredis, prefix)]
    assert sum(used) == 40
    assert sum(1 for n in used if n) >= 2


async def test_job_id_without_a_key_picks_the_ids_shard(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    await queue.add(Ingestion.ingest_event, ev(), job_id="project-1")
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [0, 0, 0, 1]


def test_shard_names_and_name_of_each_lane(aredis: aioredis.Redis) -> None:
    q = AsyncQueue(Ingestion, aredis)
    assert q.name == "ingestion"
    assert q.shard_names() == ["ingestion", "ingestion-1", "ingestion-2", "ingestion-3"]
    sec = AsyncQueue(Ingestion, aredis, secondary=True)
    assert sec.name == "ingestion-secondary"
    assert sec.shard_names() == ["ingestion-secondary", "ingestion-secondary-1"]
    assert q.for_key("x").shard_names() == q.shard_names()


# -- secondary lane -------------------------------------------------------------------------------


async def test_secondary_true_writes_to_the_secondary_lane(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = AsyncQueue(Ingestion, aredis, prefix=prefix, secondary=True)
    await q.for_key("a").add(Ingestion.ingest_event, ev())  # "a" -> shard 2 % 2 == 0
    await q.add(Ingestion.other, Other(project_id="p", n=1), sharding_key="project-1")
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [0, 0, 0, 0]
    secondary = await shard_entries(aredis, prefix, "ingestion-secondary", 2)
    assert [len(s) for s in secondary] == [1, 1]
    assert shard_index("a", 2) == 0
    assert shard_index("project-1", 2) == 1


async def test_secondary_when_rule_routes_matching_jobs_only(
    aredis: aioredis.Redis, prefix: str
) -> None:
    seen: list[tuple[str, BaseModel]] = []

    def noisy(spec: Any, payload: BaseModel) -> bool:
        seen.append((spec.name, payload))
        return getattr(payload, "project_id", None) == "noisy"

    q = AsyncQueue(Ingestion, aredis, prefix=prefix, secondary_when=noisy)
    for i in range(6):
        await q.add(Ingestion.ingest_event, ev(i, project="noisy" if i % 2 else "calm"))
    primary = await shard_entries(aredis, prefix)
    secondary = await shard_entries(aredis, prefix, "ingestion-secondary", 2)
    assert sum(map(len, primary)) == 3
    assert sum(map(len, secondary)) == 3
    assert {json.loads(f[b"payload"])["project_id"] for s in secondary for _, f in s} == {"noisy"}
    assert seen[0] == ("ingest-event", ev(0, project="calm"))


def test_secondary_lane_on_a_contract_without_one_is_refused(aredis: aioredis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="declares no secondary lane"):
        AsyncQueue(Seven, aredis, secondary=True)
    with pytest.raises(ConfigurationError, match="declares no secondary lane"):
        AsyncQueue(Seven, aredis, secondary_when=lambda spec, p: True)


# -- the client kind -------------------------------------------------------------------------------


async def test_sync_queue_with_an_asyncio_client_is_refused_at_construction(
    aredis: aioredis.Redis, prefix: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        SyncQueue(Ingestion, aredis, prefix=prefix)  # type: ignore[arg-type]
    message = str(err.value)
    assert "SyncQueue needs a redis.Redis or redis.RedisCluster client" in message
    assert "got redis.asyncio.client.Redis; use Queue for this client" in message
    assert err.value.queue == "ingestion"
    assert await all_keys(aredis, prefix) == []


def test_queue_with_a_sync_client_is_refused_at_construction(
    sredis: redis.Redis, prefix: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        AsyncQueue(Ingestion, sredis, prefix=prefix)  # type: ignore[arg-type]
    message = str(err.value)
    assert "Queue needs a redis.asyncio.Redis or redis.asyncio.RedisCluster client" in message
    assert "got redis.client.Redis; use SyncQueue for this client" in message
    assert list(sredis.scan_iter(match=f"{prefix}:*")) == []


@pytest.mark.parametrize("client", [None, "redis://localhost", object()])
def test_something_that_is_no_redis_client_is_refused(client: object) -> None:
    for kind in (AsyncQueue, SyncQueue):
        with pytest.raises(ConfigurationError, match="needs a redis") as err:
            kind(Ingestion, client)  # type: ignore[arg-type]
        assert "use " not in str(err.value)


async def test_cluster_clients_and_fakeredis_clients_of_the_right_kind_are_accepted() -> None:
    fakeredis = pytest.importorskip("fakeredis")
    # Built without __init__: a cluster client connects when constructed; only its kind matters.
    sync_cluster = redis.RedisCluster.__new__(redis.RedisCluster)
    async_cluster = aioredis.RedisCluster.__new__(aioredis.RedisCluster)
    assert SyncQueue(Ingestion, sync_cluster).redis is sync_cluster
    assert AsyncQueue(Ingestion, async_cluster).redis is async_cluster

    fake = fakeredis.FakeRedis()  # without Lua: a ready add without job_id is a plain XADD
    SyncQueue(Ingestion, fake, prefix="f").add(Ingestion.ingest_event, ev(), sharding_key="x")
    assert fake.xlen(QueueKeys("f", "ingestion", 4).for_key("x").stream) == 1
    fake_async = fakeredis.FakeAsyncRedis()
    with pytest.raises(ConfigurationError, match="use Queue"):
        SyncQueue(Ingestion, fake_async)
    assert AsyncQueue(Ingestion, fake_async).redis is fake_async
    with pytest.raises(ConfigurationError, match="use SyncQueue"):
        AsyncQueue(Ingestion, fake)


# -- refusals before anything is sent --------------------------------------------------------------


async def test_unknown_job_name_raises_naming_queue_and_job(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    with pytest.raises(UnknownJob) as info:
        await queue.add("no-such-job", {"project_id": "p", "event_id": "e"})
    assert (info.value.queue, info.value.job) == ("ingestion", "no-such-job")
    assert "'ingestion'" in str(info.value)
    assert "'no-such-job'" in str(info.value)
    assert "ingest-event, other" in str(info.value)
    with pytest.raises(UnknownJob, match="has no job 'ingest-event'"):
        # Same name, but the spec of another queue.
        await queue.add(Stranger.ingest_event, ev())  # type: ignore[arg-type]
    assert await all_keys(aredis, prefix) == []


async def test_job_given_by_name_string_is_accepted(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    await queue.add("ingest-event", {"project_id": "p", "event_id": "e"}, sharding_key="a")
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [0, 0, 1, 0]


async def test_wrong_model_class_raises_invalid_payload_and_writes_nothing(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    rec = Recorder()
    q = AsyncQueue(Ingestion, aredis, prefix=prefix, hooks=rec)
    with pytest.raises(InvalidPayload) as info:
        await q.add(Ingestion.ingest_event, Other(project_id="p", n=1))  # type: ignore[arg-type]
    err = info.value
    assert (err.queue, err.job) == ("ingestion", "ingest-event")
    assert err.fields == ["event_id"]
    assert "expected a Event payload, got Other" in str(err)
    assert "event_id" in str(err)
    assert rec.of("rejected") == [("rejected", "ingestion", "ingest-event", "invalid")]
    assert await all_keys(aredis, prefix) == []


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({"project_id": "p"}, ["event_id"]),
        ({"project_id": "p", "event_id": ["not", "a", "str"]}, ["event_id"]),
        ({}, ["project_id", "event_id"]),
    ],
)
async def test_invalid_dict_raises_invalid_payload_naming_the_fields(
    queue: AsyncQueue[Ingestion],
    aredis: aioredis.Redis,
    prefix: str,
    payload: dict[str, Any],
    fields: list[str],
) -> None:
    with pytest.raises(InvalidPayload) as info:
        await queue.add(Ingestion.ingest_event, payload)
    err = info.value
    assert (err.queue, err.job, err.fields) == ("ingestion", "ingest-event", fields)
    for word in ("'ingestion'", "'ingest-event'", *fields):
        assert word in str(err)
    assert await all_keys(aredis, prefix) == []


async def test_invalid_payload_gives_each_field_its_own_error_text(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    with pytest.raises(InvalidPayload) as info:
        await queue.add(Ingestion.ingest_event, {"event_id": ["not", "a", "str"]})
    err = info.value
    assert err.fields == ["project_id", "event_id"]
    assert "project_id: Field required" in str(err)
    assert "event_id: Input should be a valid string" in str(err)
    assert await all_keys(aredis, prefix) == []


async def test_unvalidated_model_instance_is_refused(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    broken = Event.model_construct(project_id="p")  # skips validation: event_id is missing
    with pytest.raises(InvalidPayload) as info:
        await queue.add(Ingestion.ingest_event, broken)
    assert info.value.fields == ["event_id"]
    assert await all_keys(aredis, prefix) == []


class Aliased(BaseModel):
    project_id: str = Field(alias="projectId")


class AliasQueue(QueueContract, name="aliased"):
    a = job("a", Aliased)


async def test_payload_with_aliases_is_written_as_the_worker_reads_it(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = AsyncQueue(AliasQueue, aredis, prefix=prefix)
    await q.add(AliasQueue.a, Aliased(projectId="p"))
    [[(eid, fields)]] = await shard_entries(aredis, prefix, "aliased", 1)
    assert json.loads(fields[b"payload"]) == {"projectId": "p"}
    assert Envelope.from_raw(decode_entry(eid, fields), Aliased).payload.project_id == "p"


def payload_of_size(n: int) -> Event:
    overhead = len(ev(body="").model_dump_json())
    return ev(body="x" * (n - overhead))


async def test_payload_over_the_default_1_mib_raises_before_sending(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    limit = 1024 * 1024
    with pytest.raises(PayloadTooLarge) as info:
        await queue.add(Ingestion.ingest_event, payload_of_size(limit + 1))
    assert (info.value.size, info.value.limit) == (limit + 1, limit)
    assert (info.value.queue, info.value.job) == ("ingestion", "ingest-event")
    assert await all_keys(aredis, prefix) == []
    await queue.add(Ingestion.ingest_event, payload_of_size(limit))  # exactly the limit is fine
    assert sum(map(len, await shard_entries(aredis, prefix))) == 1


async def test_custom_smaller_payload_limit_applies(aredis: aioredis.Redis, prefix: str) -> None:
    small = AsyncQueue(Ingestion, aredis, prefix=prefix, max_payload_bytes=100)
    with pytest.raises(PayloadTooLarge, match="101 bytes, over the 100-byte limit"):
        await small.add(Ingestion.ingest_event, payload_of_size(101))
    # The override survives for_key views; the contract default applies without one.
    with pytest.raises(PayloadTooLarge):
        await small.for_key("k").add(Ingestion.ingest_event, payload_of_size(101))
    with pytest.raises(PayloadTooLarge, match="over the 64-byte limit"):
        await AsyncQueue(Tiny, aredis, prefix=prefix).add(Tiny.ev, payload_of_size(65))
    assert await all_keys(aredis, prefix) == []


@pytest.mark.parametrize("limit", [0, -1])
def test_non_positive_payload_limit_is_refused(aredis: aioredis.Redis, limit: int) -> None:
    with pytest.raises(ConfigurationError, match="max_payload_bytes"):
        AsyncQueue(Ingestion, aredis, max_payload_bytes=limit)


@pytest.mark.parametrize("bad_id", ["", "x" * 201])
async def test_job_id_outside_1_to_200_characters_is_refused(
    queue: AsyncQueue[Ingestion], bad_id: str
) -> None:
    with pytest.raises(ConfigurationError, match="job_id"):
        await queue.add(Ingestion.ingest_event, ev(), job_id=bad_id)


# -- dedup ----------------------------------------------------------------------------------------


async def test_second_add_of_the_same_job_id_returns_it_and_adds_nothing(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    first = await queue.add(Ingestion.ingest_event, ev(1), job_id="order-1")
    second = await queue.add(Ingestion.ingest_event, ev(2), job_id="order-1")
    assert first == second == "order-1"
    entries = await shard_entries(aredis, prefix)
    assert job_ids(entries) == ["order-1"]
    [(_, fields)] = [e for s in entries for e in s]
    assert json.loads(fields[b"payload"])["event_id"] == "e1"  # the first one wins
    shard = QueueKeys(prefix, "ingestion", 4).for_key("order-1")
    ttl = await aredis.pttl(shard.dedup("order-1"))
    assert 0 < ttl <= Ingestion.defaults.dedup_window_ms


async def test_four_concurrent_async_producers_add_each_id_exactly_once(
    redis_server: RedisServer, aredis: aioredis.Redis, prefix: str
) -> None:
    ids = [f"job-{i}" for i in range(60)]
    clients = [aioredis.Redis(port=redis_server.port) for _ in range(4)]
    try:

        async def produce(client: aioredis.Redis, seed: int) -> list[str]:
            q = AsyncQueue(Ingestion, client, prefix=prefix)
            mine = ids[:]
            random.Random(seed).shuffle(mine)
            return [await q.add(Ingestion.ingest_event, ev(i), job_id=i) for i in mine]

        results = await asyncio.gather(*(produce(c, n) for n, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.aclose()
    assert all(sorted(r) == sorted(ids) for r in results)
    assert sorted(job_ids(await shard_entries(aredis, prefix))) == sorted(ids)


def test_four_threads_with_sync_queues_add_each_id_exactly_once(
    redis_server: RedisServer, sredis: redis.Redis, prefix: str
) -> None:
    ids = [f"job-{i}" for i in range(60)]
    barrier = threading.Barrier(4)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        client = redis.Redis(port=redis_server.port)
        try:
            q = SyncQueue(Ingestion, client, prefix=prefix)
            mine = ids[:]
            random.Random(seed).shuffle(mine)
            barrier.wait()
            results.append([q.add(Ingestion.ingest_event, ev(i), job_id=i) for i in mine])
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 4
    stored = [
        f[b"id"].decode()
        for sk in QueueKeys(prefix, "ingestion", 4).shards
        for _, f in sredis.xrange(sk.stream)
    ]
    assert sorted(stored) == sorted(ids)


async def test_dedup_marker_expires_after_its_window_and_a_re_add_then_works(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = AsyncQueue(Quick, aredis, prefix=prefix)
    marker = QueueKeys(prefix, "quick", 1).shards[0].dedup("once")
    await q.add(Quick.ev, ev(1), job_id="once")
    await q.add(Quick.ev, ev(2), job_id="once")
    assert await aredis.xlen(QueueKeys(prefix, "quick", 1).shards[0].stream) == 1
    deadline = time.monotonic() + 5
    while await aredis.exists(marker):
        assert time.monotonic() < deadline, "dedup marker never expired"
        await asyncio.sleep(0.01)
    await q.add(Quick.ev, ev(3), job_id="once")
    [entries] = await shard_entries(aredis, prefix, "quick", 1)
    assert [json.loads(f[b"payload"])["event_id"] for _, f in entries] == ["e1", "e3"]


# -- delay ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [timedelta(seconds=30), 30, 30.0])
async def test_delayed_job_waits_in_the_zset_due_by_the_server_clock(
    aredis: aioredis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    delay: timedelta | float,
) -> None:
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 3 * 3600)  # producer 3 h behind
    q = AsyncQueue(Ingestion, aredis, prefix=prefix)
    before = await server_ms(aredis)
    job_id = await q.for_key("a").add(Ingestion.ingest_event, ev(), delay=delay)
    after = await server_ms(aredis)
    shard = QueueKeys(prefix, "ingestion", 4).shards[2]
    assert await aredis.xlen(shard.stream) == 0
    ((member, due, as_map),) = await delayed_records(aredis, prefix, 2)
    assert member.startswith(f"{job_id}:")  # a record of its own, never the bare id
    assert before + 30_000 <= due <= after + 30_000
    assert int(as_map["due"]) == due
    assert as_map["id"] == job_id
    # The envelope's timestamp is the producer's (skewed) clock; only due times are Redis's.
    assert int(as_map["ts"]) < before - 3 * 3600 * 1000 + 60_000


async def test_zero_delay_is_ready_now_and_negative_delay_is_refused(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    await queue.for_key("a").add(Ingestion.ingest_event, ev(), delay=timedelta(0))
    assert [len(s) for s in await shard_entries(aredis, prefix)] == [0, 0, 1, 0]
    with pytest.raises(ConfigurationError, match="delay must not be negative"):
        await queue.add(Ingestion.ingest_event, ev(), delay=-1)


# -- bulk -----------------------------------------------------------------------------------------


async def evalsha_calls(r: aioredis.Redis) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_add_bulk_sends_one_script_call_per_shard_batch_and_keeps_order(
    queue: AsyncQueue[Ingestion],
    aredis: aioredis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await queue.add(Ingestion.ingest_event, ev("warm-up"))  # scripts loaded: no NOSCRIPT retry
    round_trips = 0
    real_pipeline = aredis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(aredis, "pipeline", counting_pipeline)
    before = await evalsha_calls(aredis)
    ids = await queue.add_bulk(JobRequest(Ingestion.ingest_event, ev(i)) for i in range(1200))
    after = await evalsha_calls(aredis)
    assert round_trips == 3  # 500 + 500 + 200 jobs
    assert after - before == 12  # each batch: one EVALSHA for each of the 4 shards
    entries = await shard_entries(aredis, prefix)
    assert sum(map(len, entries)) == 1201
    by_id = {
        f[b"id"].decode(): json.loads(f[b"payload"])["event_id"] for s in entries for _, f in s
    }
    assert [by_id[i] for i in ids] == [f"e{i}" for i in range(1200)]
    assert len(set(ids)) == 1200


async def test_add_bulk_validates_every_job_before_sending_any(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    requests = [JobRequest(Ingestion.ingest_event, ev(i)) for i in range(10)]
    requests.append(JobRequest(Ingestion.ingest_event, {"project_id": "p"}))
    with pytest.raises(InvalidPayload):
        await queue.add_bulk(requests)
    assert await all_keys(aredis, prefix) == []


async def test_add_bulk_mixes_keys_ids_delays_and_dedups_within_the_call(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    ids = await queue.add_bulk(
        [
            JobRequest(Ingestion.ingest_event, ev(1), sharding_key="project-1"),
            JobRequest(Ingestion.other, {"project_id": "p", "n": 2}, job_id="same"),
            JobRequest(Ingestion.other, {"project_id": "p", "n": 3}, job_id="same"),
            JobRequest("ingest-event", ev(4), delay=60, sharding_key="a"),
        ]
    )
    assert ids[1:3] == ["same", "same"]
    entries = await shard_entries(aredis, prefix)
    assert sorted(job_ids(entries)) == sorted([ids[0], "same"])
    assert entries[3][0][1][b"id"].decode() == ids[0]
    ((member, _due, fields),) = await delayed_records(aredis, prefix, 2)
    assert fields["id"] == ids[3]
    assert member.startswith(f"{ids[3]}:")


async def test_add_bulk_splits_batches_by_payload_bytes(
    queue: AsyncQueue[Ingestion],
    aredis: aioredis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    round_trips = 0
    real_pipeline = aredis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(aredis, "pipeline", counting_pipeline)
    big = payload_of_size(1024 * 1024)
    ids = await queue.add_bulk(JobRequest(Ingestion.ingest_event, big) for _ in range(20))
    assert len(ids) == 20
    assert round_trips >= 3  # 20 MiB never goes out as one request
    assert sum(map(len, await shard_entries(aredis, prefix))) == 20


async def test_add_bulk_stamps_each_job_with_the_time_of_its_batch(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    before = int(time.time() * 1000)
    ids = await queue.add_bulk(JobRequest(Ingestion.ingest_event, ev(i)) for i in range(700))
    after = int(time.time() * 1000)
    jobs = [decode_entry(eid, f) for s in await shard_entries(aredis, prefix) for eid, f in s]
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert all(before <= j.timestamp_ms <= after for j in jobs)
    assert {j.attempt for j in jobs} == {1}


class Counting(Hooks):
    """Counts adds only: no trace context, so the producer skips enqueue_context."""

    def __init__(self) -> None:
        self.enqueued_on: list[str] = []
        self.duplicates = 0

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        self.enqueued_on.append(shard)

    def enqueue_duplicate(self, queue: str, shard: str, job_name: str) -> None:
        self.duplicates += 1


async def test_add_bulk_reports_every_job_and_duplicate_to_counting_hooks(
    aredis: aioredis.Redis, prefix: str
) -> None:
    hooks = Counting()
    q = AsyncQueue(Ingestion, aredis, prefix=prefix, hooks=hooks)
    requests = [JobRequest(Ingestion.ingest_event, ev(i)) for i in range(8)]
    requests += [JobRequest(Ingestion.ingest_event, ev(9), job_id="twice")] * 2
    ids = await q.add_bulk(requests)
    assert len(ids) == 10
    assert hooks.duplicates == 1
    assert sorted(hooks.enqueued_on) == sorted(
        ["ingestion", "ingestion-1", "ingestion-2", "ingestion-3"] * 2
        + [f"ingestion-{shard_index('twice', 4)}".replace("ingestion-0", "ingestion")]
    )


class Custom(BaseModel):
    n: int

    def model_dump_json(self, **kwargs: Any) -> str:  # type: ignore[override]
        return json.dumps({"n": self.n, "via": "override"})


class CustomQueue(QueueContract, name="custom"):
    c = job("c", Custom)


def test_a_model_overriding_model_dump_json_is_written_as_its_override_writes_it(
    sredis: redis.Redis, prefix: str
) -> None:
    q = SyncQueue(CustomQueue, sredis, prefix=prefix)
    q.add_bulk([JobRequest(CustomQueue.c, Custom(n=1))])
    q.add(CustomQueue.c, Custom(n=2))
    stream = QueueKeys(prefix, "custom", 1).shards[0].stream
    assert [json.loads(f[b"payload"]) for _, f in sredis.xrange(stream)] == [
        {"n": 1, "via": "override"},
        {"n": 2, "via": "override"},
    ]


# -- each shard's part of a bulk batch lands whole or not at all ----------------------------------


@pytest.fixture
def tight_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, empty, with a 3 MB maxmemory under noeviction."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    server = RedisServer(
        binary, extra=["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]
    ).start()
    yield server
    server.stop(kill=True)


def test_redis_filling_up_mid_batch_lands_each_shards_part_whole_or_not_at_all(
    tight_server: RedisServer,
) -> None:
    r = redis.Redis(port=tight_server.port)
    rec = Recorder()
    q = SyncQueue(Ingestion, r, prefix="tight", hooks=rec)
    accepted: list[str] = []
    try:
        with pytest.raises(RedisOutOfMemory):  # noqa: PT012
            for _ in range(100):
                accepted += q.add_bulk(
                    JobRequest(Ingestion.ingest_event, ev(i, body="x" * 400)) for i in range(500)
                )
        shards = QueueKeys("tight", "ingestion", 4).shards
        lengths = [r.xlen(sk.stream) for sk in shards]
        landed = [f[b"id"].decode() for sk in shards for _, f in r.xrange(sk.stream)]
    finally:
        r.close()
    # A shard's part that Redis started under maxmemory ran to its end, however far past the
    # limit it went; one started over the limit was refused before writing anything. Each
    # batch of 500 puts 125 jobs on each of the 4 shards: a shard holds whole parts only.
    assert len(accepted) >= 500
    assert all(n % 125 == 0 for n in lengths), lengths
    assert set(accepted) <= set(landed)
    assert len(set(landed)) == len(landed)
    assert len(rec.of("enqueued")) == len(accepted)
    assert len(rec.of("rejected")) == 500


async def test_a_stream_key_of_the_wrong_type_refuses_its_shards_part_and_nothing_of_it_lands(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    shards = QueueKeys(prefix, "ingestion", 4).shards
    await aredis.set(shards[2].stream, "not a stream")
    with pytest.raises(RedisRefused, match="WRONGTYPE"):
        await queue.add_bulk(JobRequest(Ingestion.ingest_event, ev(i)) for i in range(40))
    assert await aredis.get(shards[2].stream) == b"not a stream"
    # The other shards' parts are calls of their own: they landed whole (documented).
    assert [await aredis.xlen(shards[i].stream) for i in (0, 1, 3)] == [10, 10, 10]


# -- the sync twin --------------------------------------------------------------------------------


def test_sync_queue_adds_on_the_keys_shard_and_dedups(sredis: redis.Redis, prefix: str) -> None:
    q = SyncQueue(Ingestion, sredis, prefix=prefix)
    job_id = q.for_key("project-1").add(Ingestion.ingest_event, ev(1))
    assert q.add(Ingestion.ingest_event, ev(2), job_id="dup") == "dup"
    assert q.add(Ingestion.ingest_event, ev(3), job_id="dup") == "dup"
    shards = QueueKeys(prefix, "ingestion", 4).shards
    [(eid, fields)] = sredis.xrange(shards[3].stream)
    assert decode_entry(eid, fields).id == job_id
    dup_shard = shards[shard_index("dup", 4)]
    assert [f[b"id"] for _, f in sredis.xrange(dup_shard.stream)].count(b"dup") == 1
    with pytest.raises(InvalidPayload):
        q.add(Ingestion.ingest_event, {"project_id": 1})


def test_sync_add_bulk_pipelines_and_keeps_order(
    sredis: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = SyncQueue(Ingestion, sredis, prefix=prefix)
    q.add(Ingestion.ingest_event, ev("warm-up"))
    round_trips = 0
    real_pipeline = sredis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(sredis, "pipeline", counting_pipeline)
    before = int(sredis.info("commandstats")["cmdstat_evalsha"]["calls"])
    ids = q.add_bulk(JobRequest(Ingestion.ingest_event, ev(i)) for i in range(600))
    after = int(sredis.info("commandstats")["cmdstat_evalsha"]["calls"])
    assert (round_trips, after - before) == (2, 8)
    by_id = {
        f[b"id"].decode(): json.loads(f[b"payload"])["event_id"]
        for sk in QueueKeys(prefix, "ingestion", 4).shards
        for _, f in sredis.xrange(sk.stream)
    }
    assert [by_id[i] for i in ids] == [f"e{i}" for i in range(600)]


def test_sync_delay_uses_the_server_clock(sredis: redis.Redis, prefix: str) -> None:
    q = SyncQueue(Ingestion, sredis, prefix=prefix)
    sec, usec = sredis.time()
    job_id = q.for_key("a").add(Ingestion.ingest_event, ev(), delay=timedelta(minutes=5))
    ((member, due),) = sredis.zrange(
        QueueKeys(prefix, "ingestion", 4).shards[2].delayed, 0, -1, withscores=True
    )
    assert member.decode().startswith(f"{job_id}:")
    assert 0 <= due - (sec * 1000 + usec // 1000 + 300_000) < 5_000


async def wait_marker_gone(r: aioredis.Redis, key: str) -> None:
    deadline = time.monotonic() + 5
    while await r.exists(key):
        assert time.monotonic() < deadline, "dedup marker never expired"
        await asyncio.sleep(0.01)


async def promote_all(r: aioredis.Redis, prefix: str, lane: str, shards: int) -> int:
    """Make every delayed job of the lane due now and promote it, as a worker would."""
    moved = 0
    for sk in QueueKeys(prefix, lane, shards).shards:
        members = await r.zrange(sk.delayed, 0, -1)
        if members:
            await r.zadd(sk.delayed, dict.fromkeys(members, 1), xx=True)
        moved += (await run_calls(r, [ops.promote(sk)]))[0].moved
    return moved


async def test_re_add_after_the_window_while_the_first_is_delayed_is_a_second_job(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = AsyncQueue(Quick, aredis, prefix=prefix)  # a 50 ms dedup window
    sk = QueueKeys(prefix, "quick", 1).shards[0]
    assert await q.add(Quick.ev, ev(1), job_id="late", delay=timedelta(hours=1)) == "late"
    await wait_marker_gone(aredis, sk.dedup("late"))
    assert await q.add(Quick.ev, ev(2), job_id="late", delay=timedelta(hours=2)) == "late"

    records = await delayed_records(aredis, prefix, 0, "quick", 1)
    assert [f["id"] for _m, _due, f in records] == ["late", "late"]
    assert records[0][0] != records[1][0]
    assert await promote_all(aredis, prefix, "quick", 1) == 2
    [entries] = await shard_entries(aredis, prefix, "quick", 1)
    assert sorted(json.loads(f[b"payload"])["event_id"] for _, f in entries) == ["e1", "e2"]
    assert {f[b"id"] for _, f in entries} == {b"late"}


async def test_delayed_re_add_inside_the_window_is_still_refused(
    aredis: aioredis.Redis, prefix: str
) -> None:
    rec = Recorder()
    q = AsyncQueue(Ingestion, aredis, prefix=prefix, hooks=rec)
    for n in (1, 2):
        assert await q.add(Ingestion.ingest_event, ev(n), job_id="d", delay=60) == "d"
    assert [c[0] for c in rec.calls if c[0] != "context"] == ["enqueued", "duplicate"]
    shard = shard_index("d", 4)
    ((_member, _due, fields),) = await delayed_records(aredis, prefix, shard)
    assert json.loads(fields["payload"])["event_id"] == "e1"  # the first add wins


async def test_a_retry_stored_for_a_running_copy_leaves_a_newer_delayed_copy_alone(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = AsyncQueue(Quick, aredis, prefix=prefix)
    sk = QueueKeys(prefix, "quick", 1).shards[0]
    await aredis.xgroup_create(sk.stream, "g", id="0", mkstream=True)
    await q.add(Quick.ev, ev(1), job_id="run")
    ((_stream, [(_eid, running)]),) = await aredis.xreadgroup("g", "w", {sk.stream: ">"})
    await wait_marker_gone(aredis, sk.dedup("run"))
    await q.add(Quick.ev, ev(2), job_id="run", delay=timedelta(hours=1))

    # The running copy fails and is stored for a retry, as a worker that keys the record by
    # the bare job id (any member but the producer's would do) would store it.
    retry = json.loads(json.dumps([x.decode() for kv in running.items() for x in kv]))
    retry[retry.index("attempt") + 1] = "2"
    await aredis.zadd(sk.delayed, {"run": 1})
    await aredis.hset(sk.jobs, "run", json.dumps(retry))

    assert await promote_all(aredis, prefix, "quick", 1) == 2
    [entries] = await shard_entries(aredis, prefix, "quick", 1)
    ready = sorted((f[b"attempt"], json.loads(f[b"payload"])["event_id"]) for _, f in entries)
    assert ready[-2:] == [(b"1", "e2"), (b"2", "e1")]


# -- Redis errors ---------------------------------------------------------------------------------


async def test_closed_port_raises_redis_unavailable_naming_the_queue() -> None:
    client = aioredis.Redis(
        port=free_port(), socket_connect_timeout=1, retry=AsyncRetry(NoBackoff(), 0)
    )
    rec = Recorder()
    try:
        q = AsyncQueue(Ingestion, client, hooks=rec)
        with pytest.raises(RedisUnavailable, match="'ingestion'") as info:
            await q.add(Ingestion.ingest_event, ev())
        assert info.value.queue == "ingestion"
        assert rec.of("rejected") == [("rejected", "ingestion", "ingest-event", "redis_error")]
    finally:
        await client.aclose()


def test_sync_closed_port_raises_redis_unavailable_naming_the_queue() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(RedisUnavailable, match="'ingestion-secondary'") as info:
            SyncQueue(Ingestion, client, secondary=True).add(Ingestion.ingest_event, ev())
        assert info.value.queue == "ingestion-secondary"
    finally:
        client.close()


@pytest.fixture
async def full_redis() -> AsyncIterator[aioredis.Redis]:
    """A redis-server at its 1 MB maxmemory under noeviction."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    server = RedisServer(
        binary, extra=["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]
    ).start()
    client = aioredis.Redis(port=server.port)
    try:
        i = 0
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # noqa: PT012
            while i < 100_000:
                await client.set(f"fill:{i}", "x" * 1000)
                i += 1
        yield client
    finally:
        await client.aclose()
        server.stop(kill=True)


async def test_full_redis_raises_out_of_memory_and_leaves_no_partial_job(
    full_redis: aioredis.Redis,
) -> None:
    rec = Recorder()
    q = AsyncQueue(Ingestion, full_redis, prefix="oom", hooks=rec)
    with pytest.raises(RedisOutOfMemory, match="'ingestion'") as info:
        await q.add(Ingestion.ingest_event, ev(), job_id="o-1")
    assert info.value.queue == "ingestion"
    with pytest.raises(RedisOutOfMemory):
        await q.add(Ingestion.ingest_event, ev(), job_id="o-2", delay=60)
    with pytest.raises(RedisOutOfMemory):
        await q.add_bulk([JobRequest(Ingestion.ingest_event, ev(i)) for i in range(8)])
    # No dedup marker without its job, no stream, no delayed entry: nothing at all.
    assert [k async for k in full_redis.scan_iter(match="oom:*")] == []
    assert {c[3] for c in rec.of("rejected")} == {"redis_error"}
    assert rec.of("enqueued") == []


# -- hooks ----------------------------------------------------------------------------------------


async def test_hooks_see_enqueued_duplicate_and_rejected_with_reasons(
    aredis: aioredis.Redis, prefix: str
) -> None:
    rec = Recorder(carrier={"traceparent": "00-abc-def-01"})
    q = AsyncQueue(Ingestion, aredis, prefix=prefix, hooks=rec, max_payload_bytes=200)
    await q.for_key("project-1").add(Ingestion.ingest_event, ev(project="tenant-9"))
    await q.for_key("a").add(Ingestion.ingest_event, ev(), job_id="d", delay=1)
    await q.for_key("a").add(Ingestion.ingest_event, ev(), job_id="d")
    with pytest.raises(UnknownJob):
        await q.add("nope", {})
    with pytest.raises(InvalidPayload):
        await q.add(Ingestion.ingest_event, {"project_id": "p"})
    with pytest.raises(PayloadTooLarge):
        await q.add(Ingestion.ingest_event, payload_of_size(201))
    assert rec.of("enqueued") == [
        ("enqueued", "ingestion", "ingestion-3", "ingest-event", False),
        ("enqueued", "ingestion", "ingestion-2", "ingest-event", True),
    ]
    assert rec.of("duplicate") == [("duplicate", "ingestion", "ingestion-2", "ingest-event")]
    assert [c[3] for c in rec.of("rejected")] == ["unknown_job", "invalid", "too_large"]
    assert rec.of("context")[0] == ("context", "ingestion", "ingest-event", "tenant-9")
    [(_, fields)] = (await shard_entries(aredis, prefix))[3]
    assert json.loads(fields[b"trace"]) == {"traceparent": "00-abc-def-01"}


def test_sync_hooks_see_duplicates(sredis: redis.Redis, prefix: str) -> None:
    sync_recorder = Recorder()
    q = SyncQueue(Ingestion, sredis, prefix=prefix, hooks=sync_recorder)
    q.add(Ingestion.ingest_event, ev(), job_id="x")
    q.add(Ingestion.ingest_event, ev(), job_id="x")
    shard = f"ingestion-{shard_index('x', 4)}" if shard_index("x", 4) else "ingestion"
    assert [c[0] for c in sync_recorder.calls if c[0] != "context"] == ["enqueued", "duplicate"]
    assert sync_recorder.of("duplicate") == [("duplicate", "ingestion", shard, "ingest-event")]


async def test_add_bulk_refuses_items_that_are_not_job_requests(
    queue: AsyncQueue[Ingestion], aredis: aioredis.Redis, prefix: str
) -> None:
    with pytest.raises(ConfigurationError, match="takes JobRequest items, got tuple"):
        await queue.add_bulk([("ingest-event", {"project_id": "p", "event_id": "e"})])  # type: ignore[list-item]
    assert await all_keys(aredis, prefix) == []
