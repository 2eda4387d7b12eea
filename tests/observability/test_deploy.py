"""The shipped dashboard and alerts query only metrics a real worker exports, and the
compose stack's pieces point at each other."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq import Queue
from streamq.metrics import DEAD_REASONS, PrometheusHooks
from tests.observability.conftest import RunWorker
from tests.observability.support import Behaviour, Obs, Samples, Work, make_app, scrape, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "streamq.json"
ALERTS = ROOT / "deploy" / "alerts.yml"

SELECTOR = re.compile(r"\b(streamq_[a-z0-9_]+)\b(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
# Label values that exist only once their event happened (a scrape after a short scenario
# need not have them all): the documented vocabulary.
KNOWN_VALUES = {
    "reason": {*DEAD_REASONS, "too_large", "invalid", "unknown_job", "redis_error"},
    "outcome": {"completed", "retried", "failed", "delayed", "released"},
}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"]]
    return exprs


def alert_exprs() -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\s+expr:\s*(.+)$", ALERTS.read_text(), re.M)]


def problems_of(expr: str, samples: Samples) -> list[str]:
    """What in ``expr`` this scrape cannot answer: a missing metric, label or label value."""
    problems = []
    for m in SELECTOR.finditer(expr):
        name, selector = m.group(1), m.group(2) or ""
        series = [dict(lbl) for n, lbl in samples if n == name]
        if not series:
            problems.append(f"{name} is not exported")
            continue
        for label, op, value in MATCHER.findall(selector):
            if "$" in value:
                continue
            if not any(label in s for s in series):
                problems.append(f"{name} has no label {label!r}")
            elif op in ("=", "=~") and not any(
                re.fullmatch(value, v)
                for v in {s.get(label, "") for s in series} | KNOWN_VALUES.get(label, set())
            ):
                problems.append(f"{name} has no series with {label}{op}{value!r}")
    by = re.findall(r"by \(([^)]*)\)", expr)
    names = {m.group(1) for m in SELECTOR.finditer(expr)}
    for group in by:
        for label in (x.strip() for x in group.split(",")):
            if label in ("le", "instance", "job"):
                continue
            if not any(label in dict(lbl) for n, lbl in samples if n in names):
                problems.append(f"nothing in {sorted(names)} has label {label!r} to group by")
    return problems


@pytest.fixture
async def scraped(run_worker: RunWorker, aredis: aioredis.Redis, prefix: str) -> Samples:
    """A real worker's /metrics after a little of everything: successes, a retry, a dead
    letter, a delayed job and a refused add."""
    hooks = PrometheusHooks()
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    manager, server = await run_worker(make_app(Behaviour()), hooks)
    port = server.port
    assert port is not None
    for i in range(3):
        await queue.add(Obs.work, Work(project_id="p", n=i))
    await queue.add(Obs.work, Work(project_id="p", mode="flaky"))
    await queue.add(Obs.work, Work(project_id="p", mode="fail"))
    await queue.add(Obs.later, Work(project_id="p"), delay=0.1)
    with pytest.raises(Exception, match="invalid"):
        await queue.add(Obs.work, {"n": 1})
    await manager.run_until_idle(timeout_s=10)

    async def polled_dead() -> bool:
        s = await scrape(port)
        return any(n == "streamq_queue_dead" and ("shard", "all") in lbl and v == 1
                   for (n, lbl), v in s.items())

    await wait_for(polled_dead, what="a depth poll after the scenario")
    return await scrape(port)


async def test_every_dashboard_query_reads_metrics_a_worker_exports(scraped: Samples) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    problems = {e: p for e in exprs if (p := problems_of(e, scraped))}
    assert problems == {}


async def test_every_alert_reads_metrics_a_worker_exports(scraped: Samples) -> None:
    exprs = alert_exprs()
    assert len(exprs) >= 8
    problems = {e: p for e in exprs if (p := problems_of(e, scraped))}
    assert problems == {}


def test_dashboard_covers_what_operators_look_at() -> None:
    text = " ".join(dashboard_exprs())
    for metric in (
        "streamq_queue_ready", "streamq_queue_delayed", "streamq_queue_in_flight",
        "streamq_queue_dead", "streamq_jobs_completed_total", "streamq_jobs_dead_lettered_total",
        "streamq_job_wait_seconds_bucket", "streamq_job_processing_seconds_bucket",
        "streamq_jobs_active", "streamq_lock_lost_total", "streamq_jobs_stalled_total",
    ):
        assert metric in text, metric
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (queue, le) (rate(streamq_job_wait" in text


def test_compose_stack_pieces_point_at_each_other() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    prometheus = (ROOT / "deploy" / "prometheus.yml").read_text()
    datasource = (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    # Redis: AOF on, noeviction.
    assert re.search(r"--appendonly\s*\n\s*- \"yes\"", compose)
    assert re.search(r"--maxmemory-policy\s*\n\s*- noeviction", compose)
    # The worker runs the example app and serves metrics where Prometheus scrapes.
    assert "WORKER_APP: examples.ingestion.app:app" in compose
    port = re.search(r'METRICS_PORT: "(\d+)"', compose)
    assert port is not None
    assert f'targets: ["worker:{port.group(1)}"]' in prometheus
    # Every file the stack mounts exists; the dashboard uses the provisioned datasource.
    for mount in re.findall(r"- \./([\w./-]+):", compose):
        assert (ROOT / mount).exists(), mount
    assert (ROOT / "deploy" / "worker.Dockerfile").exists()
    uid = re.search(r"uid: (\S+)", datasource)
    assert uid is not None
    dash = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert uids == {uid.group(1)}


async def test_the_query_check_catches_wrong_metrics_labels_and_values(scraped: Samples) -> None:
    assert problems_of("rate(streamq_jobs_complete_total[5m])", scraped) == [
        "streamq_jobs_complete_total is not exported"
    ]
    assert problems_of('streamq_queue_ready{shard_name="all"}', scraped) == [
        "streamq_queue_ready has no label 'shard_name'"
    ]
    assert problems_of('streamq_queue_ready{shard="every"}', scraped) == [
        "streamq_queue_ready has no series with shard='every'"
    ]
    assert problems_of("sum by (tenant) (streamq_jobs_active)", scraped) == [
        "nothing in ['streamq_jobs_active'] has label 'tenant' to group by"
    ]
