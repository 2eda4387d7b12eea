"""The scripts of tracked jobs: enqueue records where a tracked job is, promote and release
follow it to its new entry, settle_tracked removes it (writing the final record) or moves it
to the delayed set, a cancel request turns a retry into a cancel, and nothing is written for
untracked jobs."""

from __future__ import annotations

import json

from streamq import ops
from streamq.jobstatus import decode_status, final_record
from streamq.ops import SettleStatus
from tests.scripts.helpers import (
    GROUP,
    item,
    make_group,
    read,
    run1,
    server_ms,
    shard,
    token,
    wait_until,
    xrange,
)

CTL = '{"keep":60000}'


def tracked(job_id: str, **kw):
    it = item(job_id, **kw)
    return ops.EnqueueItem(it.job_id, it.values, delay_ms=it.delay_ms, dedup=it.dedup, ctl=CTL)


async def record(r, sk, job_id):
    raw = await r.hget(sk.tracked, job_id)
    return json.loads(raw) if raw else None


async def status(r, sk, job_id):
    reply = await run1(r, ops.job_status(sk, GROUP, job_id))
    return decode_status(job_id, sk.queue, sk.name, reply)


async def test_enqueue_records_a_tracked_job_and_nothing_for_an_untracked_one(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    assert await run1(aredis, ops.enqueue(
        sk, [tracked("a"), item("b"), tracked("c", delay_ms=60_000, dedup=True)],
        dedup_window_ms=60_000,
    )) == [True, True, True]

    entries = await xrange(aredis, sk.stream)
    assert [e.fields.get("ctl") for e in entries] == [CTL, None]
    assert await record(aredis, sk, "a") == {"e": entries[0].id, "k": 60000}
    assert await record(aredis, sk, "b") is None
    rec_c = await record(aredis, sk, "c")
    assert rec_c["k"] == 60000
    assert rec_c["m"].startswith("c:")
    assert await aredis.hlen(sk.tracked) == 2
    # A duplicate of a dedup'd id writes nothing, its record included.
    assert await run1(aredis, ops.enqueue(sk, [tracked("c", dedup=True)],
                                          dedup_window_ms=60_000)) == [False]
    assert await record(aredis, sk, "c") == rec_c


async def test_promote_points_the_record_at_the_new_entry(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a", delay_ms=1)], dedup_window_ms=1000))

    async def moved() -> bool:
        return (await run1(aredis, ops.promote(sk))).moved == 1 or await aredis.xlen(sk.stream)

    await wait_until(moved, what="the promotion")
    (entry,) = await xrange(aredis, sk.stream)
    assert entry.fields["ctl"] == CTL
    assert await record(aredis, sk, "a") == {"e": entry.id, "k": 60000}
    assert (await status(aredis, sk, "a")).state == "waiting"


async def test_release_points_the_record_at_the_re_added_entry_as_waiting(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    await run1(aredis, ops.control(sk, GROUP, "w1", [("a", e.id, 123)]))
    assert (await status(aredis, sk, "a")).since_ms == 123

    assert await run1(aredis, ops.release(sk, GROUP, "w1", [e.id], token=token())) == [
        SettleStatus.APPLIED
    ]
    (new,) = await xrange(aredis, sk.stream)
    assert await record(aredis, sk, "a") == {"e": new.id, "k": 60000}
    st = await status(aredis, sk, "a")
    assert (st.state, st.consumer, st.since_ms) == ("waiting", None, None)


async def test_complete_removes_the_record_and_writes_the_final_one_once(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    tok = token()
    call = ops.settle_tracked(
        sk, GROUP, "w1", entry_id=e.id, job_id="a", action="complete", keep_ms=60_000,
        record=final_record(job_name="work", attempt=1, result_json='{"x":1}'), token=tok,
    )
    assert await run1(aredis, call) == (SettleStatus.APPLIED, "c")
    assert await aredis.hlen(sk.tracked) == 0
    assert await aredis.xlen(sk.stream) == 0
    st = await status(aredis, sk, "a")
    assert (st.state, st.result_json, st.attempt) == ("completed", '{"x":1}', 1)
    assert 0 < await aredis.pttl(sk.result("a")) <= 60_000
    # A re-send (its reply was lost) answers the same and writes nothing again.
    await aredis.delete(sk.result("a"))
    assert await run1(aredis, call) == (SettleStatus.APPLIED, "c")
    assert await aredis.exists(sk.result("a")) == 0
    # Another consumer's settle of an entry it does not own changes nothing.
    assert await run1(aredis, ops.settle_tracked(
        sk, GROUP, "w2", entry_id=e.id, job_id="a", action="complete", keep_ms=1,
        record="{}", token=token())) == (SettleStatus.GONE, "")


async def test_a_cancel_request_turns_a_retry_into_a_cancel(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    assert await run1(aredis, ops.cancel(sk, GROUP, "a")) == ("requested", "w1")
    assert await run1(aredis, ops.control(sk, GROUP, "w1", [("a", e.id, 1)])) == ["a"]
    # A worker that does not hold the entry hears nothing and records nothing.
    assert await run1(aredis, ops.control(sk, GROUP, "w9", [("a", e.id, 2)])) == []

    reply = await run1(aredis, ops.settle_tracked(
        sk, GROUP, "w1", entry_id=e.id, job_id="a", action="retry", keep_ms=60_000,
        record=final_record(job_name="work", attempt=1), member=f"a:{e.id}", delay_ms=10,
        fields=[], token=token(),
    ))
    assert reply == (SettleStatus.APPLIED, "x")
    assert await aredis.zcard(sk.delayed) == 0
    assert await aredis.xlen(sk.stream) == 0
    assert (await status(aredis, sk, "a")).state == "cancelled"


async def test_retry_moves_the_record_to_the_delayed_member(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    fields = ["due", "", "id", "a", "name", "work", "ts", "1", "attempt", "2", "payload", "{}",
              "baggage", '{"errors":[{"type":"Boom","message":"x"}]}', "trace", "", "ctl", CTL]
    now = await server_ms(aredis)
    assert await run1(aredis, ops.settle_tracked(
        sk, GROUP, "w1", entry_id=e.id, job_id="a", action="retry", keep_ms=60_000,
        record="{}", member=f"a:{e.id}", delay_ms=5_000, fields=fields, token=token(),
    )) == (SettleStatus.APPLIED, "r")
    assert await record(aredis, sk, "a") == {"m": f"a:{e.id}", "k": 60000}
    st = await status(aredis, sk, "a")
    assert (st.state, st.attempt, st.last_error) == ("retrying", 2, "Boom: x")
    assert now + 5_000 <= st.due_ms <= now + 10_000


async def test_progress_is_fenced_on_the_entry(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    assert await run1(aredis, ops.progress(sk, GROUP, "w1", job_id="a", entry_id=e.id,
                                           fraction=0.5, detail='"half"'))
    assert not await run1(aredis, ops.progress(sk, GROUP, "w1", job_id="a", entry_id="1-1",
                                               fraction=0.9, detail=""))
    # The worker that lost the entry to a reclaim records nothing.
    assert not await run1(aredis, ops.progress(sk, GROUP, "w2", job_id="a", entry_id=e.id,
                                               fraction=0.9, detail=""))
    st = await status(aredis, sk, "a")
    assert (st.state, st.consumer, st.progress, st.progress_detail) == (
        "active", "w1", 0.5, "half"
    )


async def test_reclaim_of_a_stalled_tracked_job_removes_its_record_and_names_it(aredis, prefix):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a")], dedup_window_ms=1000))
    (e,) = await read(aredis, sk, "w1")
    page = await run1(aredis, ops.reclaim(sk, GROUP, "w2", min_idle_ms=0, count=10,
                                          max_stalled_count=0, dead_cap=0))
    assert page.stalled == [e.id]
    assert page.finals == [ops.TrackedFinal("a", 60000, "work", 1, "job stalled 1 time(s)")]
    assert await aredis.hlen(sk.tracked) == 0
    await run1(aredis, ops.track_final(sk, "a", keep_ms=60_000, record=final_record(
        job_name="work", attempt=1, reason="stalled", error="job stalled", state="dead")))
    st = await status(aredis, sk, "a")
    assert (st.state, st.reason) == ("dead", "stalled")


async def test_complete_tracked_settles_many_jobs_in_one_call_fenced_and_resendable(
    aredis, prefix
):
    sk = shard(prefix)
    await make_group(aredis, sk)
    await run1(aredis, ops.enqueue(sk, [tracked("a"), tracked("b"), tracked("c")],
                                   dedup_window_ms=1000))
    a, b, c = await read(aredis, sk, "w1")
    await aredis.xclaim(sk.stream, GROUP, "w2", 0, [c.id], justid=True)  # c was reclaimed
    rec = final_record(job_name="work", attempt=1, result_json="7")
    call = ops.complete_tracked(sk, GROUP, "w1", [
        ops.TrackedDone(a.id, "a", False, 60_000, rec),
        ops.TrackedDone(b.id, "b", True, 0, rec),
        ops.TrackedDone(c.id, "c", False, 60_000, rec),
    ], token=token())

    applied, other = SettleStatus.APPLIED, SettleStatus.OTHER_OWNER
    assert await run1(aredis, call) == ([applied, applied, other], "cx-")
    assert (await status(aredis, sk, "a")).result_json == "7"
    assert (await status(aredis, sk, "b")).state == "unknown"  # cancelled, keep 0: no record
    assert (await status(aredis, sk, "c")).state == "active"
    assert sorted(json.loads(await aredis.hget(sk.tracked, "c"))) == ["e", "k"]
    assert await aredis.hlen(sk.tracked) == 1
    assert await run1(aredis, call) == ([applied, applied, other], "cx-")
