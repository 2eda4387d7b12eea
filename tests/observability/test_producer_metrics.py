"""Producers export what the dashboard's "enqueued" panel and the StreamqEnqueueFailing alert
read: the series exist from the start, and the example producer serves them on /metrics
where the compose stack's Prometheus scrapes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from examples.ingestion.contracts import Ingestion, is_noisy
from prometheus_client import generate_latest

from streamq import Queue
from streamq.metrics import PrometheusHooks
from tests.observability.support import Samples, parse_metrics, total
from tests.observability.test_deploy import alert_exprs, dashboard_exprs, problems_of
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PRODUCER_METRICS = ("streamq_jobs_enqueued_total", "streamq_enqueue_rejected_total")


def producer_exprs() -> list[str]:
    """Every dashboard and alert query that reads a producer metric."""
    exprs = [e for e in dashboard_exprs() + alert_exprs() if any(m in e for m in PRODUCER_METRICS)]
    assert len(exprs) >= 3, exprs
    return exprs


def scrape(port: int) -> Samples | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return parse_metrics(resp.read().decode())
    except OSError:
        return None


def wait_for_scrape(proc: subprocess.Popen[str], port: int, what: str,
                    done: object, timeout_s: float = 60.0) -> Samples:
    """Scrape until ``done(samples)`` holds; fail loudly if the producer exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            out, _ = proc.communicate()
            raise AssertionError(f"the producer exited with {proc.returncode}:\n{out}")
        samples = scrape(port)
        if samples is not None and done(samples):  # type: ignore[operator]
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def run_producer(prefix: str) -> Iterator[object]:
    """``run_producer(redis_url, *args) -> (proc, metrics_port)``; stopped at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def run(url: str, *args: str) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "QUEUE_"))}
        env.update(REDIS_URL=url, REDIS_PREFIX=prefix, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.ingestion.producer", "--metrics-port", str(port),
             "--metrics-host", "127.0.0.1", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        procs.append(proc)
        return proc, port

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_producer_series_exist_at_zero_before_the_first_add() -> None:
    hooks = PrometheusHooks()
    client = aioredis.Redis(port=free_port())  # never called: building a Queue sends nothing
    Queue(Ingestion, client, hooks=hooks, secondary_when=is_noisy)
    samples = parse_metrics(generate_latest(hooks.registry).decode())
    enqueued = {dict(lbl)["shard"]: v for (n, lbl), v in samples.items()
                if n == "streamq_jobs_enqueued_total"}
    assert enqueued == dict.fromkeys(
        Ingestion.primary.shard_names() + Ingestion.secondary.shard_names(), 0.0  # type: ignore[union-attr]
    )
    for lane in ("ingestion", "ingestion-secondary"):
        assert total(samples, "streamq_enqueue_rejected_total", queue=lane,
                     reason="redis_error") == 0.0
        assert any(n == "streamq_enqueue_rejected_total" and ("queue", lane) in lbl
                   for n, lbl in samples)
        assert any(n == "streamq_jobs_routed_by_tenant_flag_total" and ("queue", lane) in lbl
                   for n, lbl in samples)


def test_example_producer_serves_the_enqueued_counter_on_metrics(
    run_producer, redis_url: str, sredis: redis.Redis, prefix: str
) -> None:
    proc, port = run_producer(redis_url, "--jobs", "60")
    samples = wait_for_scrape(
        proc, port, "60 jobs counted as enqueued",
        lambda s: total(s, "streamq_jobs_enqueued_total") == 60,
    )
    # The jobs are in Redis, and every producer query of the dashboard and alerts reads it.
    assert sum(sredis.xlen(k) for k in sredis.scan_iter(match=f"{prefix}:*:stream")) == 60
    assert total(samples, "streamq_enqueue_rejected_total", reason="redis_error") == 0
    assert {e: p for e in producer_exprs() if (p := problems_of(e, samples))} == {}
    # The batch is done and it still serves, until stopped; then it exits cleanly.
    assert scrape(port) is not None
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert re.search(r"ingestion: \d+", out)
    for key in sredis.scan_iter(match=f"{prefix}:*"):
        sredis.delete(key)


def test_example_producer_counts_refused_batches_and_keeps_going(run_producer) -> None:
    # Nothing listens on this port: every batch is refused, as when Redis is down.
    proc, port = run_producer(f"redis://127.0.0.1:{free_port()}/0", "--jobs", "20",
                              "--every", "0.2")
    samples = wait_for_scrape(
        proc, port, "two refused batches",
        lambda s: total(s, "streamq_enqueue_rejected_total", reason="redis_error") >= 2,
    )
    assert total(samples, "streamq_jobs_enqueued_total") == 0
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "not enqueued: Redis is unreachable" in out


def test_compose_prometheus_scrapes_the_producer_where_it_serves_metrics() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    prometheus = (ROOT / "deploy" / "prometheus.yml").read_text()
    command = re.search(r"examples\.ingestion\.producer\"(.*?)\]", compose, re.S)
    assert command is not None
    port = re.search(r'"--metrics-port", "(\d+)"', command.group(1))
    assert port is not None
    assert f'targets: ["producer:{port.group(1)}"]' in prometheus
    assert f'"{port.group(1)}:{port.group(1)}"' in compose
