"""``Queue.status``: a tracked job's state in every row of the failure table, read without
scanning a stream, and nothing written for untracked jobs."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from streamq import Backoff, PermanentError, Queue, SyncQueue
from streamq.app import App
from streamq.job import Job
from streamq.jobstatus import JobStatus
from streamq.keys import QueueKeys
from tests.jobcontrol.support import FAST, Ctl, Item, Total, qkeys, tracking_keys
from tests.runtime.support import RecordingHooks, server_ms, wait_until


async def test_untracked_jobs_write_no_tracking_records_and_are_unknown(
    managers, aredis, prefix
):
    app = App([Ctl])
    done: list[int] = []

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> None:
        done.append(job.payload.n)

    q = Queue(Ctl, aredis, prefix=prefix)
    ids = [await q.add(Ctl.plain, Item(n=i)) for i in range(3)]
    ids.append(await q.add(Ctl.plain, Item(n=3), delay=timedelta(milliseconds=50)))
    assert await tracking_keys(aredis, prefix) == []
    entries = await aredis.xrange(qkeys(prefix).shards[0].stream)
    assert all(b"ctl" not in fields for _, fields in entries)
    m = managers(app)
    await m.start()
    await wait_until(lambda: len(done) == 4, what="every job ran")
    await m.run_until_idle(5)

    assert await tracking_keys(aredis, prefix) == []
    assert [(await q.status(i)).state for i in ids] == ["unknown"] * 4


async def test_waiting_job_is_waiting_with_its_shard_and_attempt(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))

    st = await q.status(job_id)
    assert (st.state, st.job, st.attempt, st.queue) == ("waiting", "tracked", 1, "jc")
    assert st.shard in Ctl.shard_names()
    assert st.consumer is None
    assert st.progress is None
    assert not st.is_final


async def test_delayed_job_is_delayed_until_its_due_time(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    before = await server_ms(aredis)
    job_id = await q.add(Ctl.plain, Item(n=1), delay=timedelta(minutes=5), track=True)

    st = await q.status(job_id)
    assert st.state == "delayed"
    assert st.due_ms is not None
    assert before + 300_000 <= st.due_ms <= before + 305_000


async def test_running_job_is_active_with_consumer_start_and_progress(managers, aredis, prefix):
    app = App([Ctl])
    reported = asyncio.Event()
    release = asyncio.Event()

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> None:
        assert await job.report_progress(0.25, {"rows": 25})
        reported.set()
        await release.wait()

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))
    m = managers(app)
    await m.start()
    await asyncio.wait_for(reported.wait(), 10)

    async def started_recorded() -> bool:
        return (await q.status(job_id)).since_ms is not None

    # The start is recorded with the worker's next lock renewal (every 0.5 s here).
    await wait_until(started_recorded, what="the start recorded by a renewal")
    st = await q.status(job_id)
    release.set()
    assert (st.state, st.consumer, st.attempt) == ("active", m.consumer, 1)
    assert (st.progress, st.progress_detail) == (0.25, {"rows": 25})
    assert abs(st.since_ms - await server_ms(aredis)) < 10_000  # type: ignore[operator]
    await m.run_until_idle(5)
    # Tracked without keep_result: nothing is kept once the job is done.
    assert (await q.status(job_id)).state == "unknown"
    assert await tracking_keys(aredis, prefix) == []


async def test_failed_attempt_is_retrying_with_next_time_and_last_error(managers, aredis, prefix):
    app = App([Ctl])
    runs = 0

    @app.processor(Ctl, attempts=3, backoff=Backoff.fixed(timedelta(minutes=5)), **FAST)
    async def proc(job: Job[Any]) -> None:
        nonlocal runs
        runs += 1
        raise ValueError("upstream said 503")

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))
    m = managers(app)
    await m.start()
    await wait_until(lambda: runs == 1, what="the first attempt")

    async def retrying() -> bool:
        return (await q.status(job_id)).state == "retrying"

    await wait_until(retrying, what="the retry recorded")
    st = await q.status(job_id)
    assert st.attempt == 2
    assert st.last_error == "ValueError: upstream said 503"
    assert st.due_ms is not None
    assert st.due_ms > await server_ms(aredis) + 200_000


async def _final(q: Queue[Any], job_id: str) -> JobStatus:
    async def final() -> bool:
        return (await q.status(job_id)).is_final

    await wait_until(final, what=f"job {job_id} finished")
    return await q.status(job_id)


async def test_job_dead_after_attempts_run_out_is_dead_with_reason_and_error(
    managers, aredis, prefix
):
    app = App([Ctl])

    @app.processor(Ctl, attempts=2, backoff=Backoff.fixed(0.05), **FAST)
    async def proc(job: Job[Any]) -> None:
        raise ValueError(f"bad row {job.payload.n}")

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.plain, Item(n=7), keep_result=timedelta(minutes=1))
    m = managers(app)
    await m.start()
    st = await _final(q, job_id)
    assert (st.state, st.reason, st.attempt, st.job) == ("dead", "error", 2, "plain")
    assert st.last_error == "bad row 7"
    assert st.finished_ms is not None
    sk = qkeys(prefix).shards[0]
    assert [await aredis.hlen(s.tracked) for s in qkeys(prefix).shards] == [0, 0, 0, 0]
    assert sk.tracked  # the location record is gone; the final record expires:
    ttl = await aredis.pttl(QueueKeys(prefix, "jc", 4).shards[_index(st)].result(job_id))
    assert 0 < ttl <= 60_000


def _index(st: JobStatus) -> int:
    return Ctl.shard_names().index(st.shard or "")


async def test_permanent_error_is_dead_at_once(managers, aredis, prefix):
    app = App([Ctl])

    @app.processor(Ctl, attempts=5, **FAST)
    async def proc(job: Job[Any]) -> None:
        raise PermanentError("project deleted")

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1))
    m = managers(app)
    await m.start()
    st = await _final(q, job_id)
    assert (st.state, st.reason, st.attempt, st.last_error) == (
        "dead", "permanent", 1, "project deleted"
    )


async def test_poison_payload_of_a_tracked_job_is_dead_invalid_payload(managers, aredis, prefix):
    app = App([Ctl])
    ran = 0

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> None:
        nonlocal ran
        ran += 1

    hooks = RecordingHooks()
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1), job_id="poison-1")
    st = await q.status(job_id)
    sk = qkeys(prefix).shards[_index(st)]
    # A producer with another idea of the payload: the same entry, the payload broken.
    (eid, fields), = await aredis.xrange(sk.stream)
    await aredis.xdel(sk.stream, eid)
    fields[b"payload"] = b'{"n": "not a number"}'
    new_id = await aredis.xadd(sk.stream, fields)
    await aredis.hset(sk.tracked, job_id, f'{{"e":"{new_id.decode()}","k":60000}}')
    m = managers(app, hooks=hooks)
    await m.start()
    st = await _final(q, job_id)
    assert (st.state, st.reason) == ("dead", "invalid_payload")
    assert "n" in (st.last_error or "")
    assert ran == 0
    assert hooks.counts["dead:invalid_payload"] == 1


async def test_job_of_a_killed_worker_is_active_again_under_its_reclaimer(
    managers, aredis, prefix
):
    app = App([Ctl])
    started = asyncio.Event()
    release = asyncio.Event()

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> Total:
        started.set()
        await release.wait()
        return Total(total=job.payload.n)

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1), sharding_key="k")
    qk = qkeys(prefix)
    sk = qk.for_key("k")
    # A worker that took the job and died: the entry is pending for a consumer that is gone.
    for shard in qk.shards:
        await aredis.xgroup_create(shard.stream, "streamq", "0", mkstream=True)
    await aredis.xreadgroup("streamq", "dead-worker", {sk.stream: ">"}, count=1)
    st = await q.for_key("k").status(job_id)
    assert (st.state, st.consumer, st.since_ms) == ("active", "dead-worker", None)

    m = managers(app, overrides={"jc": {"stalled_interval": 0.2}})
    await m.start()
    await asyncio.wait_for(started.wait(), 15)

    async def reclaimed() -> bool:
        s = await q.for_key("k").status(job_id)
        return s.consumer == m.consumer and s.since_ms is not None

    await wait_until(reclaimed, what="the reclaimer running the job")
    release.set()
    st = await _final(q, job_id)
    assert (st.state, st.result_json) == ("completed", '{"total":1}')


async def test_for_key_view_finds_a_job_added_with_that_key_on_one_shard(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1), sharding_key="tenant-9")

    st = await q.for_key("tenant-9").status(job_id)
    assert st.state == "waiting"
    assert st.shard == q.shard_for("tenant-9")
    assert (await q.status(job_id)).shard == st.shard
    other = next(k for k in ("a", "b", "c", "d", "e") if q.shard_for(k) != st.shard)
    assert (await q.for_key(other).status(job_id)).state == "unknown"


def test_sync_queue_status_reads_the_same_records(sredis, prefix):
    q = SyncQueue(Ctl, sredis, prefix=prefix)
    job_id = q.add(Ctl.tracked, Item(n=1), delay=60)
    assert q.status(job_id).state == "delayed"
    assert q.status("no-such-job").state == "unknown"


async def test_a_bad_job_id_is_refused_before_anything_is_sent(aredis, prefix):
    from streamq import ConfigurationError

    with pytest.raises(ConfigurationError, match="job_id"):
        await Queue(Ctl, aredis, prefix=prefix).status("")


async def test_a_tracked_job_released_at_shutdown_is_waiting_again(managers, aredis, prefix):
    app = App([Ctl])
    started = asyncio.Event()

    @app.processor(Ctl, shutdown_timeout=0.2, **FAST)
    async def proc(job: Job[Any]) -> None:
        started.set()
        await asyncio.sleep(60)

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))
    m = managers(app)
    await m.start()
    await asyncio.wait_for(started.wait(), 10)
    await m.close_workers(timeout_s=0.2)

    st = await q.status(job_id)
    assert (st.state, st.consumer, st.since_ms, st.attempt) == ("waiting", None, None, 1)


async def test_sync_processor_reports_progress_from_its_thread(managers, aredis, prefix):
    import threading

    app = App([Ctl])
    reported = threading.Event()
    release = threading.Event()

    @app.processor(Ctl, **FAST)
    def proc(job: Job[Any]) -> None:
        assert job.report_progress_sync(0.5, "half")
        reported.set()
        release.wait(10)

    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1))
    m = managers(app)
    await m.start()
    try:
        assert await asyncio.to_thread(reported.wait, 10)
        st = await q.status(job_id)
        assert (st.state, st.progress, st.progress_detail) == ("active", 0.5, "half")
    finally:
        release.set()


async def test_progress_out_of_range_is_refused_naming_the_field(managers, aredis, prefix):
    from streamq import ConfigurationError

    app = App([Ctl])
    errors: list[BaseException] = []

    @app.processor(Ctl, **FAST)
    async def proc(job: Job[Any]) -> None:
        try:
            await job.report_progress(1.5)
        except ConfigurationError as exc:
            errors.append(exc)
        assert not await Job(id="x", name="n", queue="q", shard="q", payload=job.payload,
                             attempt=1, max_attempts=1, timestamp=0).report_progress(0.1)

    q = Queue(Ctl, aredis, prefix=prefix)
    await q.add(Ctl.tracked, Item(n=1), job_id="p-1")
    m = managers(app)
    await m.start()
    await wait_until(lambda: len(errors) == 1, what="the refusal")
    assert "'fraction'" in str(errors[0])
    assert (errors[0].queue, errors[0].job_id) == ("jc", "p-1")


async def test_add_bulk_tracks_the_requests_that_ask_and_only_those(aredis, prefix):
    from streamq import JobRequest

    q = Queue(Ctl, aredis, prefix=prefix)
    ids = await q.add_bulk([
        JobRequest(Ctl.plain, Item(n=1), track=True),
        JobRequest(Ctl.plain, Item(n=2)),
        JobRequest(Ctl.plain, Item(n=3), keep_result=timedelta(seconds=30)),
        JobRequest(Ctl.tracked, Item(n=4), track=False),
    ])
    states = [(await q.status(i)) for i in ids]
    assert [s.state for s in states] == ["waiting", "unknown", "waiting", "unknown"]
    assert [s.keep_ms for s in states[::2]] == [0, 30_000]
    assert sum([await aredis.hlen(sk.tracked) for sk in qkeys(prefix).shards]) == 2
