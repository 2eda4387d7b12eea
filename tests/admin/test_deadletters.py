"""Dead letters through the library API: list, count, retry and purge against real Redis."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from streamq import (
    ConfigurationError,
    DeadLetter,
    DeadLetters,
    Queue,
    SyncDeadLetters,
    ops,
)
from streamq._redis import run_calls
from streamq.envelope import FIELD_NAMES, encode_fields
from streamq.keys import QueueKeys, ShardKeys
from tests.admin.contracts import Adm, Credential, Solo, Task, key_for, running_worker, wait_for

GROUP = "streamq"


def shard_keys(prefix: str, contract: Any = Adm, index: int = 0) -> ShardKeys:
    return QueueKeys(prefix, contract.queue_name, contract.shards).shards[index]


async def dead_len(r: Any, prefix: str, contract: Any = Adm) -> int:
    keys = QueueKeys(prefix, contract.queue_name, contract.shards)
    return sum([await r.xlen(s.dead) for s in keys.shards])


async def make_dead_with_worker(
    redis_url: str, prefix: str, r: aioredis.Redis, jobs: list[tuple[int, str, int]]
) -> list[str]:
    """Enqueue ``(n, kind, shard)`` jobs and let a real worker dead-letter the failing ones."""
    q = Queue(Adm, r, prefix=prefix)
    ids = []
    for n, kind, shard in jobs:
        ids.append(
            await q.for_key(key_for(Adm, shard)).add(
                Adm.task, Task(n=n, kind=kind, token=f"secret-{n}"), job_id=f"job-{n}"
            )
        )
    failing = sum(1 for _, kind, _ in jobs if kind != "ok")
    async with running_worker(redis_url, prefix) as h:
        await h.manager.run_until_idle(10)
        await wait_for(lambda: _eq(dead_len(r, prefix), failing), what=f"{failing} dead letters")
    return ids


async def _eq(coro: Any, n: int) -> bool:
    return bool(await coro == n)


async def next_ms(r: Any) -> None:
    """Wait until the Redis clock has moved to a later millisecond."""
    sec, usec = await r.time()
    start = sec * 1000 + usec // 1000

    async def moved() -> bool:
        sec, usec = await r.time()
        return bool(sec * 1000 + usec // 1000 > start)

    await wait_for(moved, what="the next millisecond")


async def ensure_group(r: Any, sk: ShardKeys) -> None:
    try:
        await r.xgroup_create(sk.stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def raw_dead(r: Any, sk: ShardKeys, job_id: str, *, reason: str = "permanent") -> str:
    """Dead-letter ``job_id`` through fail.lua as a worker would: enqueue, read, fail."""
    await ensure_group(r, sk)
    values = encode_fields(
        job_id=job_id, name="task", timestamp_ms=1, payload_json=json.dumps({"n": 1, "token": "t"})
    )
    await run_calls(r, [ops.enqueue(sk, [ops.EnqueueItem(job_id, values)], dedup_window_ms=1000)])
    reply = await r.xreadgroup(GROUP, "c1", {sk.stream: ">"}, count=1)
    entry_id, fields = reply[0][1][0]
    assert fields[b"id"] == job_id.encode()
    extra = [
        "reason",
        reason,
        "error_type",
        "PermanentError",
        "error",
        "gone",
        "traceback",
        "",
        "attempts",
        "1",
        "worker",
        "c1",
        "queue",
        sk.queue,
    ]
    flat: list[Any] = [x for kv in fields.items() for x in kv] + extra
    (ok,) = await run_calls(
        r, [ops.fail(sk, GROUP, "c1", entry_id=entry_id.decode(), dead_fields=flat, dead_cap=0,
                          token=os.urandom(8).hex())]
    )
    assert ok
    (newest,) = await r.xrevrange(sk.dead, count=1)
    return newest[0].decode()  # type: ignore[no-any-return]


async def lost_payload(r: Any, sk: ShardKeys) -> str:
    """A pending entry deleted under the group, reclaimed: a lost_payload record."""
    await ensure_group(r, sk)
    eid = await r.xadd(sk.stream, {"due": "", "id": "ghost"})
    await r.xreadgroup(GROUP, "c1", {sk.stream: ">"}, count=10)
    await r.xdel(sk.stream, eid)
    await run_calls(r, [ops.reclaim(sk, GROUP, "c2", min_idle_ms=0, count=10, max_stalled_count=1,
                                     dead_cap=0)])
    (newest,) = await r.xrevrange(sk.dead, count=1)
    assert newest[1][b"reason"] == b"lost_payload"
    return newest[0].decode()  # type: ignore[no-any-return]


async def test_worker_dead_letters_are_listed_newest_first_with_why_they_died(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(
        redis_url, prefix, aredis, [(1, "permanent", 0), (2, "error", 1), (3, "ok", 0)]
    )
    letters = await DeadLetters(aredis, Adm, prefix=prefix).list()

    assert len(letters) == 2
    assert letters[0].failed_at_ms >= letters[1].failed_at_ms
    by_job = {d.job_id: d for d in letters}
    perm, err = by_job["job-1"], by_job["job-2"]
    assert (perm.reason, perm.error_type, perm.job_name) == ("permanent", "PermanentError", "task")
    assert perm.error == "project of job 1 is gone"
    assert "PermanentError" in perm.traceback
    assert perm.attempts == 1
    assert perm.shard == "adm"
    assert err.shard == "adm-1"
    assert perm.queue == "adm"
    assert perm.worker
    assert perm.retryable
    assert perm.ref == f"adm/{perm.id}"
    assert (err.reason, err.error_type) == ("error", "RuntimeError")
    assert err.payload is not None
    assert err.payload["n"] == 2


async def test_secret_fields_are_redacted_in_listings_at_every_depth(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    q = Queue(Adm, aredis, prefix=prefix)
    await q.add(
        Adm.task,
        Task(n=1, kind="permanent", token="hunter2", creds=[Credential(token="t0p", label="x")]),
    )
    async with running_worker(redis_url, prefix) as h:
        await h.manager.run_until_idle(10)
        await wait_for(lambda: _eq(dead_len(aredis, prefix), 1), what="a dead letter")
    (letter,) = await DeadLetters(aredis, Adm, prefix=prefix).list()

    assert letter.payload == {
        "n": 1,
        "kind": "permanent",
        "token": "***",
        "creds": [{"token": "***", "label": "x"}],
    }
    shown = json.dumps(letter.to_dict())
    assert "hunter2" not in shown
    assert "t0p" not in shown
    assert "hunter2" not in repr(letter)


async def test_count_totals_and_counts_by_reason(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(
        redis_url,
        prefix,
        aredis,
        [(1, "permanent", 0), (2, "permanent", 1), (3, "error", 1), (4, "ok", 0)],
    )
    await lost_payload(aredis, shard_keys(prefix, index=0))
    dead = DeadLetters(aredis, Adm, prefix=prefix)

    assert await dead.count() == 4
    assert await dead.count(shard="adm-1") == 2
    assert await dead.count(by_reason=True) == {"permanent": 2, "error": 1, "lost_payload": 1}
    assert await dead.count(shard=0, by_reason=True) == {"permanent": 1, "lost_payload": 1}


async def test_list_filters_by_reason_and_shard_and_honours_limit(
    prefix: str, aredis: aioredis.Redis
) -> None:
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    # Across shards, order is by entry id (Redis ms): give each record its own millisecond.
    for i in range(6):
        await raw_dead(aredis, s0 if i % 2 else s1, f"j{i}", reason="permanent")
        await next_ms(aredis)
    await raw_dead(aredis, s0, "j-err", reason="error")
    dead = DeadLetters(aredis, Adm, prefix=prefix)

    newest3 = await dead.list(3)
    assert [d.job_id for d in newest3] == ["j-err", "j5", "j4"]
    assert [d.job_id for d in await dead.list(10, reason="error")] == ["j-err"]
    assert [d.job_id for d in await dead.list(10, shard="adm-1")] == ["j4", "j2", "j0"]
    oldest_first = [d.job_id for d in await dead.list(100)][::-1]
    assert oldest_first == ["j0", "j1", "j2", "j3", "j4", "j5", "j-err"]


async def test_list_with_reason_pages_past_other_reasons(
    prefix: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streamq.deadletters as dl

    monkeypatch.setattr(dl, "SCAN_PAGE", 3)
    sk = shard_keys(prefix, Solo)
    await raw_dead(aredis, sk, "old-error", reason="error")
    for i in range(7):
        await raw_dead(aredis, sk, f"p{i}", reason="permanent")
    letters = await DeadLetters(aredis, Solo, prefix=prefix).list(2, reason="error")
    assert [d.job_id for d in letters] == ["old-error"]


async def test_retry_reenqueues_with_attempt_one_same_id_and_a_worker_runs_it(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(redis_url, prefix, aredis, [(1, "error", 1)])
    dead = DeadLetters(aredis, Adm, prefix=prefix)
    (letter,) = await dead.list()
    assert letter.attempts == 1

    sk = shard_keys(prefix, index=1)
    assert await dead.retry([letter.ref]) == 1

    assert await dead.count() == 0
    (entry,) = await aredis.xrange(sk.stream)
    fields = {k.decode(): v.decode() for k, v in entry[1].items()}
    assert list(fields) == list(FIELD_NAMES)
    assert fields["id"] == "job-1"
    assert fields["attempt"] == "1"
    assert fields["due"] == ""
    assert json.loads(fields["payload"])["token"] == "secret-1"  # the real payload, not redacted

    async with running_worker(redis_url, prefix) as h:
        await wait_for(lambda: _true(bool(h.seen)), what="the retried job to run")
        await h.manager.run_until_idle(10)
    assert h.seen == [("job-1", 1, 1)]
    (again,) = await dead.list()  # it fails again: dead anew, after one more attempt
    assert (again.job_id, again.attempts) == ("job-1", 1)
    assert again.id != letter.id


async def _true(v: bool) -> bool:
    return v


async def test_retry_of_a_completing_job_leaves_nothing_behind(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    sk = shard_keys(prefix, Solo)
    ref = await raw_dead(aredis, sk, "fixable")
    assert await DeadLetters(aredis, Solo, prefix=prefix).retry([ref]) == 1
    async with running_worker(redis_url, prefix, Solo) as h:
        await h.manager.run_until_idle(10)
    assert h.seen == [("fixable", 1, 1)]
    assert await aredis.xlen(sk.stream) == 0
    assert await aredis.xlen(sk.dead) == 0


async def test_retrying_the_same_dead_letter_twice_adds_it_once(
    prefix: str, aredis: aioredis.Redis
) -> None:
    sk = shard_keys(prefix, Solo)
    ref = await raw_dead(aredis, sk, "once")
    dead = DeadLetters(aredis, Solo, prefix=prefix)
    backlog = await aredis.xlen(sk.stream)

    assert await dead.retry([ref]) == 1
    assert await dead.retry([ref]) == 0
    assert await dead.retry([ref, ref]) == 0
    assert await aredis.xlen(sk.stream) == backlog + 1


async def test_concurrent_retries_from_two_clients_add_each_job_once(
    redis_server: Any, prefix: str, aredis: aioredis.Redis
) -> None:
    refs = []
    for i in range(40):
        sk = shard_keys(prefix, index=i % 2)
        refs.append(f"{sk.name}/{await raw_dead(aredis, sk, f'c{i}')}")
    other = aioredis.Redis(port=redis_server.port)
    sync_client = redis.Redis(port=redis_server.port)
    try:
        a = DeadLetters(aredis, Adm, prefix=prefix)
        b = DeadLetters(other, Adm, prefix=prefix)
        c = SyncDeadLetters(sync_client, Adm, prefix=prefix)
        results = await asyncio.gather(
            a.retry(refs),
            b.retry(refs[::-1]),
            asyncio.to_thread(c.retry, refs),
            a.retry(all=True),
        )
    finally:
        await other.aclose()
        sync_client.close()

    assert sum(results) == 40
    job_ids = []
    for i in range(2):
        for _eid, fields in await aredis.xrange(shard_keys(prefix, index=i).stream):
            job_ids.append(fields[b"id"].decode())
    assert sorted(job_ids) == sorted(f"c{i}" for i in range(40))


async def test_retry_all_moves_every_job_and_keeps_lost_payload_records(
    prefix: str, aredis: aioredis.Redis
) -> None:
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    await raw_dead(aredis, s0, "a")
    await raw_dead(aredis, s1, "b")
    lost = await lost_payload(aredis, s1)
    dead = DeadLetters(aredis, Adm, prefix=prefix)

    assert await dead.retry(all=True) == 2
    (left,) = await dead.list()
    assert (left.id, left.reason, left.retryable, left.job_id) == (
        lost,
        "lost_payload",
        False,
        None,
    )
    assert left.payload is None
    assert left.entry_id
    assert await dead.retry([left]) == 0
    assert await dead.count() == 1


async def test_retry_all_in_pages_retries_every_dead_letter(
    prefix: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streamq.deadletters as dl

    monkeypatch.setattr(dl, "SCAN_PAGE", 4)
    monkeypatch.setattr(dl, "RETRY_BATCH", 3)
    sk = shard_keys(prefix, Solo)
    for i in range(11):
        await raw_dead(aredis, sk, f"r{i}")
    dead = DeadLetters(aredis, Solo, prefix=prefix)
    assert await dead.retry(all=True) == 11
    assert await dead.count() == 0


async def test_refs_must_name_a_shard_on_a_sharded_queue(
    prefix: str, aredis: aioredis.Redis
) -> None:
    ref = await raw_dead(aredis, shard_keys(prefix, index=1), "x")
    dead = DeadLetters(aredis, Adm, prefix=prefix)
    with pytest.raises(ConfigurationError, match="<shard>/<id>"):
        await dead.retry([ref])
    with pytest.raises(ConfigurationError, match="not a dead letter of queue 'adm'"):
        await dead.retry(["adm-7/1-0"])
    with pytest.raises(ConfigurationError, match="not a dead letter"):
        await dead.purge(["adm/not-an-id"])
    with pytest.raises(ConfigurationError, match="exactly one of"):
        await dead.retry()
    with pytest.raises(ConfigurationError, match="exactly one of"):
        await dead.purge(["adm-1/" + ref], all=True)
    assert await dead.count() == 1
    # A bare id is fine where there is one shard.
    solo_ref = await raw_dead(aredis, shard_keys(prefix, Solo), "y")
    assert await DeadLetters(aredis, Solo, prefix=prefix).retry([solo_ref]) == 1


async def test_purge_by_ids_all_and_older_than(prefix: str, aredis: aioredis.Redis) -> None:
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    old = [await raw_dead(aredis, s0, "old0"), await raw_dead(aredis, s1, "old1")]
    dead = DeadLetters(aredis, Adm, prefix=prefix)
    # Back-date the two records: re-add them, alone in their streams, an hour in the past.
    for sk, eid in ((s0, old[0]), (s1, old[1])):
        ((_, fields),) = await aredis.xrange(sk.dead, eid, eid)
        ms = int(eid.split("-")[0]) - 3_600_000
        await aredis.delete(sk.dead)
        await aredis.xadd(sk.dead, fields, id=f"{ms}-0")
    fresh = [await raw_dead(aredis, s0, f"new{i}") for i in range(3)]
    fresh.append(await raw_dead(aredis, s1, "new3"))

    assert await dead.purge(older_than=timedelta(minutes=30)) == 2
    assert {d.job_id for d in await dead.list()} == {"new0", "new1", "new2", "new3"}
    assert await dead.purge(older_than=600) == 0

    assert await dead.purge([f"adm/{fresh[0]}", f"adm/{fresh[0]}", f"adm-1/{fresh[3]}"]) == 2
    assert await dead.purge([f"adm/{fresh[0]}"]) == 0
    assert {d.job_id for d in await dead.list()} == {"new1", "new2"}

    assert await dead.purge(all=True) == 2
    assert await dead.count() == 0
    assert await dead.purge(all=True) == 0


def test_sync_twin_lists_counts_retries_and_purges(prefix: str, sredis: redis.Redis) -> None:
    sk = shard_keys(prefix, Solo)
    asyncio.run(_raw_dead_sync_setup(sredis, prefix))
    dead = SyncDeadLetters(sredis, Solo, prefix=prefix)

    letters = dead.list()
    assert [d.job_id for d in letters] == ["s2", "s1", "s0"]
    assert all(isinstance(d, DeadLetter) for d in letters)
    assert dead.count() == 3
    assert dead.count(by_reason=True) == {"permanent": 3}
    assert dead.retry([letters[0]]) == 1
    assert dead.retry([letters[0].id]) == 0
    assert dead.purge([letters[1]]) == 1
    assert [d.job_id for d in dead.list()] == ["s0"]
    assert sredis.xlen(sk.stream) == 1


async def _raw_dead_sync_setup(sredis: redis.Redis, prefix: str) -> None:
    kw = sredis.connection_pool.connection_kwargs
    r = aioredis.Redis(host=kw.get("host", "localhost"), port=kw["port"])
    try:
        for i in range(3):
            await raw_dead(r, shard_keys(prefix, Solo), f"s{i}")
    finally:
        await r.aclose()
