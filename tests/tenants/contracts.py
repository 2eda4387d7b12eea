"""Contracts of the tenant-isolation tests (also loaded by the CLI tests and the killed
worker's subprocess)."""

from __future__ import annotations

from pydantic import BaseModel

from streamq import ContractSet, QueueContract, job


class Work(BaseModel):
    project_id: str
    n: int = 0
    sleep_s: float = 0.0


class Tenanted(QueueContract, name="tn", shards=2, secondary_shards=1,
               tenant_field="project_id"):
    work = job("work", Work)


class NoLane(QueueContract, name="tn-nolane", tenant_field="project_id"):
    work = job("work", Work)


class NoTenant(QueueContract, name="tn-notenant", secondary_shards=1):
    work = job("work", Work)


CONTRACTS = ContractSet(Tenanted, NoLane, NoTenant)
