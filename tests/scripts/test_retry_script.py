"""retry.lua: an owned entry becomes a delayed job with new fields, due on the server clock,
keyed by a member unique to the retry; a re-sent call (same token) answers the same."""

from __future__ import annotations

import json

import pytest

from streamq import ops
from streamq.envelope import FIELD_NAMES, encode_fields
from streamq.errors import RedisOutOfMemory
from streamq.ops import SettleStatus
from tests.scripts.helpers import (
    GROUP,
    delivered,
    out_of_memory,
    own_redis,
    pending,
    run1,
    server_ms,
    shard,
    starts,
    steal,
    token,
    xrange,
)

APPLIED, OTHER_OWNER, GONE = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER, SettleStatus.GONE


def _second_attempt(job_id: str) -> list[str | bytes]:
    return encode_fields(
        job_id=job_id,
        name="work",
        timestamp_ms=1,
        payload_json=f'{{"n":"{job_id}"}}',
        attempt=2,
        retry_baggage={"errors": [{"attempt": 1, "type": "Boom", "message": "x"}]},
    )


def _retry(sk, consumer, entry_id, job_id="j1", delay_ms=5_000, member="m1", tok=None):
    return ops.retry(
        sk,
        GROUP,
        consumer,
        entry_id=entry_id,
        member=member,
        delay_ms=delay_ms,
        values=_second_attempt(job_id),
        token=tok or token(),
    )


async def test_retry_stores_new_fields_under_its_member_and_acks_and_deletes_entry(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    before = await server_ms(aredis)

    assert await run1(aredis, _retry(sk, "w1", e.id)) == APPLIED
    after = await server_ms(aredis)

    score = await aredis.zscore(sk.delayed, "m1")
    assert before + 5_000 <= score <= after + 5_000
    stored = json.loads(await aredis.hget(sk.jobs, "m1"))
    assert stored[0::2] == list(FIELD_NAMES)
    fields = dict(zip(stored[0::2], stored[1::2], strict=True))
    assert fields["due"] == str(int(score))
    assert (fields["id"], fields["attempt"]) == ("j1", "2")
    assert json.loads(fields["baggage"])["errors"][0]["type"] == "Boom"
    assert await aredis.xlen(sk.stream) == 0
    assert await pending(aredis, sk) == {}


async def test_two_copies_of_one_job_id_retried_under_their_own_members_both_come_back(
    aredis, prefix
):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "same", "same")

    assert await run1(aredis, _retry(sk, "w1", a.id, "same", delay_ms=0, member="t1")) == APPLIED
    assert await run1(aredis, _retry(sk, "w1", b.id, "same", delay_ms=0, member="t2")) == APPLIED

    assert await aredis.zcard(sk.delayed) == 2
    assert (await run1(aredis, ops.promote(sk))).moved == 2
    assert [x.fields["id"] for x in await xrange(aredis, sk.stream)] == ["same", "same"]


async def test_retried_job_comes_back_through_promote_as_the_next_attempt(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, _retry(sk, "w1", e.id, delay_ms=0)) == APPLIED

    assert (await run1(aredis, ops.promote(sk))).moved == 1
    (again,) = await xrange(aredis, sk.stream)
    assert again.id != e.id
    assert (again.fields["id"], again.fields["attempt"]) == ("j1", "2")
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0


async def test_negative_delay_is_clamped_to_now(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    before = await server_ms(aredis)
    assert await run1(aredis, _retry(sk, "w1", e.id, delay_ms=-10_000)) == APPLIED
    assert await aredis.zscore(sk.delayed, "m1") >= before


async def test_stale_worker_retry_reports_other_owner_and_changes_nothing(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    assert await run1(aredis, _retry(sk, "w1", e.id)) == OTHER_OWNER
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0
    assert await aredis.xlen(sk.stream) == 1
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_retry_by_a_consumer_that_never_had_the_entry_reports_other_owner(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, _retry(sk, "w9", e.id)) == OTHER_OWNER
    assert await aredis.zcard(sk.delayed) == 0
    assert (await pending(aredis, sk))[e.id].consumer == "w1"


async def test_retry_of_a_settled_entry_reports_gone_and_stores_nothing(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id], token=token())) == [APPLIED]

    assert await run1(aredis, _retry(sk, "w1", e.id)) == GONE
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0


async def test_a_resent_retry_answers_applied_again_and_stores_one_record(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    tok = token()
    assert await run1(aredis, _retry(sk, "w1", e.id, tok=tok)) == APPLIED

    assert await run1(aredis, _retry(sk, "w1", e.id, member="m2", tok=tok)) == APPLIED
    assert await aredis.zrange(sk.delayed, 0, -1) == [b"m1"]
    assert await run1(aredis, _retry(sk, "w1", e.id, member="m3")) == GONE  # another call
    assert 0 < await aredis.pttl(sk.settled(tok)) <= ops.SETTLE_MEMO_MS


async def test_a_resent_retry_answers_other_owner_after_the_new_owner_settled(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")
    tok = token()
    assert await run1(aredis, _retry(sk, "w1", e.id, tok=tok)) == OTHER_OWNER
    assert await run1(aredis, ops.complete(sk, GROUP, "w2", [e.id], token=token())) == [APPLIED]

    assert await run1(aredis, _retry(sk, "w1", e.id, tok=tok)) == OTHER_OWNER


async def test_retry_removes_the_starts_field(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await aredis.hset(sk.starts, e.id, 2)

    assert await run1(aredis, _retry(sk, "w1", e.id)) == APPLIED
    assert await starts(aredis, sk) == {}


async def test_retry_under_oom_fails_with_nothing_changed_and_the_entry_still_owned(prefix):
    async with own_redis() as r:
        sk = shard(prefix)
        (e,) = await delivered(r, sk, "w1", "j1")
        await r.hset(sk.starts, e.id, 2)
        await out_of_memory(r)
        tok = token()

        with pytest.raises(RedisOutOfMemory):
            await run1(r, _retry(sk, "w1", e.id, tok=tok))

        assert await r.zcard(sk.delayed) == 0
        assert await r.hlen(sk.jobs) == 0
        assert [x.id for x in await xrange(r, sk.stream)] == [e.id]
        assert (await pending(r, sk))[e.id].consumer == "w1"
        assert await starts(r, sk) == {e.id: 2}
        assert not await r.exists(sk.settled(tok))
