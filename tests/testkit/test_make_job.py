"""make_job: a processor unit-tested with no Redis at all."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import App, InvalidPayload, Job, PermanentError, QueueContract, job
from streamq.testing import make_job
from tests.testkit.app import Step, Steps


class Event(BaseModel):
    project_id: str
    event_id: str
    tags: list[str] = []


class Events(QueueContract, name="events", shards=4, tenant_field="project_id"):
    ingest = job("ingest", Event)


app = App([Events])


@app.processor(Events)
async def ingest(job: Job[Event]) -> str:
    if job.payload.event_id == "gone":
        raise PermanentError(f"event of {job.payload.project_id} is gone")
    job.extend_lock()
    return f"{job.queue}/{job.shard}/{job.id}#{job.attempt}:{job.payload.tags}"


def test_a_job_carries_what_a_worker_would_hand_over() -> None:
    j = make_job(Events.ingest, Event(project_id="p1", event_id="e1"), job_id="j-1", shard=3)
    assert (j.queue, j.name, j.id, j.shard, j.attempt) == ("events", "ingest", "j-1",
                                                           "events-3", 1)
    assert j.max_attempts == Events.defaults.attempts
    assert j.tenant == "p1"  # from the contract's tenant field, as the worker reads it
    assert j.payload.tags == []
    assert not j.is_final_attempt
    assert not j.lock_lost
    assert j.timestamp > 0


def test_a_processor_runs_on_it_without_redis() -> None:
    calls: list[int] = []
    j = make_job(Events.ingest, {"project_id": "p", "event_id": "e", "tags": ["a"]},
                 attempt=2, extend_lock=lambda: calls.append(1))
    assert asyncio.run(ingest(j)) == "events/events/test-job#2:['a']"
    assert calls == [1]


def test_the_final_attempt_and_errors_are_testable() -> None:
    last = make_job(Steps.step, Step(n=1), attempt=3)
    assert last.is_final_attempt
    gone = make_job(Events.ingest, Event(project_id="p", event_id="gone"))
    with pytest.raises(PermanentError, match="event of p is gone"):
        asyncio.run(ingest(gone))


def test_the_payload_goes_through_json_like_a_real_job() -> None:
    given = Event(project_id="p", event_id="e", tags=["x"])
    j = make_job(Events.ingest, given)
    assert j.payload == given
    assert j.payload is not given  # a worker never sees the producer's object


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"project_id": "p"}, "field(s) event_id"),
        ({"project_id": "p", "event_id": 3}, "field(s) event_id"),
        (Step(n=1), "expected a Event payload, got Step"),
        ({"project_id": "p", "event_id": "e", "when": object()}, "payload is not JSON"),
    ],
)
def test_a_bad_payload_is_refused_naming_queue_job_and_field(payload: Any, says: str) -> None:
    with pytest.raises(InvalidPayload) as info:
        make_job(Events.ingest, payload)
    assert "queue 'events' job 'ingest'" in str(info.value)
    assert says in str(info.value)
    assert info.value.queue == "events"
    assert info.value.job == "ingest"


def test_bad_attempts_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        make_job(Steps.step, Step(n=1), attempt=0)


def test_the_streamq_job_fixture_is_make_job(streamq_job: Any) -> None:
    assert streamq_job is make_job
