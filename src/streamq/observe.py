"""Observability wiring for a worker process: hooks, /metrics, /healthz, /readyz.

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

from dataclasses import dataclass

from streamq.hooks import CompositeHooks, Hooks
from streamq.runtime.manager import WorkerManager

__all__ = ["ObservabilityConfig", "ObservabilityServer", "build_hooks", "start"]


@dataclass(frozen=True)
class ObservabilityConfig:
    """How a worker process exposes itself.

    Attributes:
        metrics_port: port of the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``;
            ``None`` serves nothing.
        host: address the server binds.
        liveness_redis_timeout_s: ``/healthz`` fails once Redis has been unreachable longer.
        liveness_wedge_timeout_s: ``/healthz`` fails once a consumed queue has had ready jobs
            but this worker started none for longer.
    """

    metrics_port: int | None = None
    host: str = "0.0.0.0"
    liveness_redis_timeout_s: float = 30.0
    liveness_wedge_timeout_s: float = 60.0


def build_hooks(config: ObservabilityConfig) -> Hooks:
    """Hooks for a worker process: Prometheus and OpenTelemetry when installed, job logs."""
    return CompositeHooks([])


class ObservabilityServer:
    """The running HTTP server and depth poller of one worker process."""

    async def close(self) -> None:
        """Stop serving and polling."""


async def start(manager: WorkerManager, config: ObservabilityConfig) -> ObservabilityServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` and start the depth poller."""
    return ObservabilityServer()
