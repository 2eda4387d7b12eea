"""Processing scenarios: a processor doing real per-job work, against raw redis-py doing the same.

Each measurement runs in a fresh process (:mod:`bench.scenario_proc`), so its resident memory
is the worker's own; this process pre-fills the queue and reads the Redis server's figures
(``INFO commandstats`` and ``INFO cpu``) just before ``go`` and just after the run. A
scenario's streamq run and its raw baseline alternate in rounds like every other figure.

- (a) an async processor doing one Redis call (``INCR``) per job, concurrency 10 and 100,
  against a raw ``redis.asyncio`` consume loop at the same concurrency (``XREADGROUP COUNT c``,
  the batch's INCRs as concurrent tasks sharing one client, ``XACK`` + ``XDEL`` in one
  pipeline);
- (b) a sync processor doing one sync Redis call per job, concurrency 10, against the raw
  redis-py loop with 10 threads running the INCRs;
- (c) an async processor awaiting a fixed 5 ms, concurrency 100, against the bound
  concurrency / latency (20,000 jobs/s).

For (c) the raw loop awaiting the same 5 ms is measured as a reference (what this machine
allows), but the ratio is to the bound. For (a) and (b), the per-job work alone (no queue:
``c`` tasks or threads looping over INCR on one shared client) is measured too: the most any
consumer could do.

- (d) a no-op batch processor (``batch=Batch(max_size=100, max_wait=0.005)``, concurrency
  1) against the raw consume loop doing nothing per job (``XREADGROUP COUNT 100``, ``XACK`` +
  ``XDEL`` in one pipeline);
- (e) ``python -m worker`` with ``WORKER_PROCESSES=2`` against one worker process, the
  processor of (a) at concurrency 10, timed on how fast a backlog added at once drains
  (:mod:`bench.processes`); the ratio is 2 processes to 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench import consumers, stats
from bench.producers import stream_key

_ROOT = Path(__file__).resolve().parent.parent
WORK_COMMANDS = frozenset({"incr", "incrby"})
"""The processor's own per-job calls (redis-py sends INCR as INCRBY): not queue traffic."""
CONNECT_COMMANDS = frozenset({"hello", "auth", "select", "client|setinfo", "client|setname",
                              "client|maint_notifications"})
"""A new connection's handshake: once per connection, not per job."""
NOT_QUEUE = WORK_COMMANDS | CONNECT_COMMANDS


@dataclass(frozen=True)
class Scenario:
    key: str
    """Scenario letter, as in docs/performance.md."""
    title: str
    work: str
    """``incr-async``, ``incr-sync``, ``sleep`` or ``noop-batch`` (see
    :mod:`bench.scenario_proc`)."""
    concurrency: int
    baseline: str
    """``raw``: a raw redis-py consume loop doing the same work; ``bound``: concurrency /
    latency; ``one-process``: the same ``python -m worker`` with one worker process."""

    @property
    def name(self) -> str:
        return f"{self.key}-c{self.concurrency}"

    @property
    def bound(self) -> float | None:
        """Jobs/s that no consumer can beat: concurrency over the fixed latency."""
        if self.work != "sleep":
            return None
        return self.concurrency / 0.005


SCENARIOS = (
    Scenario("a", "async processor, one Redis call (INCR) per job", "incr-async", 10, "raw"),
    Scenario("a", "async processor, one Redis call (INCR) per job", "incr-async", 100, "raw"),
    Scenario("b", "sync processor (thread pool), one sync Redis call per job", "incr-sync", 10,
             "raw"),
    Scenario("c", "async processor awaiting 5 ms (asyncio.sleep(0.005))", "sleep", 100, "bound"),
    Scenario("d", "no-op batch processor, Batch(max_size=100, max_wait=0.005)", "noop-batch", 1,
             "raw"),
)

PROCESSES = Scenario("e", "python -m worker, WORKER_PROCESSES=2 vs 1; (a)'s processor",
                     "incr-async", 10, "one-process")
"""Scenario (e): measured by :mod:`bench.processes`, not :mod:`bench.scenario_proc`."""

PENDING: tuple[tuple[str, str], ...] = ()
"""Scenarios to come; the report names them as not measured, with no figures."""


class ScenarioProcess:
    """:mod:`bench.scenario_proc` in a child process: started now, measured on :meth:`run`."""

    def __init__(self, url: str, prefix: str, sc: Scenario, side: str, n: int) -> None:
        args = [sys.executable, "-m", "bench.scenario_proc", "--side", side, "--work", sc.work,
                "--concurrency", str(sc.concurrency), "--n", str(n), "--url", url,
                "--prefix", prefix, "--idle-prefix", f"{prefix}idle",
                "--stream", stream_key(prefix)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=_ROOT, env=env, text=True)
        line = self._read()
        if not line.startswith("ready "):
            self.proc.kill()
            raise RuntimeError(f"scenario process did not start (said {line!r})")
        self.ready: dict[str, Any] = json.loads(line.removeprefix("ready "))

    def _read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def run(self, r: redis.Redis) -> dict[str, Any]:
        """Go, wait for the result, and read the server's figures around the run."""
        before = stats.snapshot(r)
        self._say("go")
        line = self._read()
        after = stats.snapshot(r)
        self._say("stop")
        if self.proc.wait(timeout=60) != 0 or not line:
            raise RuntimeError(f"scenario process failed ({self.proc.returncode}): {line!r}")
        res: dict[str, Any] = json.loads(line)
        # The child counted the commands it sent; this process's own do not belong here.
        client = res.pop("client_commands")
        cost = stats.cost(dataclasses.replace(before, client={}),
                          dataclasses.replace(after, client=client), res["jobs"])
        jobs = max(1, res["jobs"])
        queue_cmds = sum(v for k, v in cost["client_commands"].items() if k not in NOT_QUEUE)
        server_cmds = sum(v for k, v in cost["server_commands"].items() if k not in NOT_QUEUE)
        return {**res, **cost, "queue_cmds_per_job": queue_cmds / jobs,
                "server_queue_cmds_per_job": server_cmds / jobs}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def measure(url: str, template: dict[bytes, bytes], prefix: str, sc: Scenario, side: str,
            n: int) -> dict[str, Any]:
    """One run of ``side`` (``streamq``, ``raw`` or ``pure``) of scenario ``sc`` over ``n``
    jobs (pre-filled unless ``pure``)."""
    r = redis.Redis.from_url(url)
    proc = None
    try:
        if side != "pure":
            consumers.prefill(url, prefix, template, n)
        proc = ScenarioProcess(url, prefix, sc, side, n)
        return proc.run(r)
    finally:
        if proc is not None:
            proc.kill()
        consumers.drop(url, prefix)
        consumers.drop(url, f"{prefix}idle")
        r.close()


def runs(url: str, template: dict[bytes, bytes], next_prefix: Callable[[], str],
         sizes: dict[str, int]) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """Every measurement of every scenario, named ``<scenario>/<side>``, for the rounds."""
    from bench import processes

    out: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    for sc in SCENARIOS:
        n = sizes[sc.name]
        # The sleep scenario's raw loop is a reference only: its ratio is to the bound. A
        # no-op batch has no work to measure alone.
        sides = (("raw", "streamq", "pure") if sc.baseline == "raw" and sc.work != "noop-batch"
                 else ("raw", "streamq"))
        for side in sides:
            def run(sc: Scenario = sc, side: str = side, n: int = n) -> dict[str, Any]:
                return measure(url, template, next_prefix(), sc, side, n)
            out.append((f"{sc.name}/{side}", run))
    for procs in (1, 2):
        def run_fleet(procs: int = procs, n: int = sizes[PROCESSES.name]) -> dict[str, Any]:
            p = next_prefix()
            try:
                return processes.measure(url, template, p, procs, PROCESSES.concurrency, n)
            finally:
                consumers.drop(url, p)
        out.append((f"{PROCESSES.name}/{procs}proc", run_fleet))
    return out


def collect(got: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rounds' medians, one row per scenario, with its ratio to its baseline."""
    rows = []
    for sc in SCENARIOS:
        row: dict[str, Any] = {"scenario": sc.key, "title": sc.title, "work": sc.work,
                               "concurrency": sc.concurrency, "baseline": sc.baseline,
                               "streamq": got[f"{sc.name}/streamq"],
                               "raw": got.get(f"{sc.name}/raw"),
                               "work_alone": got.get(f"{sc.name}/pure"), "bound": sc.bound}
        base = sc.bound if sc.baseline == "bound" else row["raw"]["rate"]
        assert base is not None
        row["baseline_rate"] = base
        row["ratio"] = row["streamq"]["rate"] / base
        rows.append(row)
    one, two = got[f"{PROCESSES.name}/1proc"], got[f"{PROCESSES.name}/2proc"]
    fleet = {"scenario": PROCESSES.key, "title": PROCESSES.title, "work": PROCESSES.work,
             "concurrency": PROCESSES.concurrency, "one": one, "two": two,
             "ratio": two["rate"] / one["rate"]}
    return {"rows": rows, "processes": fleet,
            "pending": [{"scenario": k, "what": what} for k, what in PENDING]}
