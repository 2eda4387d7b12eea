"""The example's services: stand-ins for an event store, a rules engine and a bulk delete.

They sleep briefly instead of doing I/O, and some calls fail the way real downstreams do (a
timeout, a 503) so the demo shows retries and dead letters. Which calls fail is decided by a
hash of the job's identity and its attempt number, never by chance: the same jobs give the
same summary on every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from examples.ingestion.contracts import DeleteEntities, EvaluateEntity, IngestEvent
from streamq import PermanentError

__all__ = [
    "GONE_PROJECTS",
    "TransientError",
    "delete_entities",
    "evaluate_entity",
    "failing_attempts",
    "store_event",
]

GONE_PROJECTS = frozenset({"proj-gone"})
"""Projects that no longer exist: deleting their entities fails permanently."""


class TransientError(Exception):
    """A downstream hiccup (timeout, 503): the job is retried with backoff."""


def _roll(key: str) -> float:
    """A number in [0, 1) fixed by ``key``."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32


def failing_attempts(service: str, key: str) -> int:
    """How many first attempts of the job identified by ``key`` fail in ``service``.

    About 6 % fail once, 3 % twice, and 0.5 % always (they end as dead letters).
    """
    roll = _roll(f"{service}:{key}")
    if roll < 0.005:
        return 1_000
    if roll < 0.035:
        return 2
    if roll < 0.095:
        return 1
    return 0


async def store_event(event: IngestEvent, *, attempt: int) -> None:
    """Write one event to the event store."""
    await asyncio.sleep(0.002)
    if attempt <= failing_attempts("store", event.event_id):
        raise TransientError("event store timed out")


async def evaluate_entity(request: EvaluateEntity, *, attempt: int) -> bool:
    """Run the project's rules against the entity; True when a rule matched."""
    await asyncio.sleep(0.003)
    key = f"{request.project_id}/{request.entity_id}/{request.ruleset}"
    if attempt <= failing_attempts("rules", key):
        raise TransientError("rules engine answered 503")
    return _roll(key) < 0.1


def delete_entities(request: DeleteEntities, *, attempt: int) -> int:
    """Delete the entities (blocking, like a bulk delete through a sync client)."""
    if request.project_id in GONE_PROJECTS:
        raise PermanentError("project no longer exists")
    time.sleep(0.01 + 0.001 * len(request.entity_ids))
    return len(request.entity_ids)
