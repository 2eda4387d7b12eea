"""``python -m worker`` and the app's schedules, runners and startup hooks: the
``SCHEDULER_IS_ENABLED``, ``SCHEDULE_<NAME>_IS_ENABLED`` and ``RUNNER_<NAME>_IS_ENABLED``
flags (checked up front, obeyed in every worker process) and a startup hook that fails."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamq.keys import QueueKeys
from tests.support.redis_server import free_port

from .helpers import Supervised, WorkerProcess, clean_env, last_line, run_worker, wait_for
from .scheduled_app import Beats

APP = "tests.entrypoint.scheduled_app:app"
HOOK = "tests.entrypoint.scheduled_app.open_database"


def app_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    return clean_env(**{"WORKER_APP": APP, "REDIS_URL": url, "REDIS_PREFIX": prefix,
                        "LOG_FORMAT": "json", **extra})


@pytest.fixture
def started() -> Iterator[list[WorkerProcess]]:
    procs: list[WorkerProcess] = []
    yield procs
    for p in procs:
        p.kill()


def ran(client: redis.Redis, prefix: str, runner: str) -> set[int]:
    return {int(pid) for pid in client.smembers(f"{prefix}:ran:{runner}")}


def queued_beats(client: redis.Redis, prefix: str) -> int:
    lane = Beats.primary
    return sum(client.xlen(s.stream) for s in QueueKeys(prefix, lane.name, lane.shards).shards)


# -- refused up front ---------------------------------------------------------------------
def test_unknown_and_malformed_flags_exit_2_naming_each_before_connecting() -> None:
    closed = free_port()  # nothing listens: a connection attempt would exit 1 instead
    done = run_worker(app_env(
        f"redis://127.0.0.1:{closed}/0", "p",
        QUEUE_CONSUMER_BEATS_IS_ENABLED="true",
        SCHEDULE_HEARTBEET_IS_ENABLED="false",
        RUNNER_WRITER_C_IS_ENABLED="true",
        RUNNER_WRITER_A_IS_ENABLED="maybe",
        SCHEDULER_IS_ENABLED="off",
        RUNNER_OS="Linux",  # a CI runner's variable: not a flag, not read
    ))
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert "SCHEDULE_HEARTBEET_IS_ENABLED: unknown schedule; declared schedules: heartbeat" in err
    assert ("RUNNER_WRITER_C_IS_ENABLED: unknown runner; declared runners: writer-a, writer-b"
            in err)
    assert "RUNNER_WRITER_A_IS_ENABLED: expected true/false" in err
    assert "SCHEDULER_IS_ENABLED: expected true/false" in err
    assert "RUNNER_OS" not in err
    assert "cannot reach Redis" not in err


def test_schedule_and_runner_flags_of_an_app_without_any_are_unknown() -> None:
    done = run_worker(clean_env(
        WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
        SCHEDULE_NIGHTLY_IS_ENABLED="true", RUNNER_CLEANER_IS_ENABLED="false",
    ))
    assert done.returncode == 2, done.stderr
    assert "SCHEDULE_NIGHTLY_IS_ENABLED: unknown schedule" in done.stderr
    assert "RUNNER_CLEANER_IS_ENABLED: unknown runner" in done.stderr
    assert "(none: the app declares no schedule)" in done.stderr


def test_nothing_enabled_at_all_still_exits_2() -> None:
    done = run_worker(app_env(
        f"redis://127.0.0.1:{free_port()}/0", "p", SCHEDULER_IS_ENABLED="false",
        RUNNER_WRITER_A_IS_ENABLED="false", RUNNER_WRITER_B_IS_ENABLED="no",
    ))
    assert done.returncode == 2, done.stderr
    assert "no queue is enabled (and every runner and schedule is disabled)" in done.stderr
    assert "QUEUE_CONSUMER_BEATS_IS_ENABLED=true" in done.stderr


# -- obeyed -------------------------------------------------------------------------------
def test_a_runners_only_process_runs_the_enabled_runner_and_not_the_disabled_one(
    redis_url: str, prefix: str, sredis: redis.Redis, tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    # No queue is enabled: a process of runners alone is a deployment, not a mistake.
    w = WorkerProcess(app_env(redis_url, prefix, RUNNER_WRITER_B_IS_ENABLED="false",
                              SCHEDULER_IS_ENABLED="false"), tmp_path / "w.log")
    started.append(w)
    w.wait_consuming()
    wait_for(lambda: ran(sredis, prefix, "writer-a"), 10, "writer-a to run")
    time.sleep(0.3)  # writer-b, were it started, runs as soon as writer-a does
    assert ran(sredis, prefix, "writer-a") == {w.proc.pid}
    assert ran(sredis, prefix, "writer-b") == set()
    disabled = [r for r in w.records() if r["message"] == "runner disabled"]
    assert [(r["runner"], r["flag"]) for r in disabled] == [
        ("writer-b", "RUNNER_WRITER_B_IS_ENABLED")
    ]
    assert w.terminate() == 0, w.log


def test_every_worker_process_of_a_supervisor_obeys_the_runner_flags(
    redis_url: str, prefix: str, sredis: redis.Redis, tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    s = Supervised(app_env(redis_url, prefix, WORKER_PROCESSES="2",
                           QUEUE_CONSUMER_BEATS_IS_ENABLED="true",
                           RUNNER_WRITER_A_IS_ENABLED="false"), tmp_path / "s.log")
    started.append(s)
    pids = s.wait_all_consuming()
    s.wait(lambda: ran(sredis, prefix, "writer-b") == set(pids), 10,
           "writer-b to run in both processes")
    assert ran(sredis, prefix, "writer-a") == set()
    assert s.stop() == 0, s.log


@pytest.mark.parametrize(("flag", "said"), [
    ("SCHEDULER_IS_ENABLED", "scheduler disabled by its config"),
    ("SCHEDULE_HEARTBEAT_IS_ENABLED", "no schedule runs in this process"),
])
def test_a_disabled_scheduler_or_schedule_enqueues_nothing(
    flag: str, said: str, redis_url: str, prefix: str, sredis: redis.Redis, tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    env = app_env(redis_url, prefix, QUEUE_CONSUMER_BEATS_IS_ENABLED="true")
    off = WorkerProcess({**env, flag: "false"}, tmp_path / "off.log")
    started.append(off)
    off.wait_consuming()
    assert any(said in r["message"] for r in off.records()), off.log
    time.sleep(0.6)  # three ticks of the 0.2 s schedule
    assert queued_beats(sredis, prefix) == 0
    assert sredis.get(f"{prefix}:beats") is None
    assert off.terminate() == 0, off.log

    # The same app with the flag unset does enqueue: the silence above was the flag's.
    on = WorkerProcess(env, tmp_path / "on.log")
    started.append(on)
    on.wait_consuming()
    wait_for(lambda: int(sredis.get(f"{prefix}:beats") or 0) >= 2, 10, "beats to run")
    assert on.terminate() == 0, on.log


# -- a startup hook that fails ------------------------------------------------------------
def test_a_failing_startup_hook_exits_1_naming_the_hook_not_redis(
    redis_url: str, prefix: str, sredis: redis.Redis,
) -> None:
    done = run_worker(app_env(redis_url, prefix, QUEUE_CONSUMER_BEATS_IS_ENABLED="true",
                              SCHEDULED_APP_DATABASE_DOWN="1"))
    assert done.returncode == 1, done.stderr
    last = json.loads(last_line(done.stderr))
    assert last["message"] == (
        f"startup hook {HOOK} failed: ConnectionRefusedError: [Errno 111] the app's database "
        "refused the connection"
    )
    assert last["level"] == "ERROR"
    assert "cannot reach Redis" not in done.stderr
    # The hook's own traceback is logged, pointing at its line.
    traced = [json.loads(line) for line in done.stderr.splitlines() if '"exc"' in line]
    assert any("open_database" in r["exc"] and "ConnectionRefusedError" in r["exc"]
               for r in traced), done.stderr
    assert ran(sredis, prefix, "writer-a") == set()  # nothing started after the hook


def test_a_failing_startup_hook_in_text_logs_ends_with_the_one_line(
    redis_url: str, prefix: str,
) -> None:
    done = run_worker(app_env(redis_url, prefix, QUEUE_CONSUMER_BEATS_IS_ENABLED="true",
                              SCHEDULED_APP_DATABASE_DOWN="1", LOG_FORMAT="text"))
    assert done.returncode == 1, done.stderr
    assert (f"streamq.worker.main: startup hook {HOOK} failed: ConnectionRefusedError: "
            "[Errno 111] the app's database refused the connection") in last_line(done.stderr)
    assert "Traceback (most recent call last)" in done.stderr
