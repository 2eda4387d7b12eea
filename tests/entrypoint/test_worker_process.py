"""``python -m worker`` as a real subprocess against the test Redis."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamq import JobRequest, SyncQueue
from streamq.keys import QueueKeys
from tests.support.redis_server import RedisServer, find_binary, free_port

from .helpers import ROOT, WorkerProcess, clean_env, wait_for
from .sample_app import Chores, Note, Notes

CANARY = "canary-7f3a9c"
SECRET = "secret-token-51d2"


def worker_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    return clean_env(
        WORKER_APP="tests.entrypoint.sample_app:app",
        REDIS_URL=url,
        REDIS_PREFIX=prefix,
        QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
        QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED="yes",
        QUEUE_CONSUMER_CHORES_IS_ENABLED="1",
        QUEUE_NOTES_CONCURRENCY="8",
        QUEUE_NOTES_SHUTDOWN_TIMEOUT="5",
        LOG_FORMAT="json",
        LOG_LEVEL="DEBUG",
        **extra,
    )


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.kill()


def depth(client: redis.Redis, prefix: str) -> tuple[int, int]:
    """(ready + running + delayed, dead) over every lane of the sample app."""
    live = dead = 0
    for lane in (*Notes.lanes(), *Chores.lanes()):
        for s in QueueKeys(prefix, lane.name, lane.shards).shards:
            live += client.xlen(s.stream) + client.zcard(s.delayed)
            dead += client.xlen(s.dead)
    return live, dead


def test_worker_processes_jobs_and_exits_0_on_sigterm(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    notes = SyncQueue(Notes, sredis, prefix=prefix)
    notes.add_bulk(JobRequest(Notes.note, Note(n=n, text=f"{CANARY} {n}", token=SECRET))
                   for n in range(1, 41))
    aside = SyncQueue(Notes, sredis, prefix=prefix, secondary=True)
    aside.add_bulk(JobRequest(Notes.note, Note(n=n, text=CANARY)) for n in (101, 102, 105))
    SyncQueue(Chores, sredis, prefix=prefix).add(Chores.chore, Note(n=1, text=CANARY))

    w = WorkerProcess(worker_env(redis_url, prefix), tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    # Multiples of 5 fail both attempts: 8 notes + note 105 end as dead letters.
    wait_for(lambda: depth(sredis, prefix) == (0, 9), 30, "every job to settle")

    assert w.terminate() == 0
    records = w.records()
    assert records[-1]["message"] == "stopped"
    assert any(r["message"] == "shutting down gracefully; send the signal again to stop at once"
               and r["signal"] == "SIGTERM" for r in records)


def test_json_logs_parse_and_never_contain_a_payload(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    SyncQueue(Notes, sredis, prefix=prefix).add_bulk(
        JobRequest(Notes.note, Note(n=n, text=CANARY, token=SECRET)) for n in (1, 2, 5, 10)
    )
    w = WorkerProcess(worker_env(redis_url, prefix), tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    wait_for(lambda: depth(sredis, prefix) == (0, 2), 30, "every job to settle")
    assert w.terminate() == 0

    records = w.records()  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    failures = [r for r in records
                if r["logger"] == "streamq.worker" and r["message"].startswith("job failed")]
    # Jobs 5 and 10: one retry and one dead letter each, logged with where, not what.
    assert len(failures) == 4
    assert all(r["queue"] == "notes" and r["job_id"] and r["attempt"] for r in failures)
    assert any(r["message"] == "note filed" and r["level"] == "DEBUG" for r in records)
    assert CANARY not in w.log
    assert SECRET not in w.log


def test_malformed_flag_exits_2_before_connecting(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens here: a connection attempt would fail with 1
    env = worker_env(f"redis://127.0.0.1:{closed}/0", "p", QUEUE_NOTES_SPEED="9")
    env["QUEUE_CONSUMER_CHORES_IS_ENABLED"] = "maybe"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "QUEUE_CONSUMER_CHORES_IS_ENABLED: expected true/false" in done.stderr
    assert "QUEUE_NOTES_SPEED: unknown option 'SPEED'" in done.stderr
    assert time.monotonic() - started < 30


def test_no_queue_enabled_exits_2_listing_the_flags(tmp_path: Path) -> None:
    env = clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL="redis://x:1/0")
    done = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    for flag in ("QUEUE_CONSUMER_NOTES_IS_ENABLED=true",
                 "QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED=true",
                 "QUEUE_CONSUMER_CHORES_IS_ENABLED=true"):
        assert flag in done.stderr


def test_unreachable_redis_exits_1_and_says_where(tmp_path: Path) -> None:
    closed = free_port()
    env = worker_env(f"redis://:hunter2@127.0.0.1:{closed}/0", "p")
    done = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot reach Redis at redis://127.0.0.1:{closed}" in done.stderr
    assert "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


def test_evicting_redis_exits_2_unless_allowed(prefix: str, tmp_path: Path,
                                               workers: list[WorkerProcess]) -> None:
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server")
    server = RedisServer(binary, extra=["--maxmemory-policy", "allkeys-lru"]).start()
    try:
        done = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT,
                              env=worker_env(server.url, prefix), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2
        assert "allkeys-lru" in done.stderr
        assert "ALLOW_UNSAFE_EVICTION=true" in done.stderr

        w = WorkerProcess(worker_env(server.url, prefix, ALLOW_UNSAFE_EVICTION="true"),
                          tmp_path / "worker.log")
        workers.append(w)
        w.wait_consuming()
        assert w.terminate() == 0
    finally:
        server.stop(kill=True)


def test_sigint_also_shuts_down_gracefully(
    redis_url: str, prefix: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    w = WorkerProcess(worker_env(redis_url, prefix), tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    w.proc.send_signal(signal.SIGINT)
    assert w.proc.wait(30) == 0
    assert any(r.get("signal") == "SIGINT" for r in w.records())


def test_second_signal_stops_at_once_leaving_the_job_to_be_reclaimed(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    SyncQueue(Notes, sredis, prefix=prefix).add(Notes.note, Note(n=-1), sharding_key="k")
    shard = QueueKeys(prefix, "notes", 2).for_key("k")
    env = worker_env(redis_url, prefix)
    env["QUEUE_NOTES_SHUTDOWN_TIMEOUT"] = "60"
    w = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    wait_for(lambda: sredis.xpending(shard.stream, "streamq")["pending"] == 1, 20,
             "the long job to start")
    w.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: w.logged("shutting down gracefully; send the signal again to stop at once"),
             20, "the graceful shutdown to begin")
    started = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 1
    assert time.monotonic() - started < 20  # not the 60 s shutdown timeout
    assert w.logged("second signal: stopping now; unfinished jobs are reclaimed after their "
                    "lock expires")


def test_sync_job_past_the_shutdown_timeout_is_released_and_the_process_still_exits_0(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    SyncQueue(Chores, sredis, prefix=prefix).add(Chores.chore, Note(n=-1))
    shard = QueueKeys(prefix, "chores", 1).shards[0]
    env = worker_env(redis_url, prefix, QUEUE_CHORES_SHUTDOWN_TIMEOUT="1")
    w = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    wait_for(lambda: sredis.xpending(shard.stream, "streamq")["pending"] == 1, 20,
             "the long sync chore to start")
    started = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 0
    # Not the 60 s the abandoned thread would take: the job went back to the stream.
    assert time.monotonic() - started < 20
    assert sredis.xlen(shard.stream) == 1
    assert sredis.xpending(shard.stream, "streamq")["pending"] == 0
    assert w.logged("exiting with processor threads still running; their jobs were released")


def test_second_signal_with_a_sync_job_running_does_not_claim_it_was_released(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    SyncQueue(Chores, sredis, prefix=prefix).add(Chores.chore, Note(n=-1))
    shard = QueueKeys(prefix, "chores", 1).shards[0]
    env = worker_env(redis_url, prefix, QUEUE_CHORES_SHUTDOWN_TIMEOUT="60")
    w = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(w)
    w.wait_consuming()
    wait_for(lambda: sredis.xpending(shard.stream, "streamq")["pending"] == 1, 20,
             "the long sync chore to start")
    w.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: w.logged("shutting down gracefully; send the signal again to stop at once"),
             20, "the graceful shutdown to begin")
    started = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 1
    assert time.monotonic() - started < 20  # neither the shutdown timeout nor the thread

    # The job was not handed back: it is still pending for this (gone) consumer, to be
    # reclaimed once its lock expires, and the last words say exactly that.
    assert sredis.xpending(shard.stream, "streamq")["pending"] == 1
    last = w.records()[-1]
    assert last["message"] == (
        "exiting with processor threads still running; 1 job(s) were not released: they "
        "stay pending and another worker reclaims them once their lock expires"
    )
    assert last["unreleased"] == 1
    assert last["forced"] is True
    assert "were released" not in w.log
