"""Running ``python -m worker`` as a subprocess in tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_OURS = ("QUEUE_", "REDIS_", "WORKER_", "STREAMQ_", "METRICS_", "LOG_", "LIVENESS_",
         "ALLOW_UNSAFE")


def _flag(name: str) -> bool:
    """A schedule or runner flag of the worker (other RUNNER_* variables are not ours)."""
    return name == "SCHEDULER_IS_ENABLED" or (
        name.startswith(("SCHEDULE_", "RUNNER_")) and name.endswith("_IS_ENABLED")
    )


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any worker setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS) and not _flag(k)}
    # A worker that has to be killed first dumps its threads' stacks into its log.
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def run_worker(env: Mapping[str, str], *args: str, timeout_s: float = 60.0,
               cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m worker *args`` to completion; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "worker", *args], cwd=cwd, env=dict(env),
                          capture_output=True, text=True, timeout=timeout_s)


def run_workers(envs: Mapping[str, Mapping[str, str]], *, timeout_s: float = 60.0,
                ) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run one ``python -m worker`` per named environment, all at once; each to completion."""
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "worker"], cwd=ROOT, env=dict(env),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, env in envs.items()
    }
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout_s)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def last_line(text: str) -> str:
    """The last non-blank line of ``text``."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class WorkerProcess:
    """``python -m worker`` (or ``command``) with ``env``; stderr (the logs) goes to
    ``log_path``."""

    def __init__(self, env: Mapping[str, str], log_path: Path,
                 command: Sequence[str] = (sys.executable, "-m", "worker")) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                list(command), cwd=ROOT, env=dict(env),
                stdout=log, stderr=subprocess.STDOUT,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """Every log line, parsed as JSON (fails on a line that is not)."""
        return [json.loads(line) for line in self.log.splitlines() if line.strip()]

    def logged(self, message: str) -> bool:
        return any(f'"message": "{message}"' in line for line in self.log.splitlines())

    def wait_consuming(self, timeout_s: float = 20.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.log}")
            return self.logged("consuming")

        wait_for(ready, timeout_s, "the worker to start consuming")

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """Stop a worker that is still running; it dumps its stacks to the log first."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def http_get(port: int, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """``GET http://127.0.0.1:<port><path>``: the status and the body (a 503 too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie child of ours counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class Supervised(WorkerProcess):
    """``python -m worker`` with ``WORKER_PROCESSES`` > 1: the supervisor and its processes."""

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line of the supervisor and its processes (other lines skipped)."""
        out = []
        for line in self.log.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def wait_all_consuming(self, timeout_s: float = 60.0) -> list[int]:
        """The pids of the worker processes, once every one of them consumes."""

        def ready() -> list[int] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited {self.proc.returncode}:\n{self.log}")
            for r in self.events():
                if r.get("message") == "worker processes consuming":
                    return list(r["pids"])
            return None

        pids: list[int] = wait_for(ready, timeout_s, "every worker process to consume")
        return pids

    def started(self) -> list[dict[str, Any]]:
        """The "worker process started" records: slot, pid, restarts."""
        return [r for r in self.events() if r.get("message") == "worker process started"]

    def wait(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """:func:`wait_for`, failing with the supervisor's and its processes' log."""
        try:
            return wait_for(condition, timeout_s, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the log:\n{self.log[-20000:]}") from None

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM the supervisor and wait for its exit code (its log when it takes too long)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the supervisor did not stop in {timeout_s} s:\n{self.log}"
            ) from None

    def child_pids(self) -> set[int]:
        return {int(r["pid"]) for r in self.started()}

    def kill(self) -> None:
        """Stop the supervisor if it still runs, then any worker process left behind."""
        super().kill()
        for pid in self.child_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
