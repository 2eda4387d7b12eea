"""retry.lua: an owned entry becomes a delayed job with new fields, due on the server clock."""

from __future__ import annotations

import json

from streamq import ops
from streamq.envelope import FIELD_NAMES, encode_fields
from tests.scripts.helpers import GROUP, delivered, pending, run1, server_ms, shard, steal, xrange


def _second_attempt(job_id: str) -> list[str | bytes]:
    return encode_fields(
        job_id=job_id,
        name="work",
        timestamp_ms=1,
        payload_json=f'{{"n":"{job_id}"}}',
        attempt=2,
        retry_baggage={"errors": [{"attempt": 1, "type": "Boom", "message": "x"}]},
    )


def _retry(sk, consumer, entry_id, job_id="j1", delay_ms=5_000):
    return ops.retry(
        sk,
        GROUP,
        consumer,
        entry_id=entry_id,
        job_id=job_id,
        delay_ms=delay_ms,
        values=_second_attempt(job_id),
    )


async def test_retry_stores_new_fields_in_delayed_and_jobs_and_acks_and_deletes_entry(
    aredis, prefix
):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    before = await server_ms(aredis)

    assert await run1(aredis, _retry(sk, "w1", e.id)) is True
    after = await server_ms(aredis)

    score = await aredis.zscore(sk.delayed, "j1")
    assert before + 5_000 <= score <= after + 5_000
    stored = json.loads(await aredis.hget(sk.jobs, "j1"))
    assert stored[0::2] == list(FIELD_NAMES)
    fields = dict(zip(stored[0::2], stored[1::2], strict=True))
    assert fields["due"] == str(int(score))
    assert fields["attempt"] == "2"
    assert json.loads(fields["baggage"])["errors"][0]["type"] == "Boom"
    assert await aredis.xlen(sk.stream) == 0
    assert await pending(aredis, sk) == {}


async def test_retried_job_comes_back_through_promote_as_the_next_attempt(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, _retry(sk, "w1", e.id, delay_ms=0))

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
    assert await run1(aredis, _retry(sk, "w1", e.id, delay_ms=-10_000))
    assert await aredis.zscore(sk.delayed, "j1") >= before


async def test_stale_worker_retry_is_refused_and_changes_nothing(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    assert await run1(aredis, _retry(sk, "w1", e.id)) is False
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.hlen(sk.jobs) == 0
    assert await aredis.xlen(sk.stream) == 1
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_retry_by_a_consumer_that_never_had_the_entry_is_refused(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    assert await run1(aredis, _retry(sk, "w9", e.id)) is False
    assert await aredis.zcard(sk.delayed) == 0
    assert (await pending(aredis, sk))[e.id].consumer == "w1"
