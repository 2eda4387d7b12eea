"""The contract fingerprint in the meta hash: recorded by producers on their first send to a
lane, and checked against another contract (both rolling-deploy directions), on real Redis."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, create_model
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from streamq import JobRequest, Queue, QueueContract, RedisUnavailable, SyncQueue, job, snapshot
from streamq import producer as producer_module
from streamq.fingerprint import (
    FINGERPRINT_FIELD,
    SNAPSHOT_FIELD,
    breaking_changes,
    check_contract,
    fingerprint,
    record_contract,
    record_contract_sync,
)
from streamq.keys import QueueKeys
from tests.support.redis_server import RedisServer, free_port


class Event(BaseModel):
    project_id: str
    count: int
    note: str | None = None


class Other(BaseModel):
    project_id: str


def event(**fields: Any) -> type[BaseModel]:
    """``Event`` with fields replaced (``(type, default)``), added, or removed (None)."""
    spec: dict[str, Any] = {k: (f.annotation, f) for k, f in Event.model_fields.items()}
    for name, value in fields.items():
        if value is None:
            spec.pop(name)
        else:
            spec[name] = value
    return create_model("Event", **spec)


def contract(
    model: type[BaseModel] = Event, *, other_job: bool = False, **kw: Any
) -> type[QueueContract]:
    """A version of the ``fp`` queue's contract (every version has the same queue name)."""
    attrs: dict[str, Any] = {"ev": job("ev", model)}
    if other_job:
        attrs["other"] = job("other", Other)
    return type("Fp", (QueueContract,), attrs, name="fp", **kw)


Fp = contract(secondary_shards=1)


def meta(prefix: str, lane: str = "fp") -> str:
    return QueueKeys(prefix, lane, 1).meta


def qkeys(prefix: str) -> QueueKeys:
    return QueueKeys(prefix, "fp", 1)


# -- fingerprint ----------------------------------------------------------------------------------


def test_fingerprint_is_16_hex_digits_of_the_snapshot_hash() -> None:
    fp = fingerprint(Fp)
    assert len(fp) == 16
    int(fp, 16)
    assert fp == snapshot(Fp)["fingerprint"][:16]
    assert fingerprint(contract(secondary_shards=1)) == fp  # equal contracts, equal prints


def test_fingerprint_changes_with_the_contract() -> None:
    base = fingerprint(contract())
    assert fingerprint(contract(event(extra=(int, 0)))) != base
    assert fingerprint(contract(shards=2)) != base
    assert fingerprint(contract(other_job=True)) != base


def test_fingerprint_is_the_same_in_another_process() -> None:
    code = (
        "from pydantic import BaseModel\n"
        "from streamq import QueueContract, job\n"
        "from streamq.fingerprint import fingerprint\n"
        "class Event(BaseModel):\n"
        "    project_id: str\n"
        "    count: int\n"
        "    note: str | None = None\n"
        "Event.__module__ = 'tests.test_fingerprint'\n"
        "class Fp(QueueContract, name='fp', secondary_shards=1):\n"
        "    ev = job('ev', Event)\n"
        "print(fingerprint(Fp))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == fingerprint(Fp)


# -- record ---------------------------------------------------------------------------------------


async def test_record_contract_writes_fingerprint_and_snapshot_to_the_meta_hash(
    aredis: aioredis.Redis, prefix: str
) -> None:
    await aredis.hset(meta(prefix), "paused", "1")
    await record_contract(aredis, qkeys(prefix), Fp)

    stored = await aredis.hgetall(meta(prefix))
    assert stored[FINGERPRINT_FIELD.encode()] == fingerprint(Fp).encode()
    assert json.loads(stored[SNAPSHOT_FIELD.encode()]) == snapshot(Fp)
    assert stored[b"paused"] == b"1"  # other fields of the meta hash are left alone


def test_record_contract_sync_writes_the_same_fields(sredis: redis.Redis, prefix: str) -> None:
    record_contract_sync(sredis, qkeys(prefix), Fp)
    stored = sredis.hgetall(meta(prefix))
    assert stored[FINGERPRINT_FIELD.encode()] == fingerprint(Fp).encode()
    assert json.loads(stored[SNAPSHOT_FIELD.encode()]) == snapshot(Fp)


async def test_record_contract_against_an_unreachable_redis_raises_redis_unavailable() -> None:
    client = aioredis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(RedisUnavailable, match="'fp'"):
            await record_contract(client, qkeys("p"), Fp)
    finally:
        await client.aclose()


# -- check ----------------------------------------------------------------------------------------


async def test_check_with_nothing_stored_or_the_same_contract_finds_nothing(
    aredis: aioredis.Redis, prefix: str
) -> None:
    assert await check_contract(aredis, qkeys(prefix), Fp) == []
    await aredis.hset(meta(prefix), "paused", "1")  # a meta hash without a record
    assert await check_contract(aredis, qkeys(prefix), Fp) == []
    await record_contract(aredis, qkeys(prefix), Fp)
    assert await check_contract(aredis, qkeys(prefix), Fp) == []


async def test_check_reports_a_breaking_change_naming_queue_job_and_field(
    aredis: aioredis.Redis, prefix: str
) -> None:
    await record_contract(aredis, qkeys(prefix), contract())
    newer = contract(event(region=(str, ...)))  # a new required field

    problems = await check_contract(aredis, qkeys(prefix), newer)

    assert len(problems) == 1
    assert "field_added_required" in problems[0]
    assert "fp/ev field 'region'" in problems[0]


def test_an_added_optional_field_is_compatible_whichever_side_is_newer() -> None:
    old, new = contract(), contract(event(region=(str | None, None)))
    assert breaking_changes(snapshot(old), new) == []  # a worker deployed first
    assert breaking_changes(snapshot(new), old) == []  # producers deployed first, or a rollback


def test_an_optional_field_removed_is_compatible_in_both_directions() -> None:
    full, without_note = contract(), contract(event(note=None))
    assert breaking_changes(snapshot(full), without_note) == []
    assert breaking_changes(snapshot(without_note), full) == []


def test_a_required_field_the_stored_contract_needs_is_breaking_in_both_directions() -> None:
    full, without_count = contract(), contract(event(count=None))
    # Workers on the stored contract still require 'count'; jobs from this one lack it.
    (problem,) = breaking_changes(snapshot(full), without_count)
    assert problem.startswith("BREAKING field_required_by_stored: fp/ev field 'count'")
    # The other way round, jobs already queued lack the field this contract requires.
    (problem,) = breaking_changes(snapshot(without_count), full)
    assert "field_added_required" in problem
    assert "'count'" in problem


def test_a_job_the_stored_contract_sends_and_this_one_lacks_is_breaking() -> None:
    with_other = contract(other_job=True)
    (problem,) = breaking_changes(snapshot(with_other), contract())
    assert "job_removed" in problem
    assert "fp/other" in problem
    # A job only this contract declares: deploy the workers first, as compat says.
    assert breaking_changes(snapshot(contract()), with_other) == []


def test_a_type_the_stored_contract_widened_is_breaking_for_an_older_worker() -> None:
    widened = contract(event(count=(int | None, None)))
    problems = breaking_changes(snapshot(widened), contract())
    assert any("type_changed: fp/ev field 'count'" in p for p in problems), problems
    # This contract widening it is the additive direction: workers first, then producers.
    assert breaking_changes(snapshot(contract()), widened) == []


def test_shard_count_changes_are_breaking_either_way() -> None:
    one, two = contract(), contract(shards=2)
    assert ["shards_changed" in p for p in breaking_changes(snapshot(one), two)] == [True]
    assert ["shards_changed" in p for p in breaking_changes(snapshot(two), one)] == [True]


async def test_a_stored_snapshot_that_cannot_be_read_is_reported(
    aredis: aioredis.Redis, prefix: str
) -> None:
    await aredis.hset(meta(prefix), mapping={FINGERPRINT_FIELD: "x", SNAPSHOT_FIELD: "{nope"})
    (problem,) = await check_contract(aredis, qkeys(prefix), Fp)
    assert "not valid JSON" in problem
    await aredis.hset(meta(prefix), SNAPSHOT_FIELD, json.dumps({"format": 99, "queues": {}}))
    (problem,) = await check_contract(aredis, qkeys(prefix), Fp)
    assert "cannot be compared" in problem


# -- producers record it --------------------------------------------------------------------------


async def test_queue_records_the_contract_on_its_first_send_and_never_again(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = Queue(Fp, aredis, prefix=prefix)
    assert not await aredis.exists(meta(prefix))
    await q.add(Fp.ev, Event(project_id="p", count=1))
    assert await aredis.hget(meta(prefix), FINGERPRINT_FIELD) == fingerprint(Fp).encode()

    await aredis.delete(meta(prefix))  # a record written again would recreate it
    await q.add(Fp.ev, Event(project_id="p", count=2))
    await q.for_key("k").add(Fp.ev, Event(project_id="p", count=3))  # a view shares the record
    await q.add_bulk([JobRequest(Fp.ev, Event(project_id="p", count=4))] * 3)
    await q.add(Fp.ev, Event(project_id="p", count=5), job_id="j")
    assert not await aredis.exists(meta(prefix))  # no extra call on later adds


async def test_each_lane_is_recorded_on_the_first_send_to_it(
    aredis: aioredis.Redis, prefix: str
) -> None:
    q = Queue(Fp, aredis, prefix=prefix)
    await q.add(Fp.ev, Event(project_id="p", count=1))
    secondary = meta(prefix, "fp-secondary")
    assert not await aredis.exists(secondary)
    await Queue(Fp, aredis, prefix=prefix, secondary=True).add(
        Fp.ev, Event(project_id="p", count=1)
    )
    assert await aredis.hget(secondary, FINGERPRINT_FIELD) == fingerprint(Fp).encode()


def test_sync_queue_records_the_contract_once(sredis: redis.Redis, prefix: str) -> None:
    q = SyncQueue(Fp, sredis, prefix=prefix)
    q.add(Fp.ev, Event(project_id="p", count=1))
    assert sredis.hget(meta(prefix), FINGERPRINT_FIELD) == fingerprint(Fp).encode()
    sredis.delete(meta(prefix))
    q.for_key("k").add(Fp.ev, Event(project_id="p", count=2))
    assert not sredis.exists(meta(prefix))


async def test_an_unreachable_redis_while_recording_is_tried_again_on_the_next_send(
    aredis: aioredis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = producer_module.record_contract

    async def flaky(client: Any, keys: QueueKeys, c: type[QueueContract]) -> None:
        calls.append(keys.queue)
        if len(calls) == 1:
            raise RedisUnavailable("connection dropped", queue=keys.queue)
        await real(client, keys, c)

    monkeypatch.setattr(producer_module, "record_contract", flaky)
    q = Queue(Fp, aredis, prefix=prefix)
    assert await q.add(Fp.ev, Event(project_id="p", count=1))  # the job is in, all the same
    assert not await aredis.exists(meta(prefix))
    await q.add(Fp.ev, Event(project_id="p", count=2))
    await q.add(Fp.ev, Event(project_id="p", count=3))
    assert calls == ["fp", "fp"]
    assert await aredis.hget(meta(prefix), FINGERPRINT_FIELD) == fingerprint(Fp).encode()


async def test_a_refused_record_is_logged_once_and_never_fails_an_add(
    redis_server: RedisServer, aredis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"{prefix}-nohset"
    await aredis.acl_setuser(
        user,
        enabled=True,
        nopass=True,
        categories=["+@all"],
        commands=["-hset"],
        keys=["*"],
    )
    client = aioredis.Redis(port=redis_server.port, username=user)
    try:
        q = Queue(Fp, client, prefix=prefix)
        with caplog.at_level(logging.WARNING, logger="streamq.producer"):
            for n in range(3):
                assert await q.add(Fp.ev, Event(project_id="p", count=n))
        assert len(await aredis.xrange(QueueKeys(prefix, "fp", 1).shards[0].stream)) == 3
        warnings = [r for r in caplog.records if "contract fingerprint" in r.getMessage()]
        assert len(warnings) == 1
        assert "'fp'" in warnings[0].getMessage()
    finally:
        await client.aclose()
        await aredis.acl_deluser(user)
