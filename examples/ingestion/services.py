"""The example's services: stand-ins for an event store, a rules engine and a bulk delete.

They sleep briefly instead of doing I/O, and some calls fail the way real downstreams do (a
timeout, a 503) so the demo shows retries and dead letters. Which calls fail is decided by a
hash of the job's identity and its attempt number, never by chance: the same jobs give the
same summary on every run. The event store also throttles the projects of
``THROTTLED_PROJECTS`` (the first time it sees each of their events), which the worker answers
by flagging the project to the secondary lane.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from examples.ingestion.contracts import (
    THROTTLED_PROJECTS,
    DeleteEntities,
    EvaluateEntity,
    IngestEvent,
)
from streamq import PermanentError

__all__ = [
    "GONE_PROJECTS",
    "EventStore",
    "Throttled",
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


class Throttled(Exception):
    """The event store refuses a project's writes for now (HTTP 429)."""


@dataclass
class EventStore:
    """An in-memory event store standing in for a database: what the startup hook opens,
    processors write, the retention job expires and the cleaner compacts."""

    events: dict[str, dict[str, float]] = field(default_factory=dict)
    """project -> event id -> when it was stored (monotonic seconds)."""
    throttled: set[str] = field(default_factory=set)
    """Events already answered with a 429 (each is throttled once)."""

    def expire(self, max_age_s: float) -> int:
        """Forget events stored more than ``max_age_s`` ago; how many were forgotten."""
        cutoff = time.monotonic() - max_age_s
        removed = 0
        for stored in self.events.values():
            old = [e for e, at in stored.items() if at < cutoff]
            for e in old:
                del stored[e]
            removed += len(old)
        return removed

    def compact(self) -> int:
        """Drop projects left with no events; how many were dropped."""
        empty = [p for p, stored in self.events.items() if not stored]
        for p in empty:
            del self.events[p]
        return len(empty)

    def __len__(self) -> int:
        return sum(len(s) for s in self.events.values())


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


async def store_event(store: EventStore, event: IngestEvent, *, attempt: int) -> None:
    """Write one event to the event store."""
    await asyncio.sleep(0.002)
    if event.project_id in THROTTLED_PROJECTS and event.event_id not in store.throttled:
        store.throttled.add(event.event_id)
        raise Throttled(f"event store throttled project {event.project_id}")
    if attempt <= failing_attempts("store", event.event_id):
        raise TransientError("event store timed out")
    store.events.setdefault(event.project_id, {})[event.event_id] = time.monotonic()


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
