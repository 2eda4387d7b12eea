"""Serve the dashboard with uvicorn on the running event loop, beside other work.

``python -m worker`` uses this to serve the dashboard on a port of its own
(``DASHBOARD_PORT``) in the same process and event loop as its consumers: the worker's tiny
``/metrics`` server answers ``GET`` only and reads no request body, so the dashboard's forms
do not fit in it. The worker keeps its own signal handling: uvicorn's is turned off here.

Example::

    server = DashboardServer(create_app(app, client, token=token), "127.0.0.1", 8081)
    await server.start()          # raises OSError when the port is taken
    ...
    await server.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

__all__ = ["DashboardServer"]

STARTUP_TIMEOUT_S = 30.0


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT and SIGTERM to its host process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DashboardServer:
    """An ASGI app served on ``host:port`` by a task of the running loop.

    Args:
        app: the ASGI application (:func:`streamq.dashboard.create_app`).
        host: the address to bind (loopback unless the dashboard is protected otherwise).
        port: the port; 0 picks a free one (see :attr:`port`).
    """

    def __init__(self, app: Any, host: str, port: int) -> None:
        self.host = host
        self.requested_port = port
        self._server = _QuietServer(
            uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                           timeout_graceful_shutdown=2)
        )
        self._socket: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int | None:
        """The port bound, once started."""
        return None if self._socket is None else int(self._socket.getsockname()[1])

    async def start(self) -> None:
        """Bind the port and serve; returns once the server accepts connections.

        Raises:
            OSError: the port cannot be bound.
            RuntimeError: the server stopped while starting.
        """
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.requested_port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="streamq-dashboard"
        )
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                await self.close()
                raise RuntimeError("the dashboard server stopped while starting")
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Stop serving (open requests get a moment to finish)."""
        self._server.should_exit = True
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception, SystemExit):
                await asyncio.wait_for(task, 10.0)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
