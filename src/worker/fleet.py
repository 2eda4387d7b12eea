"""``/metrics``, ``/healthz`` and ``/readyz`` of a supervisor, for all its worker processes.

- ``/metrics``: what every worker process wrote to the multiprocess directory
  (``PROMETHEUS_MULTIPROC_DIR``), merged by prometheus-client's ``MultiProcessCollector``:
  counters and histograms summed over processes (dead ones included, so totals never go
  back), gauges as :data:`streamq.metrics.GAUGE_MODES` says; plus the supervisor's own
  ``streamq_worker_processes`` and ``streamq_worker_process_restarts_total``.
- ``/healthz`` and ``/readyz``: ask every worker process its own (on its loopback port) and
  answer 200 only when every process is up and answers 200; each problem is prefixed with the
  process it comes from, and a process that is starting, down, restarting or silent is a
  problem itself.

Example::

    server = FleetServer(statuses, metrics_dir=Path("/tmp/streamq-metrics-x"))
    await server.serve("0.0.0.0", 9100)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from streamq.observe import Response, json_response, serve_http

__all__ = ["HEALTH_TIMEOUT_S", "FleetServer", "ProcessState", "ProcessStatus"]

HEALTH_TIMEOUT_S = 2.0
"""How long a worker process may take to answer the supervisor's health request."""

ProcessState = Literal["starting", "running", "restarting", "stopping", "stopped"]
_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """What the supervisor knows of one worker process.

    Attributes:
        slot: its index, 0..N-1; kept across restarts.
        pid: its process id (None while down).
        state: ``starting`` (not consuming yet), ``running``, ``restarting`` (down, waiting
            to start again), ``stopping`` (told to stop), ``stopped``.
        port: the loopback port of its health and metrics server (None when not serving).
        restarts: how many times it was started again after it died.
        last_exit: how it ended last time (``exited with code 1``, ``was killed by
            SIGKILL``), None if it never ended.
        restart_in_s: while restarting, seconds until it starts again.
    """

    slot: int
    pid: int | None
    state: ProcessState
    port: int | None = None
    restarts: int = 0
    last_exit: str | None = None
    restart_in_s: float | None = None

    def name(self) -> str:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return f"worker process {self.slot}{pid}"

    def down(self) -> str | None:
        """Why this process cannot answer for itself; None when it is running."""
        if self.state == "running":
            return None
        if self.state == "restarting":
            wait = f" in {self.restart_in_s:.1f} s" if self.restart_in_s is not None else ""
            return f"worker process {self.slot} is down ({self.last_exit}); restarting{wait}"
        return f"{self.name()} is {self.state}"


Statuses = Callable[[], list[ProcessStatus]]


class FleetServer:
    """The supervisor's HTTP server.

    Args:
        statuses: the current status of every worker process.
        metrics_dir: the multiprocess directory; None serves no metrics (404, as a single
            worker without prometheus-client does).
        stopping: whether the supervisor is shutting down (``/readyz`` then fails).
    """

    def __init__(
        self,
        statuses: Statuses,
        *,
        metrics_dir: Path | None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.statuses = statuses
        self.stopping = stopping
        self.registry = _registry(statuses, metrics_dir) if metrics_dir is not None else None
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int | None:
        """The port bound; None when not serving."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self, host: str, port: int) -> None:
        """Start serving. Raises OSError when the port cannot be bound."""
        self._server = await serve_http(self.route, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def route(self, method: str, path: str) -> Response:
        """The response to one request."""
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"method not allowed\n"
        if path == "/metrics":
            return await self._metrics()
        if path in ("/healthz", "/livez"):
            return await self._health("/healthz")
        if path == "/readyz":
            return await self._health("/readyz")
        return 404, _TEXT, b"not found: try /metrics, /healthz, /readyz\n"

    async def _metrics(self) -> Response:
        if self.registry is None:
            return 404, _TEXT, (
                b"metrics are off: pip install 'streamq[metrics]' and use build_hooks()\n"
            )
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        # Reading every process's file is file I/O: keep it off the loop.
        body = await asyncio.to_thread(generate_latest, self.registry)
        return 200, CONTENT_TYPE_LATEST, body

    async def _health(self, path: str) -> Response:
        statuses = self.statuses()
        answers = await asyncio.gather(*(_ask(s, path) for s in statuses))
        problems: list[str] = []
        if path == "/readyz" and self.stopping():
            problems.append("shutting down")
        processes = []
        for status, (found, body) in zip(statuses, answers, strict=True):
            problems.extend(found)
            processes.append({
                "slot": status.slot,
                "pid": status.pid,
                "state": status.state,
                "restarts": status.restarts,
                "last_exit": status.last_exit,
                "status": body.get("status"),
                "queues": body.get("queues"),
            })
        if not statuses:
            problems.append("no worker process")
        return json_response(not problems, {"problems": problems, "processes": processes})


async def _ask(status: ProcessStatus, path: str) -> tuple[list[str], dict[str, Any]]:
    """The problems of one process at ``path`` and the body it answered."""
    down = status.down()
    if down is not None:
        return [down], {}
    if status.port is None:  # it serves nothing: only whether it runs is known
        return [], {"status": "ok"}
    try:
        code, body = await asyncio.wait_for(_get(status.port, path), HEALTH_TIMEOUT_S)
    except TimeoutError:
        return [f"{status.name()} did not answer {path} within {HEALTH_TIMEOUT_S:g} s"], {}
    except (OSError, ValueError) as exc:
        return [f"{status.name()} did not answer {path}: {exc}"], {}
    problems = [f"{status.name()}: {p}" for p in body.get("problems", [])]
    if code != 200 and not problems:
        problems.append(f"{status.name()} answered {path} with {code}")
    return problems, body


async def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """``GET path`` from the loopback ``port``: the status code and the JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                     .encode("latin-1"))
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {head[:80]!r}")
    data = json.loads(body) if body.strip() else {}
    return int(parts[1]), data if isinstance(data, dict) else {}


def _registry(statuses: Statuses, metrics_dir: Path) -> Any:
    """A registry that reads every process's metrics, or None without prometheus-client."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector
    except ImportError:
        return None
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
    registry.register(_SupervisorCollector(statuses))
    return registry


class _SupervisorCollector:
    """The supervisor's own metrics, computed at each scrape."""

    def __init__(self, statuses: Statuses) -> None:
        self.statuses = statuses

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        statuses = self.statuses()
        processes = GaugeMetricFamily(
            "streamq_worker_processes", "Worker processes of this supervisor, by state.",
            labels=["state"],
        )
        for state in ("starting", "running", "restarting", "stopping", "stopped"):
            processes.add_metric([state], sum(s.state == state for s in statuses))
        yield processes
        restarts = CounterMetricFamily(
            "streamq_worker_process_restarts", "Worker processes started again after they "
            "died.",
        )
        restarts.add_metric([], sum(s.restarts for s in statuses))
        yield restarts
