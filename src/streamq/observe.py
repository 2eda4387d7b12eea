"""Observability wiring for a worker process: hooks, job logs, /metrics, /healthz, /readyz.

:func:`build_hooks` assembles the instrumentation (Prometheus when ``prometheus_client`` is
installed, OpenTelemetry when ``opentelemetry`` is, one structured log line per job outcome,
Redis reachability); :func:`start` serves it over HTTP and starts the depth poller.

Example::

    config = ObservabilityConfig(metrics_port=9100)
    manager = WorkerManager(redis_url=url, hooks=build_hooks(config))
    manager.register_app(app)
    await manager.start()
    server = await start(manager, config)
    ...
    await server.close()
    await manager.close_workers()
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from streamq.health import Monitor, RedisHealth
from streamq.hooks import CompositeHooks, DeadReason, Hooks, JobInfo, Outcome
from streamq.redact import scrub_text
from streamq.runtime.manager import WorkerManager

__all__ = [
    "JobContextFilter",
    "JobLogHooks",
    "ObservabilityConfig",
    "ObservabilityServer",
    "Response",
    "build_hooks",
    "flush_metrics",
    "json_response",
    "serve_http",
    "start",
]

_log = logging.getLogger("streamq.observe")

H = TypeVar("H", bound=Hooks)

TraceIds = Callable[[], "tuple[str, str] | None"]


@dataclass(frozen=True)
class ObservabilityConfig:
    """How a worker process exposes itself.

    Attributes:
        metrics_port: port of the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``;
            ``None`` serves nothing (``0`` picks a free port: see
            :attr:`ObservabilityServer.port`).
        host: address the server binds.
        liveness_redis_timeout_s: ``/healthz`` fails once Redis has been unreachable longer.
        liveness_wedge_timeout_s: ``/healthz`` fails once a consumed queue has had ready jobs
            for longer while this worker started none. Keep it above the longest job: a
            worker whose every slot runs a long job starts nothing either.
        poll_interval_s: seconds between queue depth polls.
        otlp_endpoint: when given (``http://otel-collector:4318``), :func:`build_hooks`
            installs an OpenTelemetry SDK exporting spans there (extra ``streamq[otlp]``).
        service_name: ``service.name`` of exported spans.
    """

    metrics_port: int | None = None
    host: str = "0.0.0.0"
    liveness_redis_timeout_s: float = 30.0
    liveness_wedge_timeout_s: float = 60.0
    poll_interval_s: float = 5.0
    otlp_endpoint: str | None = None
    service_name: str = "streamq-worker"


# -- job logs --------------------------------------------------------------------------------
_job_context: ContextVar[dict[str, Any] | None] = ContextVar("streamq_job_context", default=None)


class JobContextFilter(logging.Filter):
    """Adds the running job's context (queue, shard, job id, job, attempt, tenant, trace id)
    to every record logged while it runs, from any logger; attach it to a handler.

    The context is set by :class:`JobLogHooks`; fields a record already has are kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _job_context.get()
        if ctx:
            for k, v in ctx.items():
                if not hasattr(record, k):
                    setattr(record, k, v)
        return True


class JobLogHooks(Hooks):
    """One structured line per job outcome on the ``streamq.jobs`` logger: WARNING for a
    dead letter (outcome ``failed``, or a job dead-lettered without running), INFO otherwise.

    Each line carries ``queue, shard, job_id, job, attempt, tenant, duration_ms, wait_ms,
    outcome`` (and ``error_type``/``error`` for failures, scrubbed of the payload's secret
    values). Payloads are never logged. Jobs that die without running (invalid payload,
    unknown job, stalled too often, lost payload) get a line with what is known.

    Args:
        logger: where lines go (default ``streamq.jobs``).
        trace_ids: returns the current ``(trace_id, span_id)``, added to the log context.
    """

    def __init__(
        self, *, logger: logging.Logger | None = None, trace_ids: TraceIds | None = None
    ) -> None:
        self.logger = logger or logging.getLogger("streamq.jobs")
        self.trace_ids = trace_ids

    @contextmanager
    def process_context(self, job: JobInfo) -> Iterator[None]:
        ctx: dict[str, Any] = {
            "queue": job.queue,
            "shard": job.shard,
            "job_id": job.job_id,
            "job": job.job_name,
            "attempt": job.attempt,
        }
        if job.tenant:
            ctx["tenant"] = job.tenant
        ids = self.trace_ids() if self.trace_ids else None
        if ids:
            ctx["trace_id"], ctx["span_id"] = ids
        token = _job_context.set(ctx)
        try:
            yield
        finally:
            _job_context.reset(token)

    def job_finished(
        self,
        job: JobInfo,
        outcome: Outcome,
        duration_s: float,
        error: BaseException | None = None,
    ) -> None:
        # A dead letter needs someone to look at it: WARNING, so it survives level filters.
        level = logging.WARNING if outcome == "failed" else logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        extra: dict[str, Any] = {
            "queue": job.queue,
            "shard": job.shard,
            "job_id": job.job_id,
            "job": job.job_name,
            "attempt": job.attempt,
            "tenant": job.tenant,
            "duration_ms": round(duration_s * 1000, 3),
            "wait_ms": round(job.wait_ms, 3),
            "outcome": outcome,
        }
        ids = self.trace_ids() if self.trace_ids else None
        if ids:
            extra["trace_id"], extra["span_id"] = ids
        if error is not None:
            extra["error_type"] = type(error).__name__
            extra["error"] = scrub_text(str(error), job.secret_values)[:500]
        self.logger.log(level, "job %s", outcome, extra=extra)

    def job_dead_lettered(self, queue: str, shard: str, job_name: str, reason: DeadReason) -> None:
        # Failures of a run were logged by job_finished; these never ran.
        if reason in ("error", "permanent", "timeout"):
            return
        self.logger.warning(
            "job dead-lettered without running",
            extra={"queue": queue, "shard": shard, "job": job_name, "outcome": "failed",
                   "reason": reason},
        )


# -- hooks -----------------------------------------------------------------------------------
def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build_hooks(config: ObservabilityConfig) -> Hooks:
    """Hooks for a worker process.

    In order: OpenTelemetry tracing (when ``opentelemetry`` is importable; with
    ``config.otlp_endpoint`` an SDK exporting there is installed), Prometheus metrics in a
    registry of their own with process and GC collectors (when ``prometheus_client`` is
    importable), structured job-outcome logs, and the Redis reachability tracker that
    :func:`start` reads. Pass the result to ``WorkerManager(hooks=...)`` (and to producers).
    """
    hooks: list[Hooks] = []
    trace_ids: TraceIds | None = None
    if _installed("opentelemetry.trace"):
        from streamq import tracing

        if config.otlp_endpoint:
            tracing.configure_otlp(config.otlp_endpoint, service_name=config.service_name)
        hooks.append(tracing.TracingHooks())
        trace_ids = tracing.current_trace_ids
    elif config.otlp_endpoint:
        _log.warning("otlp_endpoint is set but OpenTelemetry is not installed: "
                     "pip install 'streamq[tracing,otlp]'")
    if _installed("prometheus_client"):
        hooks.append(_prometheus_hooks())
    hooks.append(JobLogHooks(trace_ids=trace_ids))
    hooks.append(RedisHealth())
    return CompositeHooks(hooks)


def _prometheus_hooks() -> Hooks:
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )

    from streamq.metrics import PrometheusHooks

    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return PrometheusHooks(registry)


def find_hooks(hooks: Hooks, kind: type[H]) -> H | None:
    """The first adapter of type ``kind`` in ``hooks`` (searching composites)."""
    if isinstance(hooks, kind):
        return hooks
    if isinstance(hooks, CompositeHooks):
        for h in hooks.hooks:
            found = find_hooks(h, kind)
            if found is not None:
                return found
    return None


def flush_metrics(hooks: Hooks) -> None:
    """Write per-job figures the Prometheus adapter in ``hooks`` still holds (they wait at most
    ``streamq.metrics.FLUSH_INTERVAL_S``); call it before a process exits."""
    prometheus = _prometheus_of(hooks)
    if prometheus is not None:
        prometheus.flush()


def _prometheus_of(hooks: Hooks) -> Any:
    """The PrometheusHooks in ``hooks`` without importing prometheus_client when absent."""
    for h in _walk(hooks):
        if type(h).__name__ == "PrometheusHooks" and type(h).__module__ == "streamq.metrics":
            return h
    return None


def _walk(hooks: Hooks) -> Iterator[Hooks]:
    yield hooks
    if isinstance(hooks, CompositeHooks):
        for h in hooks.hooks:
            yield from _walk(h)


# -- HTTP ------------------------------------------------------------------------------------
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
Response = tuple[int, str, bytes]
"""``(status, content type, body)`` of one HTTP response."""
Route = Callable[[str, str], Awaitable[Response]]
"""``route(method, path)``: the response to one request."""


async def serve_http(route: Route, host: str, port: int) -> asyncio.Server:
    """Serve HTTP/1.x on ``host:port``, one request per connection, each answered with
    ``await route(method, path)`` (the query string left out; ``HEAD`` gets no body).

    Raises:
        OSError: the port cannot be bound.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(_read_head(reader), 5.0)
            if request is None:
                return
            method, path = request
            status, ctype, body = await route(method, path)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            pass
        except Exception:
            _log.exception("observability request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)


class ObservabilityServer:
    """The running HTTP server and depth poller of one worker process."""

    def __init__(self, manager: WorkerManager, monitor: Monitor, metrics: Any) -> None:
        self.manager = manager
        self.monitor = monitor
        self.metrics = metrics
        self._server: asyncio.Server | None = None
        self._filter: JobContextFilter | None = None

    @property
    def port(self) -> int | None:
        """The port actually bound (useful with ``metrics_port=0``); None when not serving."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self, host: str, port: int) -> None:
        async def route(method: str, path: str) -> Response:
            return self.route(method, path)

        self._server = await serve_http(route, host, port)

    async def close(self) -> None:
        """Stop serving and polling."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        await self.monitor.close()
        if self._filter is not None:
            for h in logging.getLogger().handlers:
                h.removeFilter(self._filter)
            self._filter = None

    def install_log_context(self) -> None:
        """Add :class:`JobContextFilter` to the root logger's handlers (undone by close)."""
        self._filter = JobContextFilter()
        for h in logging.getLogger().handlers:
            h.addFilter(self._filter)

    def route(self, method: str, path: str) -> Response:
        """The response to one request."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"method not allowed\n"
        if path == "/metrics":
            return self._metrics()
        if path in ("/healthz", "/livez"):
            return json_response(*self.monitor.liveness())
        if path == "/readyz":
            return json_response(*self.monitor.readiness())
        return 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n"

    def _metrics(self) -> Response:
        if self.metrics is None:
            return 404, "text/plain; charset=utf-8", (
                b"metrics are off: pip install 'streamq[metrics]' and use build_hooks()\n"
            )
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """``(method, path)`` of one HTTP/1.x request; its headers are read and ignored."""
    line = await reader.readline()
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        return None
    for _ in range(100):
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
    return parts[0].upper(), parts[1].split("?", 1)[0]


def json_response(ok: bool, detail: dict[str, Any]) -> Response:
    """``{"status": "ok" | "fail", **detail}`` with 200 when ``ok``, else 503."""
    body = json.dumps({"status": "ok" if ok else "fail", **detail}, default=str).encode()
    return (200 if ok else 503), "application/json", body + b"\n"


async def start(manager: WorkerManager, config: ObservabilityConfig) -> ObservabilityServer:
    """Start the depth poller and serve ``/metrics``, ``/healthz`` and ``/readyz``.

    Call it after ``manager.start()`` (or before: the poller waits for workers). Reads the
    adapters :func:`build_hooks` put in ``manager.hooks``; with other hooks, Redis
    reachability comes from the poller alone and ``/metrics`` answers 404. Also adds
    :class:`JobContextFilter` to the root logger's handlers.

    Raises:
        OSError: the port cannot be bound.
    """
    health = find_hooks(manager.hooks, RedisHealth)
    if health is None:
        health = RedisHealth()
        if isinstance(manager.hooks, CompositeHooks):
            manager.hooks.hooks.append(health)
    monitor = Monitor(
        manager,
        manager.hooks,
        health,
        interval_s=config.poll_interval_s,
        redis_timeout_s=config.liveness_redis_timeout_s,
        wedge_timeout_s=config.liveness_wedge_timeout_s,
    )
    server = ObservabilityServer(manager, monitor, _prometheus_of(manager.hooks))
    monitor.start()
    server.install_log_context()
    if config.metrics_port is not None:
        try:
            await server.serve(config.host, config.metrics_port)
        except BaseException:
            await server.close()
            raise
        _log.info("serving /metrics, /healthz and /readyz",
                  extra={"host": config.host, "port": server.port})
    return server
