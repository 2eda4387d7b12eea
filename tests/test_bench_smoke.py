"""The benchmark suite runs end to end (``--quick``) and reports every section.

No timing is asserted: this proves the harness works, not how fast anything is.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import find_binary

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("meta", "producer", "consumer", "scenarios", "latency", "memory", "scaling",
            "redis_cost", "ratios", "targets")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server binary found")
        pytest.skip("no redis-server binary found")
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_quick_benchmark_writes_every_section_and_the_tables(quick_run: Path) -> None:
    results = json.loads((quick_run / "latest.json").read_text())
    assert set(SECTIONS) <= set(results)
    assert results["meta"]["mode"] == "quick"
    for name in ("raw_xadd_sync", "raw_xadd_async", "raw_pipe_sync", "raw_pipe_async",
                 "sq_add_sync", "sq_add_async", "sq_bulk_sync", "sq_bulk_async"):
        assert results["producer"][name]["rate"] > 0, name
    rows = results["consumer"]["streamq"]
    assert {(r["processor"], r["concurrency"], r["mode"]) for r in rows} == {
        (p, c, m) for p in ("async", "sync") for c in (1, 10, 100)
        for m in ("prefilled", "with_producer")
    }
    assert set(results["consumer"]["raw"]) == {
        f"raw_{k}_{m}" for k in ("async", "sync") for m in ("prefilled", "with_producer")
    }
    lat = results["latency"]
    assert lat["jobs"] > 0
    assert 0 < lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"]
    assert results["memory"]["plain"]["bytes_per_job"] > 0
    assert len(results["scaling"]) == 3
    for cost in results["redis_cost"]["per_processed_job"]:
        assert cost["client_cmds_per_job"] > 0
        assert cost["server_cmds_per_job"] >= cost["client_cmds_per_job"]
    assert len(results["targets"]) == 10
    assert all(isinstance(t["met"], bool) for t in results["targets"])
    md = (quick_run / "latest.md").read_text()
    for heading in ("## Targets", "## Producer", "## Consumer", "## Processing scenarios",
                    "## Redis cost", "## Latency", "## Redis memory", "## Scaling"):
        assert heading in md


def test_quick_benchmark_measures_each_processing_scenario_against_its_baseline(
    quick_run: Path,
) -> None:
    scenarios = json.loads((quick_run / "latest.json").read_text())["scenarios"]
    rows = {(r["scenario"], r["concurrency"]): r for r in scenarios["rows"]}
    assert set(rows) == {("a", 10), ("a", 100), ("b", 10), ("c", 100), ("d", 1)}
    for key, row in rows.items():
        sq, raw = row["streamq"], row["raw"]
        assert sq["rate"] > 0, key
        assert raw["rate"] > 0, key
        assert row["ratio"] == pytest.approx(sq["rate"] / row["baseline_rate"]), key
        # Reads and settles are queue commands; the processor's own INCR (one per job in
        # scenarios a and b) is sent but not counted as the queue's.
        assert sq["queue_cmds_per_job"] > 0, key
        if key[0] in "ab":
            assert sq["client_cmds_per_job"] >= 1 + sq["queue_cmds_per_job"], key
        if key[0] == "d":  # no-op: the queue's commands are all there is
            assert "incrby" not in sq["client_commands"], key
        assert 0 < raw["queue_cmds_per_job"] <= 1, key
        assert 0 < sq["rss_idle_mb"] <= sq["rss_peak_mb"], key
        assert sq["redis_cpu_us_per_job"] > 0, key
    assert rows[("c", 100)]["bound"] == 20_000
    assert rows[("c", 100)]["baseline_rate"] == 20_000
    assert rows[("a", 10)]["work_alone"]["rate"] > 0
    assert rows[("c", 100)]["work_alone"] is None
    assert rows[("d", 1)]["work_alone"] is None
    assert scenarios["pending"] == []
    md = (quick_run / "latest.md").read_text()
    assert "not measured yet" not in md
    assert "(d) no-op batch processor" in md


def test_quick_benchmark_measures_one_and_two_worker_processes(quick_run: Path) -> None:
    results = json.loads((quick_run / "latest.json").read_text())
    fleet = results["scenarios"]["processes"]
    one, two = fleet["one"], fleet["two"]
    assert (one["processes"], two["processes"]) == (1, 2)
    for side in (one, two):
        assert side["rate"] > 0
        assert side["jobs"] > 0
        # Counted in the worker processes themselves: reads and settles, the INCRs apart.
        assert side["client_commands"].get("incrby", 0) >= side["jobs"]
        assert 0 < side["queue_cmds_per_job"] <= 3
        assert side["redis_cpu_us_per_job"] > 0
    assert fleet["ratio"] == pytest.approx(two["rate"] / one["rate"])
    assert results["ratios"]["scenario_e_c10_2_processes_vs_1"] == fleet["ratio"]
    md = (quick_run / "latest.md").read_text()
    assert "### (e) Several worker processes" in md


def test_quick_benchmark_ratios_are_positive_numbers(quick_run: Path) -> None:
    ratios = json.loads((quick_run / "latest.json").read_text())["ratios"]
    assert len(ratios) >= 4 + 12 + 6
    for name, value in ratios.items():
        assert isinstance(value, float), name
        assert math.isfinite(value), name
        assert value > 0, name


def test_the_step_profile_prints_the_whole_job_and_every_step() -> None:
    if find_binary() is None:
        pytest.skip("no redis-server binary found")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.steps", "--n", "300", "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")][2:]
    assert len(rows) == 9, proc.stdout
    for row in rows:
        assert float(row.rsplit("|", 2)[1]) > 0, row
