"""The Prometheus adapter counts routed adds and cap waits, labelled by queue and job only
(never the tenant)."""

from __future__ import annotations

import prometheus_client

from streamq.metrics import PrometheusHooks


def test_routed_adds_and_cap_waits_are_counted_without_a_tenant_label() -> None:
    hooks = PrometheusHooks()
    hooks.tenant_routed("tn", "work")
    hooks.tenant_routed("tn", "work")
    hooks.tenant_cap_waited("tn", "tn-1", "work")
    text = prometheus_client.generate_latest(hooks.registry).decode()
    assert 'streamq_jobs_routed_by_tenant_flag_total{job="work",queue="tn"} 2.0' in text
    assert 'streamq_tenant_cap_waits_total{job="work",queue="tn",shard="tn-1"} 1.0' in text
    assert "tenant=" not in text
