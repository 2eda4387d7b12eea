"""``WORKER_EVENT_LOOP``: uvloop when installed (or asked for), asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamq import JobRequest, SyncQueue
from worker.loops import loop_factory, loop_name

from .fleet_app import Tasks, Work
from .helpers import ROOT, WorkerProcess, clean_env, wait_for

# Run python -m worker as if uvloop were not installed: an import of it fails.
WITHOUT_UVLOOP = (
    sys.executable, "-c",
    "import runpy, sys; sys.modules['uvloop'] = None; sys.argv = ['worker']; "
    "runpy.run_module('worker', run_name='__main__', alter_sys=True)",
)


def loop_env(url: str, prefix: str, event_loop: str) -> dict[str, str]:
    return clean_env(WORKER_APP="tests.entrypoint.fleet_app:app", REDIS_URL=url,
                     REDIS_PREFIX=prefix, QUEUE_CONSUMER_TASKS_IS_ENABLED="true",
                     WORKER_EVENT_LOOP=event_loop, LOG_FORMAT="json")


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.kill()


def consuming_loop(w: WorkerProcess) -> str:
    w.wait_consuming()
    return next(r["event_loop"] for r in w.records() if r["message"] == "consuming")


def test_asyncio_is_asyncios_own_loop() -> None:
    assert loop_factory("asyncio") is None
    with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
        assert loop_name(runner.get_loop()) == "asyncio"


def test_auto_takes_uvloop_when_installed_and_asyncio_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uvloop = pytest.importorskip("uvloop")
    assert loop_factory("auto") is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        assert loop_name(runner.get_loop()) == "uvloop"
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert loop_factory("auto") is None


def test_the_worker_runs_jobs_on_uvloop(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    pytest.importorskip("uvloop")
    w = WorkerProcess(loop_env(redis_url, prefix, "uvloop"), tmp_path / "worker.log")
    workers.append(w)
    assert consuming_loop(w) == "uvloop"
    SyncQueue(Tasks, sredis, prefix=prefix).add_bulk(
        JobRequest(Tasks.task, Work(n=n)) for n in range(50)
    )
    wait_for(lambda: sredis.scard(f"{prefix}:done") == 50, 30, "every job to run")
    assert w.terminate() == 0


def test_uvloop_asked_for_but_not_installed_exits_2_naming_the_variable() -> None:
    env = loop_env("redis://127.0.0.1:1/0", "p", "uvloop")
    done = subprocess.run(WITHOUT_UVLOOP, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "WORKER_EVENT_LOOP: uvloop is not installed: pip install 'streamq[uvloop]'" in (
        done.stderr)


def test_auto_without_uvloop_runs_on_asyncio(
    redis_url: str, prefix: str, tmp_path: Path, workers: list[WorkerProcess],
) -> None:
    w = WorkerProcess(loop_env(redis_url, prefix, "auto"), tmp_path / "worker.log",
                      command=WITHOUT_UVLOOP)
    workers.append(w)
    assert consuming_loop(w) == "asyncio"
    assert w.terminate() == 0
