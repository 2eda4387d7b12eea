"""``python -m worker`` with ``WORKER_PROCESSES`` > 1: real processes against the test Redis.

Every wait is on a condition with a generous deadline: these run beside other suites on a
busy machine, and a worker process takes a second or two to start there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
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
from tests.support.redis_server import free_port
from worker.launch import child_env, describe_exit, metrics_dir
from worker.settings import load_settings
from worker.supervisor import Supervisor, shutdown_grace_s

from .fleet_app import Tasks, Work
from .helpers import ROOT, Supervised, alive, clean_env, http_get

GROUP = "streamq"


def fleet_env(url: str, prefix: str, processes: int = 2, **extra: str) -> dict[str, str]:
    return clean_env(
        WORKER_APP="tests.entrypoint.fleet_app:app",
        REDIS_URL=url,
        REDIS_PREFIX=prefix,
        QUEUE_CONSUMER_TASKS_IS_ENABLED="true",
        QUEUE_TASKS_SHUTDOWN_TIMEOUT="10",
        WORKER_PROCESSES=str(processes),
        LOG_FORMAT="json",
        **extra,
    )


@pytest.fixture
def fleets() -> Iterator[list[Supervised]]:
    started: list[Supervised] = []
    yield started
    for f in started:
        f.kill()


def start(fleets: list[Supervised], env: dict[str, str], tmp_path: Path) -> Supervised:
    f = Supervised(env, tmp_path / f"fleet-{len(fleets)}.log")
    fleets.append(f)
    return f


def add_tasks(client: redis.Redis, prefix: str, count: int, **work: float) -> set[int]:
    SyncQueue(Tasks, client, prefix=prefix).add_bulk(
        JobRequest(Tasks.task, Work(n=n, **work)) for n in range(count)
    )
    return set(range(count))


def done(client: redis.Redis, prefix: str) -> set[int]:
    return {int(n) for n in client.smembers(f"{prefix}:done")}


def shards(prefix: str) -> list[str]:
    return [s.stream for s in QueueKeys(prefix, "tasks", 2).shards]


def pending_by_consumer(client: redis.Redis, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for stream in shards(prefix):
        if not client.exists(stream):
            continue
        for c in client.xpending(stream, GROUP)["consumers"]:
            name = c["name"].decode()
            out[name] = out.get(name, 0) + int(c["pending"])
    return out


def consumer_names(client: redis.Redis, prefix: str) -> set[str]:
    names: set[str] = set()
    for stream in shards(prefix):
        if client.exists(stream):
            names |= {c["name"].decode() for c in client.xinfo_consumers(stream, GROUP)}
    return names


def of_pid(names: set[str] | dict[str, int], pid: int) -> list[str]:
    """Consumer names of process ``pid`` (the default name is ``<host>-<pid>-<random>``)."""
    return [n for n in names if f"-{pid}-" in n]


def metric_sum(text: str, name: str) -> float:
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def test_two_processes_both_consume_under_their_own_consumer_names_and_one_metrics_endpoint(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    fleets: list[Supervised],
) -> None:
    port = free_port()
    f = start(fleets, fleet_env(redis_url, prefix, METRICS_PORT=str(port),
                                METRICS_HOST="127.0.0.1"), tmp_path)
    pids = f.wait_all_consuming()
    assert len(set(pids)) == 2
    assert f.proc.pid not in pids

    jobs = add_tasks(sredis, prefix, 200, sleep_s=0.02)
    f.wait(lambda: done(sredis, prefix) == jobs, 60, "every job to run")

    names = f.wait(lambda: consumer_names(sredis, prefix) if
                     all(of_pid(consumer_names(sredis, prefix), p) for p in pids) else None,
                     30, "both processes in XINFO CONSUMERS")
    assert len(names) == 2
    runs = {int(pid): int(n) for pid, n in sredis.hgetall(f"{prefix}:runs").items()}
    assert set(runs) == set(pids), runs  # both processes ran jobs
    assert sum(runs.values()) >= 200

    # One /metrics for both: the completed counters of both processes add up to the jobs.
    def completed() -> float:
        status, body = http_get(port, "/metrics")
        assert status == 200, body
        return metric_sum(body, "streamq_jobs_completed_total")

    f.wait(lambda: completed() == 200, 30, "/metrics to count 200 completed jobs")
    _, body = http_get(port, "/metrics")
    assert metric_sum(body, "streamq_job_processing_seconds_count") == 200
    assert 'streamq_worker_processes{state="running"} 2.0' in body
    assert f.stop() == 0, f.log


def test_a_killed_process_is_restarted_and_its_jobs_are_reclaimed(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    fleets: list[Supervised],
) -> None:
    port = free_port()
    f = start(fleets, fleet_env(redis_url, prefix, METRICS_PORT=str(port),
                                METRICS_HOST="127.0.0.1"), tmp_path)
    victim, survivor = f.wait_all_consuming()
    jobs = add_tasks(sredis, prefix, 40, sleep_s=1.5)
    held = f.wait(lambda: sum(n for name, n in pending_by_consumer(sredis, prefix).items()
                                if f"-{victim}-" in name), 30, "the victim to hold jobs")

    os.kill(victim, signal.SIGKILL)
    death = re.compile(rf"worker process \d \(pid {victim}\) was killed by SIGKILL; "
                       r"restarting it in [\d.]+ s")
    f.wait(lambda: any(death.fullmatch(r.get("message", "")) for r in f.events()), 30,
             "the supervisor to log the death")
    restarted = f.wait(lambda: [r for r in f.started() if r["restarts"] == 1], 60,
                         "a new process in the victim's place")
    new_pid = int(restarted[0]["pid"])
    assert new_pid not in (victim, survivor)
    assert alive(survivor)

    # Nothing lost: the jobs the victim held ran again elsewhere after their lock expired.
    f.wait(lambda: done(sredis, prefix) == jobs, 90, "every job to run")
    f.wait(lambda: not any(sredis.xlen(s) for s in shards(prefix)), 30, "empty streams")
    assert not any(sredis.xlen(s.dead) for s in QueueKeys(prefix, "tasks", 2).shards)
    _, body = http_get(port, "/metrics")
    assert metric_sum(body, "streamq_jobs_reclaimed_total") >= 1, (held, body)
    assert "streamq_worker_process_restarts_total 1.0" in body
    assert f.stop() == 0, f.log


def test_healthz_fails_while_a_process_is_down_and_recovers(
    redis_url: str, prefix: str, tmp_path: Path, fleets: list[Supervised],
) -> None:
    port = free_port()
    f = start(fleets, fleet_env(redis_url, prefix, METRICS_PORT=str(port),
                                METRICS_HOST="127.0.0.1"), tmp_path)
    pids = f.wait_all_consuming()
    f.wait(lambda: http_get(port, "/healthz")[0] == 200, 30, "/healthz to pass")
    f.wait(lambda: http_get(port, "/readyz")[0] == 200, 30, "/readyz to pass")

    slot = next(r["worker_process"] for r in f.started() if r["pid"] == pids[1])
    os.kill(pids[1], signal.SIGKILL)
    # Until the supervisor sees the death, the process fails health by not answering.
    down = f"worker process {slot} is down (was killed by SIGKILL); restarting"
    status, body = f.wait(lambda: (lambda got: got if down in got[1] else None)(
        http_get(port, "/healthz")), 30, "/healthz to say the process is down")
    assert status == 503
    assert '"status": "fail"' in body
    assert http_get(port, "/readyz")[0] == 503

    f.wait(lambda: http_get(port, "/healthz")[0] == 200, 60, "/healthz to recover")
    status, body = http_get(port, "/healthz")
    assert '"restarts": 1' in body, body
    assert f.stop() == 0, f.log


def test_sigterm_stops_every_process_gracefully_leaving_nothing_pending(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    fleets: list[Supervised],
) -> None:
    f = start(fleets, fleet_env(redis_url, prefix), tmp_path)
    pids = f.wait_all_consuming()
    jobs = add_tasks(sredis, prefix, 60, sleep_s=0.5)
    f.wait(lambda: all(of_pid(pending_by_consumer(sredis, prefix), p) for p in pids), 30,
             "both processes to hold jobs")

    assert f.stop() == 0, f.log
    events = f.events()
    stopped = {r.get("worker_process") for r in events if r.get("message") == "stopped"
               and "worker_process" in r}
    assert stopped == {0, 1}, f.log
    assert events[-1]["message"] == "stopped"  # the supervisor's last word
    assert events[-1]["exit_code"] == 0
    assert not any(alive(p) for p in pids)
    # Every job either ran or is back in the stream for the next worker; none is held.
    assert sum(pending_by_consumer(sredis, prefix).values()) == 0, f.log
    left = sum(sredis.xlen(s) for s in shards(prefix))
    assert len(done(sredis, prefix)) + left == len(jobs), f.log
    assert consumer_names(sredis, prefix) == set(), f.log  # both left the group


def test_second_signal_stops_at_once_and_kills_a_process_that_does_not(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    fleets: list[Supervised],
) -> None:
    f = start(fleets, fleet_env(redis_url, prefix), tmp_path)
    pids = f.wait_all_consuming()
    SyncQueue(Tasks, sredis, prefix=prefix).add(Tasks.task, Work(n=1, block_s=60))
    blocked = f.wait(lambda: next((p for p in pids
                                     if of_pid(pending_by_consumer(sredis, prefix), p)), None),
                       30, "a process to run the blocking job")

    f.proc.send_signal(signal.SIGTERM)
    f.wait(lambda: any(r.get("message", "").startswith("shutting down gracefully")
                         and "worker_process" not in r for r in f.events()), 30,
             "the supervisor to begin the shutdown")
    began = time.monotonic()
    f.proc.send_signal(signal.SIGTERM)
    assert f.proc.wait(60) == 1
    assert time.monotonic() - began < 30  # not the blocking job's 60 s
    said = [r["message"] for r in f.events()]
    assert any(m.startswith("second signal: stopping now") for m in said)
    assert any(m.endswith(f"(pid {blocked}) did not stop within 5 s: killing it (SIGKILL); "
                          "the jobs it still held stay pending and another worker reclaims "
                          "them once their lock expires") for m in said), said
    assert not any(alive(p) for p in pids)


def test_a_process_that_cannot_start_stops_the_others_with_its_exit_code(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
) -> None:
    sredis.xgroup_create(shards(prefix)[0], "analytics", id="0", mkstream=True)
    done_ = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT,
                           env=fleet_env(redis_url, prefix), capture_output=True, text=True,
                           timeout=120)
    assert done_.returncode == 2, done_.stderr
    assert '"variable": "WORKER_GROUP"' in done_.stderr
    assert "could not start: it exited with code 2; stopping the others" in done_.stderr


def test_malformed_worker_processes_exits_2_naming_it() -> None:
    # (every malformed value is in test_settings; this is the process's answer to one)
    env = fleet_env("redis://127.0.0.1:1/0", "p")
    env["WORKER_PROCESSES"] = "two"
    done_ = subprocess.run([sys.executable, "-m", "worker"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert done_.returncode == 2
    assert "WORKER_PROCESSES: expected an integer 1..1024 or auto, got 'two'" in done_.stderr


async def test_a_process_still_running_after_the_grace_period_is_killed_and_said_so(
    sredis: redis.Redis, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # One process, which the blocking job keeps from stopping; a grace period of 1 s instead
    # of the shutdown timeout plus margins, to keep this short.
    env = fleet_env(redis_url, prefix, processes=1, PYTHONPATH=str(ROOT))
    settings, _ = load_settings(env)
    supervisor = Supervisor(settings, child_env=env, metrics_dir=None, grace_s=1.0)
    caplog.set_level(logging.INFO, logger="streamq.worker.supervisor")
    running = asyncio.create_task(supervisor.run())
    try:
        deadline = time.monotonic() + 60
        while not all(c.reported for c in supervisor.children):
            assert not running.done(), caplog.text
            assert time.monotonic() < deadline, "the worker processes did not start"
            await asyncio.sleep(0.05)
        [pid] = [c.pid for c in supervisor.children]
        assert pid is not None
        SyncQueue(Tasks, sredis, prefix=prefix).add(Tasks.task, Work(n=1, block_s=60))
        while not of_pid(pending_by_consumer(sredis, prefix), pid):
            assert time.monotonic() < deadline, "no process took the blocking job"
            await asyncio.sleep(0.05)

        supervisor.stop()
        assert await asyncio.wait_for(running, 30) == 1
    finally:
        if not running.done():
            supervisor.stop()  # the second time forces
            await asyncio.wait_for(running, 30)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"worker process 0 (pid {pid}) did not stop within 1 s: killing it "
                            "(SIGKILL)") for m in said), said
    assert not alive(pid)


# -- the parts, without processes -------------------------------------------------------------
def test_the_grace_period_is_the_longest_shutdown_timeout_then_the_settle_wait_and_a_margin(
) -> None:
    env = {**fleet_env("redis://127.0.0.1:1/0", "p"), "QUEUE_TASKS_SHUTDOWN_TIMEOUT": "12"}
    settings, app = load_settings(env)
    assert shutdown_grace_s(settings, app) == 12 + 12 + 5
    settings, app = load_settings({**env, "QUEUE_TASKS_SHUTDOWN_TIMEOUT": "1"})
    assert shutdown_grace_s(settings, app) == 1 + 5 + 5  # the settle wait is at least 5 s


def test_a_process_end_is_said_by_code_or_signal() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(2) == "exited with code 2"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"


def test_worker_processes_get_the_fresh_metrics_directory_whatever_the_environment_said(
    tmp_path: Path,
) -> None:
    given = {"A": "1", "PROMETHEUS_MULTIPROC_DIR": "/old", "prometheus_multiproc_dir": "/x"}
    assert child_env(given, tmp_path) == {"A": "1", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    assert child_env(given, None) == {"A": "1"}
    with metrics_dir(enabled=True) as path:
        assert path is not None
        assert path.is_dir()
        assert not any(path.iterdir())
    assert not path.exists()
    with metrics_dir(enabled=False) as nothing:
        assert nothing is None
