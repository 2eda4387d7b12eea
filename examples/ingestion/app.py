"""The worker app of the example: processors orchestrate, services do the work.

Beside the processors: a startup hook that opens the event store (the app's state), a
schedule that enqueues the retention job every second, and a singleton runner that compacts
the store on one worker of the fleet at a time.

Run it with ``python -m worker``::

    WORKER_APP=examples.ingestion.app:app \
    QUEUE_CONSUMER_INGESTION_IS_ENABLED=true \
    QUEUE_CONSUMER_INGESTION_SECONDARY_IS_ENABLED=true \
    QUEUE_CONSUMER_EVALUATION_IS_ENABLED=true \
    QUEUE_CONSUMER_DELETION_IS_ENABLED=true \
    QUEUE_CONSUMER_MAINTENANCE_IS_ENABLED=true \
    python -m worker
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
    Maintenance,
    Retention,
)
from streamq import App, Job, Limiter, RateLimited, RunnerContext

__all__ = ["AppState", "app"]

_log = logging.getLogger("examples.ingestion")

THROTTLE_FLAG = timedelta(seconds=30)
"""How long a throttled project's new events go to the secondary lane."""


@dataclass
class AppState:
    """What the worker process holds for its processors and runners."""

    store: services.EventStore | None = None


app = App(CONTRACTS, state=AppState())


@app.on_startup
def open_event_store(state: AppState) -> None:
    """Open the event store before the first job (a database pool in a real service)."""
    state.store = services.EventStore()
    _log.info("startup hook: event store opened")


def _store() -> services.EventStore:
    store = app.state.store
    if store is None:  # the startup hook runs before any job: this is a wiring mistake
        raise RuntimeError("the event store is not open")
    return store


@app.processor(Ingestion, concurrency=50, lock_duration=timedelta(seconds=30))
async def ingest_event(job: Job[IngestEvent]) -> None:
    """Store the event. Both ingestion lanes (primary and secondary) run this.

    When the event store throttles a project, the project is flagged: producers send its
    new events to the secondary lane for a while, and this event waits a moment (no attempt
    spent) before it is stored.
    """
    try:
        await services.store_event(_store(), job.payload, attempt=job.attempt)
    except services.Throttled as exc:
        await job.flag_tenant(THROTTLE_FLAG, reason=str(exc))
        raise RateLimited(delay=timedelta(milliseconds=100)) from exc


@app.processor(
    Evaluation,
    concurrency=20,
    limiter=Limiter(max_jobs=1_000, duration=timedelta(seconds=1)),
    tenant_concurrency=5,
    lock_duration=timedelta(seconds=30),
)
async def evaluate_entity(job: Job[EvaluateEntity]) -> None:
    """Evaluate the entity; at most 1000 evaluations a second across all workers, and at
    most 5 of one project at once, so one project cannot take the whole rules engine."""
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


app.schedule("retention", Maintenance.retention, every=timedelta(seconds=1),
             payload=Retention(max_age_s=2.0))


@app.processor(Maintenance, concurrency=1)
async def apply_retention(job: Job[Retention]) -> None:
    """Forget old events: one job per schedule tick across the whole fleet."""
    removed = _store().expire(job.payload.max_age_s)
    job.logger.info("retention applied: %d events forgotten", removed)


@app.runner("cleaner", singleton=True, every=timedelta(milliseconds=500))
async def clean_store(ctx: RunnerContext[AppState]) -> None:
    """Compact the event store: on one worker of the fleet at a time (a lease in Redis)."""
    store = ctx.state.store
    dropped = store.compact() if store is not None else 0
    ctx.logger.info("cleaner ran: %d empty projects dropped, %d events kept", dropped,
                    len(store) if store is not None else 0)
