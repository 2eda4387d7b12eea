"""OpenTelemetry: the producer span's context travels in the envelope, and every attempt of
the job is a CONSUMER span under it, with messaging attributes, errors and the tenant."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from opentelemetry import baggage, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamq import CompositeHooks, Job, Queue
from streamq.observe import JobLogHooks
from streamq.tracing import TracingHooks, current_trace_ids
from tests.observability.conftest import RunWorker
from tests.observability.support import Behaviour, Obs, Work, make_app

TENANT = "tenant-42"


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    yield provider, exp
    provider.shutdown()


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.kind == kind), key=lambda s: s.start_time or 0)


async def test_three_attempts_are_three_consumer_spans_under_one_producer_span(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exporter
    hooks = TracingHooks(provider)
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    manager, _ = await run_worker(make_app(Behaviour()), hooks)
    await queue.add(Obs.work, Work(project_id=TENANT, mode="flaky"), job_id="job-1")
    await manager.run_until_idle(timeout_s=10)

    finished = spans.get_finished_spans()
    [producer] = by_kind(finished, SpanKind.PRODUCER)
    assert producer.name == "publish obs"
    assert producer.parent is None
    assert dict(producer.attributes or {}) == {
        "messaging.system": "redis",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "obs",
        "messaging.message.id": "job-1",
        "streamq.job.name": "work",
        "streamq.tenant": TENANT,
    }

    consumers = by_kind(finished, SpanKind.CONSUMER)
    assert len(consumers) == 3
    for attempt, span in enumerate(consumers, start=1):
        assert span.name == "process obs"
        assert span.parent is not None
        assert span.parent.span_id == producer.context.span_id
        assert span.context.trace_id == producer.context.trace_id
        attrs = dict(span.attributes or {})
        assert attrs["messaging.system"] == "redis"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "obs"
        assert attrs["messaging.destination.partition.id"] in ("obs", "obs-1")
        assert attrs["messaging.message.id"] == "job-1"
        assert attrs["messaging.redis.message.delivery_attempt"] == attempt
        assert attrs["streamq.tenant"] == TENANT
        assert attrs["streamq.outcome"] == ("retried" if attempt < 3 else "completed")
    for failed in consumers[:2]:
        assert failed.status.status_code == StatusCode.ERROR
        [event] = [e for e in failed.events if e.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "builtins.RuntimeError"
        assert "flaky attempt" in str(event.attributes["exception.message"])
    assert consumers[2].status.status_code == StatusCode.OK
    assert not [e for e in consumers[2].events if e.name == "exception"]


async def test_processor_sees_the_consumer_span_tenant_baggage_and_log_context(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    provider, spans = exporter
    hooks = CompositeHooks([TracingHooks(provider), JobLogHooks(trace_ids=current_trace_ids)])

    def inside(j: Job[Work]) -> tuple[object, int]:
        logging.getLogger("app.processor").info("working on it")
        return baggage.get_baggage("streamq.tenant"), trace.get_current_span(
        ).get_span_context().trace_id

    state = Behaviour(observe=inside)
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    manager, _ = await run_worker(make_app(state), hooks)
    await queue.add(Obs.work, Work(project_id=TENANT, mode="observe"), job_id="job-2")
    await manager.run_until_idle(timeout_s=10)

    [consumer] = by_kind(spans.get_finished_spans(), SpanKind.CONSUMER)
    assert state.seen == [(TENANT, consumer.context.trace_id)]
    trace_id = format(consumer.context.trace_id, "032x")

    [app_line] = [r for r in caplog.records if r.name == "app.processor"]
    assert app_line.tenant == TENANT  # type: ignore[attr-defined]
    assert app_line.job_id == "job-2"  # type: ignore[attr-defined]
    assert app_line.trace_id == trace_id  # type: ignore[attr-defined]

    [outcome] = [r for r in caplog.records if r.name == "streamq.jobs"]
    assert outcome.levelno == logging.INFO
    fields = {k: getattr(outcome, k) for k in (
        "queue", "job_id", "job", "attempt", "tenant", "outcome", "trace_id")}
    assert fields == {"queue": "obs", "job_id": "job-2", "job": "work", "attempt": 1,
                      "tenant": TENANT, "outcome": "completed", "trace_id": trace_id}
    assert outcome.shard in ("obs", "obs-1")  # type: ignore[attr-defined]
    assert outcome.duration_ms >= 0  # type: ignore[attr-defined]


async def test_a_job_enqueued_without_trace_context_starts_its_own_trace(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exporter
    queue = Queue(Obs, aredis, prefix=prefix)  # no tracing on the producer side
    manager, _ = await run_worker(make_app(Behaviour()), TracingHooks(provider))
    await queue.add(Obs.work, Work(project_id=TENANT))
    await queue.add(Obs.work, Work(project_id=TENANT))
    await manager.run_until_idle(timeout_s=10)
    consumers = by_kind(spans.get_finished_spans(), SpanKind.CONSUMER)
    assert len(consumers) == 2
    assert all(s.parent is None for s in consumers)
    assert consumers[0].context.trace_id != consumers[1].context.trace_id


async def test_the_envelope_keeps_its_trace_context_across_retries(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = exporter
    seen: list[dict[str, str] | None] = []

    def trace_field(j: Job[Work]) -> None:
        seen.append(j.trace_context)
        if j.attempt < 2:
            raise RuntimeError("again")

    hooks = TracingHooks(provider)
    state = Behaviour(observe=trace_field)
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    manager, _ = await run_worker(make_app(state), hooks)
    await queue.add(Obs.work, Work(project_id=TENANT, mode="observe"))
    await manager.run_until_idle(timeout_s=10)
    assert len(seen) == 2
    assert seen[0] is not None
    assert "traceparent" in seen[0]
    assert seen[0] == seen[1]


async def test_a_batch_is_one_consumer_span_linked_to_each_jobs_producer_span(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    from streamq import App, Batch, JobRequest

    provider, spans = exporter
    hooks = TracingHooks(provider)
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    await queue.for_key("k").add_bulk(
        [JobRequest(Obs.work, Work(project_id=TENANT, n=n)) for n in range(3)]
    )
    app = App([Obs])

    @app.processor(Obs, batch=Batch(max_size=10, max_wait=0.1))
    async def process(jobs: list[Job[Work]]) -> None:
        for j in jobs:
            if j.payload.n == 2:
                j.fail(RuntimeError("row 2 rejected"))

    manager, _ = await run_worker(app, hooks)
    await manager.run_until_idle(timeout_s=10)
    finished = spans.get_finished_spans()
    producers = by_kind(finished, SpanKind.PRODUCER)
    assert len(producers) == 3
    consumers = by_kind(finished, SpanKind.CONSUMER)
    first = consumers[0]
    assert dict(first.attributes or {})["messaging.batch.message_count"] == 3
    linked = {link.context.span_id for link in first.links}
    assert linked == {p.context.span_id for p in producers}
    events = [e for e in first.events if e.name == "job finished"]
    assert sorted(str((e.attributes or {})["streamq.outcome"]) for e in events) == [
        "completed", "completed", "retried"]
