"""fail.lua: an owned entry moves to the capped dead stream with failed_at, fenced; a re-sent
call (same token) answers the same."""

from __future__ import annotations

import pytest

from streamq import ops
from streamq._redis import run_calls
from streamq.errors import RedisOutOfMemory
from streamq.ops import SettleStatus
from tests.scripts.helpers import (
    GROUP,
    delivered,
    enqueue,
    make_group,
    out_of_memory,
    own_redis,
    pending,
    read,
    run1,
    server_ms,
    shard,
    starts,
    steal,
    token,
    xrange,
)

APPLIED, OTHER_OWNER, GONE = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER, SettleStatus.GONE


def _dead_fields(e) -> list[str]:
    flat: list[str] = []
    for k, v in e.fields.items():
        flat += [k, v]
    return [*flat, "reason", "error", "error", "ValueError: boom", "attempts", "3"]


def _fail(sk, consumer, e, tok=None, cap=100):
    return ops.fail(
        sk,
        GROUP,
        consumer,
        entry_id=e.id,
        dead_fields=_dead_fields(e),
        dead_cap=cap,
        token=tok or token(),
    )


async def test_fail_moves_owned_entry_to_dead_with_its_fields_and_failed_at(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    before = await server_ms(aredis)

    assert await run1(aredis, _fail(sk, "w1", e)) == APPLIED
    after = await server_ms(aredis)

    (dead,) = await xrange(aredis, sk.dead)
    assert dead.fields == {
        **e.fields,
        "reason": "error",
        "error": "ValueError: boom",
        "attempts": "3",
        "failed_at": dead.fields["failed_at"],
    }
    assert before <= int(dead.fields["failed_at"]) <= after
    assert await aredis.xlen(sk.stream) == 0
    assert await pending(aredis, sk) == {}


async def test_stale_worker_fail_reports_other_owner_and_nothing_is_dead_lettered(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    assert await run1(aredis, _fail(sk, "w1", e)) == OTHER_OWNER
    assert await aredis.xlen(sk.dead) == 0
    assert await aredis.xlen(sk.stream) == 1
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def test_fail_of_a_settled_entry_reports_gone_and_dead_letters_nothing(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    assert await run1(aredis, ops.complete(sk, GROUP, "w1", [e.id], token=token())) == [APPLIED]

    assert await run1(aredis, _fail(sk, "w1", e)) == GONE
    assert await aredis.xlen(sk.dead) == 0


async def test_a_resent_fail_answers_applied_again_and_dead_letters_once(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    tok = token()
    assert await run1(aredis, _fail(sk, "w1", e, tok)) == APPLIED

    assert await run1(aredis, _fail(sk, "w1", e, tok)) == APPLIED
    assert await aredis.xlen(sk.dead) == 1
    assert await run1(aredis, _fail(sk, "w1", e)) == GONE  # another call
    assert 0 < await aredis.pttl(sk.settled(tok)) <= ops.SETTLE_MEMO_MS


async def test_a_resent_fail_answers_other_owner_after_the_new_owner_settled(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")
    tok = token()
    assert await run1(aredis, _fail(sk, "w1", e, tok)) == OTHER_OWNER
    assert await run1(aredis, _fail(sk, "w2", e)) == APPLIED

    assert await run1(aredis, _fail(sk, "w1", e, tok)) == OTHER_OWNER
    assert await aredis.xlen(sk.dead) == 1


async def test_fail_removes_the_starts_field(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await aredis.hset(sk.starts, e.id, 2)

    assert await run1(aredis, _fail(sk, "w1", e)) == APPLIED
    assert await starts(aredis, sk) == {}


async def test_fail_under_oom_fails_with_nothing_changed_and_the_entry_still_owned(prefix):
    async with own_redis() as r:
        sk = shard(prefix)
        (e,) = await delivered(r, sk, "w1", "j1")
        await r.hset(sk.starts, e.id, 2)
        await out_of_memory(r)
        tok = token()

        with pytest.raises(RedisOutOfMemory):
            await run1(r, _fail(sk, "w1", e, tok))

        assert await r.exists(sk.dead) == 0
        assert [x.id for x in await xrange(r, sk.stream)] == [e.id]
        assert (await pending(r, sk))[e.id].consumer == "w1"
        assert await starts(r, sk) == {e.id: 2}
        assert not await r.exists(sk.settled(tok))


async def _fail_all(r, sk, n: int, cap: int) -> None:
    await make_group(r, sk)
    await enqueue(r, sk, *[f"j{i}" for i in range(n)])
    entries = await read(r, sk, "w1", count=n)
    calls = [
        ops.fail(
            sk,
            GROUP,
            "w1",
            entry_id=e.id,
            dead_fields=["id", e.fields["id"]],
            dead_cap=cap,
            token=token(),
        )
        for e in entries
    ]
    assert await run_calls(r, calls) == [APPLIED] * n


async def test_dead_stream_cap_is_honoured_approximately(aredis, prefix):
    sk = shard(prefix)
    await _fail_all(aredis, sk, 350, cap=10)

    # MAXLEN ~ trims whole macro nodes (stream-node-max-entries, 100 by default).
    length = await aredis.xlen(sk.dead)
    assert 10 <= length <= 10 + 100
    last = (await aredis.xrevrange(sk.dead, count=1))[0][1]
    assert last[b"id"] == b"j349"  # the newest dead letters are the ones kept
    assert await aredis.xlen(sk.stream) == 0


async def test_dead_cap_zero_keeps_every_dead_letter(aredis, prefix):
    sk = shard(prefix)
    await _fail_all(aredis, sk, 250, cap=0)
    assert await aredis.xlen(sk.dead) == 250
