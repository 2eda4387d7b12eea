"""The contracts of the ingestion example: the one module producers and the worker share.

Four queues, as in the production ingestion worker this example is modelled on:

- ``ingestion``: many small events, 4 shards keyed by ``<project_id>-<entity_id>`` (one
  entity's events always land on the same shard), and a secondary lane for noisy projects so
  one tenant's flood cannot delay everyone else: known noisy projects are routed there by
  the producer's rule, and a project the event store throttles is flagged there for a while.
- ``evaluation``: re-evaluates an entity after its events landed; a global rate limit and a
  per-project cap (set on the processor) protect the rules engine, and transient failures
  are retried.
- ``deletion``: heavy deletes, one at a time with a long lock (set on the processor).
- ``maintenance``: the retention job, enqueued by a schedule.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

from streamq import Backoff, ContractSet, JobDefaults, JobSpec, QueueContract, job

__all__ = [
    "CONTRACTS",
    "NOISY_PROJECTS",
    "THROTTLED_PROJECTS",
    "DeleteEntities",
    "Deletion",
    "EvaluateEntity",
    "Evaluation",
    "IngestEvent",
    "Ingestion",
    "Maintenance",
    "Retention",
    "is_noisy",
    "sharding_key",
]

NOISY_PROJECTS = frozenset({"proj-000", "proj-001"})
"""Projects whose traffic goes to the ingestion queue's secondary lane."""

THROTTLED_PROJECTS = frozenset({"proj-007"})
"""Projects the event store throttles: the worker flags them to the secondary lane."""


class IngestEvent(BaseModel):
    """One event about one entity of a project."""

    project_id: str
    entity_id: str
    event_id: str
    kind: str = "update"
    attributes: dict[str, str] = Field(default_factory=dict)
    api_key: str = ""
    """The caller's key, kept for the downstream call; a secret (never logged or listed)."""


class EvaluateEntity(BaseModel):
    """Re-run a project's rules against one entity."""

    project_id: str
    entity_id: str
    ruleset: str = "default"


class DeleteEntities(BaseModel):
    """Delete a batch of a project's entities and everything derived from them."""

    project_id: str
    entity_ids: list[str]
    reason: str = "retention"


class Ingestion(
    QueueContract,
    name="ingestion",
    shards=4,
    secondary_shards=2,
    tenant_field="project_id",
    secret_fields={"api_key"},
    defaults=JobDefaults(
        attempts=3,
        backoff=Backoff.exponential(timedelta(milliseconds=50), max_delay=timedelta(seconds=2)),
    ),
):
    ingest_event = job("ingest-event", IngestEvent)


class Evaluation(
    QueueContract,
    name="evaluation",
    shards=2,
    tenant_field="project_id",
    defaults=JobDefaults(
        attempts=5,
        backoff=Backoff.exponential(timedelta(milliseconds=50), max_delay=timedelta(seconds=5)),
    ),
):
    evaluate_entity = job("evaluate-entity", EvaluateEntity)


class Deletion(
    QueueContract,
    name="deletion",
    tenant_field="project_id",
    defaults=JobDefaults(attempts=2, backoff=Backoff.fixed(timedelta(milliseconds=200))),
):
    delete_entities = job("delete-entities", DeleteEntities)


class Retention(BaseModel):
    """Forget stored events older than ``max_age_s``."""

    max_age_s: float = 2.0


class Maintenance(
    QueueContract,
    name="maintenance",
    defaults=JobDefaults(attempts=2, backoff=Backoff.fixed(timedelta(milliseconds=100))),
):
    retention = job("retention", Retention)


CONTRACTS = ContractSet(Ingestion, Evaluation, Deletion, Maintenance)


def sharding_key(project_id: str, entity_id: str) -> str:
    """``<project_id>-<entity_id>``: one entity's jobs always land on the same shard."""
    return f"{project_id}-{entity_id}"


def is_noisy(spec: JobSpec[Any], payload: BaseModel) -> bool:
    """The ``secondary_when`` rule of the ingestion producer: noisy projects go aside."""
    return getattr(payload, "project_id", None) in NOISY_PROJECTS
