"""The worker app of the example: processors orchestrate, services do the work.

Run it with ``python -m worker``::

    WORKER_APP=examples.ingestion.app:app \
    QUEUE_CONSUMER_INGESTION_IS_ENABLED=true \
    QUEUE_CONSUMER_INGESTION_SECONDARY_IS_ENABLED=true \
    QUEUE_CONSUMER_EVALUATION_IS_ENABLED=true \
    QUEUE_CONSUMER_DELETION_IS_ENABLED=true \
    python -m worker
"""

from __future__ import annotations

from datetime import timedelta

from examples.ingestion import services
from examples.ingestion.contracts import (
    CONTRACTS,
    DeleteEntities,
    Deletion,
    EvaluateEntity,
    Evaluation,
    IngestEvent,
    Ingestion,
)
from streamq.app import App
from streamq.job import Job
from streamq.options import Limiter

__all__ = ["app"]

app = App(CONTRACTS)


@app.processor(Ingestion, concurrency=50, lock_duration=timedelta(seconds=30))
async def ingest_event(job: Job[IngestEvent]) -> None:
    """Store the event. Both ingestion lanes (primary and secondary) run this."""
    await services.store_event(job.payload, attempt=job.attempt)


@app.processor(
    Evaluation,
    concurrency=20,
    limiter=Limiter(max_jobs=1_000, duration=timedelta(seconds=1)),
    lock_duration=timedelta(seconds=30),
)
async def evaluate_entity(job: Job[EvaluateEntity]) -> None:
    """Evaluate the entity; at most 1000 evaluations a second across all workers."""
    matched = await services.evaluate_entity(job.payload, attempt=job.attempt)
    if matched:
        job.logger.debug("a rule matched")


@app.processor(
    Deletion,
    concurrency=1,
    lock_duration=timedelta(minutes=10),
    timeout=timedelta(minutes=30),
)
def delete_entities(job: Job[DeleteEntities]) -> None:
    """Delete a batch of entities: one at a time, sync (it runs in a worker thread)."""
    deleted = services.delete_entities(job.payload, attempt=job.attempt)
    job.logger.info("deleted %d entities", deleted)
