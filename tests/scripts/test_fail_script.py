"""fail.lua: an owned entry moves to the capped dead stream with failed_at, fenced."""

from __future__ import annotations

from streamq import ops
from streamq._redis import run_calls
from tests.scripts.helpers import (
    GROUP,
    delivered,
    enqueue,
    make_group,
    pending,
    read,
    run1,
    server_ms,
    shard,
    steal,
    xrange,
)


def _dead_fields(e) -> list[str]:
    flat: list[str] = []
    for k, v in e.fields.items():
        flat += [k, v]
    return [*flat, "reason", "error", "error", "ValueError: boom", "attempts", "3"]


async def test_fail_moves_owned_entry_to_dead_with_its_fields_and_failed_at(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    before = await server_ms(aredis)

    call = ops.fail(sk, GROUP, "w1", entry_id=e.id, dead_fields=_dead_fields(e), dead_cap=100)
    assert await run1(aredis, call) is True
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


async def test_stale_worker_fail_is_refused_and_nothing_is_dead_lettered(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    await steal(aredis, sk, "w2")

    call = ops.fail(sk, GROUP, "w1", entry_id=e.id, dead_fields=_dead_fields(e), dead_cap=100)
    assert await run1(aredis, call) is False
    assert await aredis.xlen(sk.dead) == 0
    assert await aredis.xlen(sk.stream) == 1
    p = (await pending(aredis, sk))[e.id]
    assert (p.consumer, p.deliveries) == ("w2", 2)


async def _fail_all(r, sk, n: int, cap: int) -> None:
    await make_group(r, sk)
    await enqueue(r, sk, *[f"j{i}" for i in range(n)])
    entries = await read(r, sk, "w1", count=n)
    calls = [
        ops.fail(sk, GROUP, "w1", entry_id=e.id, dead_fields=["id", e.fields["id"]], dead_cap=cap)
        for e in entries
    ]
    assert await run_calls(r, calls) == [True] * n


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
