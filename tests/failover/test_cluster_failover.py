"""SIGKILL of a Redis Cluster primary while producers add and a worker processes: a replica
takes over, and both recover without a restart. Plain adds can lose the last writes the
primary acknowledged before its replica had them; durable adds lose none."""

from __future__ import annotations

import pytest

from streamq import Durability
from tests.failover.scenario import run_failover

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


async def test_producer_and_worker_recover_from_a_killed_primary_without_restart(
    replicated_cluster, prefix
):
    figures = await run_failover(replicated_cluster, prefix, durable=None)
    print(figures.line("plain"))
    assert figures.producer_recovery_s is not None
    assert figures.worker_recovery_s is not None
    assert figures.producer_recovery_s < 20
    assert figures.worker_recovery_s < 20
    # Asynchronous replication may lose what the dead primary acknowledged last: the run
    # reports how many; it cannot lose more than the adds made around the kill.
    assert figures.acknowledged > 200
    assert len(figures.lost) < figures.acknowledged // 10, figures.lost[:20]


async def test_durable_adds_survive_a_killed_primary_with_no_acknowledged_job_lost(
    replicated_cluster, prefix
):
    figures = await run_failover(
        replicated_cluster, prefix, durable=Durability(replicas=1, timeout=0.5)
    )
    print(figures.line("durable"))
    assert figures.lost == []
    assert figures.producer_recovery_s is not None
    assert figures.worker_recovery_s is not None
    assert figures.producer_recovery_s < 30
    assert figures.worker_recovery_s < 30
