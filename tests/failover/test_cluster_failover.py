"""SIGKILL of a Redis Cluster primary while producers add and a worker processes: a replica
takes over, and both recover without a restart. Plain adds can lose the last writes the
primary acknowledged before its replica had them; durable adds, in the same run, lose none.
"""

from __future__ import annotations

import pytest

from tests.failover.scenario import run_failover

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(90)
async def test_killed_primary_fails_over_and_durable_adds_lose_no_acknowledged_job(
    replicated_cluster, prefix
):
    plain, durable = await run_failover(replicated_cluster, prefix)
    print(plain.line())
    print(durable.line())
    for f in (plain, durable):
        assert f.producer_recovery_s is not None, f.line()
        assert f.worker_recovery_s is not None, f.line()
        assert f.worker_recovery_s < 30, f.line()
        assert f.acknowledged > 200
    assert plain.producer_recovery_s < 20  # type: ignore[operator]
    assert durable.lost == []
    # Asynchronous replication may lose what the dead primary acknowledged last: the run
    # reports how many; it cannot be more than the adds made around the kill.
    assert len(plain.lost) < plain.acknowledged // 10, plain.lost[:20]


@pytest.mark.timeout(90)
async def test_with_a_lagging_replica_plain_adds_are_lost_and_durable_adds_are_not(
    replicated_cluster, prefix
):
    plain, durable = await run_failover(replicated_cluster, prefix, lag_s=0.5)
    print(plain.line() + " lag_s=0.5")
    print(durable.line() + " lag_s=0.5")
    # The replica missed every write of the last 0.5 s and the worker had not run them yet:
    # plain adds acknowledged then are gone, which shows the ledger does see a loss...
    assert plain.lost, plain.line()
    # ...while no durable add that returned is lost: those the replica could not confirm
    # raised NotReplicated instead.
    assert durable.lost == []
    assert durable.not_replicated > 0
    assert plain.worker_recovery_s is not None
    assert durable.worker_recovery_s is not None


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_three_primary_kills_in_a_row_lose_no_durable_add(replicated_cluster, prefix):
    plain, durable = await run_failover(replicated_cluster, prefix, kills=3, steady_s=3.0)
    print(plain.line())
    print(durable.line())
    assert durable.lost == []
    assert plain.worker_recovery_s is not None
    assert durable.worker_recovery_s is not None
    assert len(plain.lost) < plain.acknowledged // 10, plain.lost[:20]
