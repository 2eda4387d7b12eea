"""The web dashboard of ``python -m worker`` (``DASHBOARD_IS_ENABLED=true``).

It is served on ``DASHBOARD_HOST:DASHBOARD_PORT``, a port of its own, by uvicorn running in
the worker's event loop (the ``/metrics`` server reads no request body, so the dashboard's
forms cannot be mounted in it). With ``WORKER_PROCESSES`` > 1 the supervisor serves it once
for the whole fleet: the figures come from Redis, not from a process.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from streamq.app import App
from streamq.errors import ConfigurationError
from worker.settings import Settings

__all__ = ["Dashboard", "start_dashboard"]

_log = logging.getLogger("streamq.worker.dashboard")


class Dashboard:
    """The running dashboard and its Redis client."""

    def __init__(self, server: Any, client: Any) -> None:
        self.server = server
        self.client = client

    @property
    def port(self) -> int | None:
        return self.server.port  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self.server.close()
        with contextlib.suppress(Exception):
            await self.client.aclose()


async def start_dashboard(settings: Settings, app: App[Any], redis_url: str) -> Dashboard | None:
    """Serve the dashboard when ``DASHBOARD_IS_ENABLED``; None when it is not.

    Raises:
        ConfigurationError: the port cannot be bound (names ``DASHBOARD_PORT``).
    """
    if not settings.dashboard_enabled:
        return None
    from streamq.dashboard import create_app
    from streamq.dashboard.serve import DashboardServer
    from streamq.tls import connect

    client: Any = connect(redis_url, tls=settings.redis_tls, cluster=settings.redis_cluster)
    web = create_app(app, client, token=settings.dashboard_token,
                     read_only=settings.dashboard_read_only, prefix=settings.redis_prefix,
                     group=settings.worker_group)
    server = DashboardServer(web, settings.dashboard_host, settings.dashboard_port)
    try:
        await server.start()
    except (OSError, RuntimeError) as exc:
        with contextlib.suppress(Exception):
            await client.aclose()
        raise ConfigurationError(
            f"DASHBOARD_PORT: cannot serve the dashboard on {settings.dashboard_host}:"
            f"{settings.dashboard_port}: {exc} (DASHBOARD_HOST, DASHBOARD_PORT)"
        ) from exc
    mode = ("read-only" if settings.dashboard_read_only
            else "actions need the token" if settings.dashboard_token else "actions off")
    _log.info("serving the dashboard", extra={"host": settings.dashboard_host,
                                              "port": server.port, "mode": mode})
    return Dashboard(server, client)
