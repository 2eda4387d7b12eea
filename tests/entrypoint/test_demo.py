"""The demo module end to end, with a small number of jobs, against the test Redis."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import redis
from examples.ingestion.demo import parse_metrics
from examples.ingestion.producer import plan
from examples.ingestion.services import GONE_PROJECTS, failing_attempts

from .helpers import ROOT, clean_env

JOBS = 300


def expected(jobs: int) -> dict[str, int]:
    """What the deterministic services make of ``plan(jobs)``."""
    p = plan(jobs)
    ingest = [failing_attempts("store", r.payload.event_id)  # type: ignore[union-attr]
              for r in p.ingestion + p.late]
    rules = [
        failing_attempts("rules", f"{r.payload.project_id}/{r.payload.entity_id}/default")  # type: ignore[union-attr]
        for r in p.evaluation
    ]
    gone = sum(d.project_id in GONE_PROJECTS for _, d in p.deletion)
    dead = sum(f >= 3 for f in ingest) + sum(f >= 5 for f in rules) + gone
    return {
        "enqueued": len(p),
        "dead": dead,
        "processed": len(p) - dead,
        "retried": sum(min(f, 2) for f in ingest) + sum(min(f, 4) for f in rules),
        "permanent": gone,
    }


def summary_value(out: str, name: str) -> str:
    found = re.search(rf"^  {name}\s+(.+)$", out, re.MULTILINE)
    assert found, f"no {name!r} line in:\n{out}"
    return found.group(1)


def test_demo_runs_end_to_end_and_prints_the_summary(
    redis_url: str, sredis: redis.Redis, tmp_path: Path
) -> None:
    want = expected(JOBS)
    assert want["retried"] > 0
    assert want["dead"] > want["permanent"] > 0
    done = subprocess.run(
        [sys.executable, "-m", "examples.ingestion.demo", "--jobs", str(JOBS), "--timeout", "60"],
        cwd=ROOT, env=clean_env(REDIS_URL=redis_url, STREAMQ_DATA_DIR=str(tmp_path)),
        capture_output=True, text=True, timeout=110,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "\nSummary\n" in out
    assert summary_value(out, "jobs enqueued").startswith(f"{want['enqueued']}  (")
    assert summary_value(out, "processed") == str(want["processed"])
    assert summary_value(out, "dead-lettered").startswith(f"{want['dead']}  (")
    assert f"permanent {want['permanent']}" in summary_value(out, "dead-lettered")
    retried = summary_value(out, "retried")
    # The count comes from the worker's /metrics, served when the metrics extra is installed.
    if importlib.util.find_spec("prometheus_client") is not None:
        assert retried == f"{want['retried']}  (failed attempts run again)"
    else:
        assert retried.startswith("n/a")
    assert re.fullmatch(r"[\d,]+ jobs/s", summary_value(out, "throughput"))
    assert summary_value(out, "worker") == "stopped with SIGTERM, exit code 0"
    # Progress lines (stdout is not a terminal: whole lines, no carriage returns), each
    # adding up: processed (completed + dead-lettered) + in flight + waiting = enqueued.
    assert "\r" not in out
    progress = re.findall(
        r"processed (\d+) \(completed (\d+), dead-lettered (\d+)\) \+ in flight (\d+) "
        r"\+ waiting (\d+) \(ready (\d+), delayed (\d+)\) = (\d+) enqueued", out)
    assert progress
    for line in progress:
        done, completed, dead, in_flight, waiting, ready, delayed, total = map(int, line)
        assert done + in_flight + waiting == total
        assert completed + dead == done
        assert ready + delayed == waiting
        assert min(completed, in_flight, ready, delayed) >= 0
    assert progress[-1][-1] == str(want["enqueued"])
    # The example app's tenant flag, cap, schedule, runner and startup hook show.
    assert summary_value(out, "tenant flag").startswith("proj-007 flagged by the processor")
    late = len(plan(JOBS).late)
    assert f"{late} of {late} late events routed to ingestion-secondary" in out
    assert re.match(r"evaluation: at most 5 jobs of one project at once; (\d+|n/a) waits",
                    summary_value(out, "tenant cap"))
    ticks = re.match(r"retention: (\d+) ticks run", summary_value(out, "schedule"))
    assert ticks is not None
    assert int(ticks.group(1)) >= 1
    runs = re.match(r"cleaner \(singleton\): (\d+) runs", summary_value(out, "runner"))
    assert runs is not None
    assert int(runs.group(1)) >= 1
    assert summary_value(out, "startup hook") == "ran: event store opened"
    # The demo removes its keys.
    prefix = re.search(r"keys under (demo-[0-9a-f]+):\*", out)
    assert prefix is not None
    assert list(sredis.scan_iter(match=f"{prefix.group(1)}:*")) == []
    assert (tmp_path / "demo-worker.log").exists()


def test_parse_metrics_sums_counters_over_labels() -> None:
    text = "\n".join([
        "# HELP streamq_jobs_completed_total Attempts that completed.",
        'streamq_jobs_completed_total{job="a",queue="q",shard="q"} 3.0',
        'streamq_jobs_completed_total{job="a",queue="q",shard="q-1"} 4.0',
        'streamq_jobs_completed_created{job="a",queue="q",shard="q"} 1.7e9',
        'streamq_jobs_retried_total{job="a",queue="q",shard="q"} 2.0',
        'streamq_jobs_dead_lettered_total{queue="q",reason="error",shard="q"} 1.0',
        'streamq_jobs_completed_total{job="retention",queue="maintenance",shard="m"} 5.0',
        'streamq_tenant_cap_waits_total{job="a",queue="q",shard="q"} 6.0',
    ])
    assert parse_metrics(text) == {"processed": 7.0, "retried": 2.0, "dead": 1.0,
                                   "cap_waits": 6.0}
