"""OpenTelemetry tracing: a :class:`~streamq.hooks.Hooks` adapter (extra ``streamq[tracing]``).

The producer opens a PRODUCER span ``publish <queue>`` around each add and injects its W3C
trace context (``traceparent``, and ``baggage``) into the job envelope. The worker continues it
in a CONSUMER span ``process <queue>`` per attempt, parented to the producer span: a job run
three times shows three consumer spans under the same producer span (the envelope keeps its
trace context across retries). Attributes follow the messaging semantic conventions; the
tenant id (the contract's ``tenant_field``) is a span attribute and baggage entry. Exception
text is scrubbed of the payload's secret values before it is recorded.

Example::

    hooks = TracingHooks()              # the global tracer provider
    queue = Queue(Ingestion, client, hooks=hooks)
    manager = WorkerManager(redis_url=url, hooks=hooks)
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

try:
    from opentelemetry import baggage, propagate, trace
    from opentelemetry import context as otel_context
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "streamq.tracing needs OpenTelemetry: pip install 'streamq[tracing]'"
    ) from exc

from streamq.hooks import Hooks, JobInfo, Outcome
from streamq.redact import scrub_text

__all__ = [
    "ATTEMPT_ATTRIBUTE",
    "TENANT_ATTRIBUTE",
    "TENANT_BAGGAGE",
    "TracingHooks",
    "configure_otlp",
    "current_trace_ids",
]

TENANT_ATTRIBUTE = "streamq.tenant"
"""Span attribute holding the tenant id."""
TENANT_BAGGAGE = "streamq.tenant"
"""Baggage key holding the tenant id, visible to the processor's own spans and calls."""
ATTEMPT_ATTRIBUTE = "messaging.redis.message.delivery_attempt"
"""1-based attempt number of the job (the system-specific delivery attempt attribute)."""

_ERROR_OUTCOMES = frozenset({"retried", "failed"})

_IN_BATCH: ContextVar[bool] = ContextVar("streamq_in_batch", default=False)


def _version() -> str:
    from streamq import __version__

    return __version__


class TracingHooks(Hooks):
    """Producer and consumer spans with W3C trace context carried in the job envelope.

    Args:
        tracer_provider: where spans go; the global provider by default.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("streamq", _version(), tracer_provider=tracer_provider)

    # -- producer --------------------------------------------------------------------------
    @contextmanager
    def enqueue_context(
        self, queue: str, job_name: str, job_id: str, tenant: str | None
    ) -> Iterator[dict[str, str] | None]:
        parent = otel_context.get_current()
        if tenant:
            parent = baggage.set_baggage(TENANT_BAGGAGE, tenant, parent)
        attributes: dict[str, Any] = {
            "messaging.system": "redis",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "streamq.job.name": job_name,
        }
        if tenant:
            attributes[TENANT_ATTRIBUTE] = tenant
        span = self.tracer.start_span(
            f"publish {queue}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes
        )
        ctx = trace.set_span_in_context(span, parent)
        token = otel_context.attach(ctx)
        try:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=ctx)
            yield carrier or None
        except BaseException as exc:
            _record_error(span, exc, frozenset())
            raise
        finally:
            otel_context.detach(token)
            span.end()

    # -- worker ----------------------------------------------------------------------------
    @contextmanager
    def process_context(self, job: JobInfo) -> Iterator[None]:
        # A job without trace context starts a new trace: never inherit whatever context the
        # worker's task happened to be created in.
        parent = (
            propagate.extract(job.trace_context, context=Context())
            if job.trace_context
            else Context()
        )
        if job.tenant:
            parent = baggage.set_baggage(TENANT_BAGGAGE, job.tenant, parent)
        span = self.tracer.start_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=_consumer_attributes(job),
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            yield
        except BaseException as exc:
            _record_error(span, exc, job.secret_values)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    @contextmanager
    def batch_context(self, jobs: Sequence[JobInfo]) -> Iterator[None]:
        # One CONSUMER span for the call, linked to each job's producer span (messaging
        # conventions for batch receives): each job keeps its trace, the call has its own.
        links = []
        for job in jobs:
            if job.trace_context:
                ctx = trace.get_current_span(
                    propagate.extract(job.trace_context, context=Context())
                ).get_span_context()
                if ctx.is_valid:
                    links.append(trace.Link(ctx, {"messaging.message.id": job.job_id}))
        first = jobs[0]
        span = self.tracer.start_span(
            f"process {first.queue}",
            context=Context(),
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "redis",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": first.queue,
                "messaging.batch.message_count": len(jobs),
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span, Context()))
        flag = _IN_BATCH.set(True)
        try:
            yield
        except BaseException as exc:
            _record_error(span, exc, frozenset().union(*(j.secret_values for j in jobs)))
            raise
        finally:
            _IN_BATCH.reset(flag)
            otel_context.detach(token)
            span.end()

    def job_finished(
        self,
        job: JobInfo,
        outcome: Outcome,
        duration_s: float,
        error: BaseException | None = None,
    ) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        if _IN_BATCH.get():
            attributes: dict[str, Any] = {"messaging.message.id": job.job_id,
                                          "streamq.outcome": outcome}
            if error is not None:
                attributes["exception.type"] = type(error).__name__
                attributes["exception.message"] = scrub_text(str(error), job.secret_values)[:500]
            span.add_event("job finished", attributes)
            return
        span.set_attribute("streamq.outcome", outcome)
        if error is not None and outcome in _ERROR_OUTCOMES:
            _record_error(span, error, job.secret_values)
        elif outcome == "completed":
            span.set_status(Status(StatusCode.OK))


def _consumer_attributes(job: JobInfo) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "redis",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.destination.partition.id": job.shard,
        "messaging.message.id": job.job_id,
        ATTEMPT_ATTRIBUTE: job.attempt,
        "streamq.job.name": job.job_name,
        "streamq.job.max_attempts": job.max_attempts,
        "streamq.job.wait_ms": round(job.wait_ms, 3),
        "streamq.entry_id": job.entry_id,
    }
    if job.tenant:
        attributes[TENANT_ATTRIBUTE] = job.tenant
    return attributes


def _record_error(span: trace.Span, error: BaseException, secrets: frozenset[str]) -> None:
    """``record_exception`` with the payload's secret values scrubbed from every text."""
    if not span.is_recording():
        return
    message = scrub_text(str(error), secrets)
    stack = scrub_text(
        "".join(traceback.format_exception(type(error), error, error.__traceback__)), secrets
    )
    span.add_event(
        "exception",
        {
            "exception.type": f"{type(error).__module__}.{type(error).__qualname__}",
            "exception.message": message,
            "exception.stacktrace": stack,
        },
    )
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {message}"[:500]))


def current_trace_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` in hex of the current span, for log lines; None outside one."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def configure_otlp(endpoint: str, *, service_name: str = "streamq-worker") -> None:
    """Install a global SDK tracer provider exporting to an OTLP/HTTP collector.

    Args:
        endpoint: the collector's base URL (``http://otel-collector:4318``); spans are sent
            to ``<endpoint>/v1/traces`` in batches.
        service_name: the ``service.name`` resource attribute.

    Raises:
        ImportError: the ``streamq[otlp]`` extra is not installed.
    """
    try:
        exporter_module = importlib.import_module(
            "opentelemetry.exporter.otlp.proto.http.trace_exporter"
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(
            "exporting spans over OTLP needs the exporter: pip install 'streamq[otlp]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = exporter_module.OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
