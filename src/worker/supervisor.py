"""Several worker processes on one machine: ``python -m worker`` with ``WORKER_PROCESSES`` > 1.

The process ``python -m worker`` starts becomes a supervisor that runs no jobs. It starts N
worker processes (``python -m worker.child``, see :mod:`worker.child`), each a complete
worker with its own consumer name, so they share the queues through the consumer group
exactly as workers on different machines do. The same model as Dramatiq's ``--processes``,
Celery's ``-c`` and taskiq's ``--workers``:

- **Start.** Every process must start (reach "consuming") the first time, as one process
  must: one that cannot (bad configuration Redis refuses, Redis unreachable) stops the others
  and the supervisor exits with its code (2 or 1).
- **Restart.** A process that dies later (killed, crashed, out of memory) is logged with its
  exit code or signal and started again after a backoff (0.5 s doubling to 30 s; back to
  0.5 s once a process has run for a minute). The jobs it held are reclaimed after their
  lock expires, as for any dead worker.
- **Stop.** SIGTERM or SIGINT is forwarded to every process, which shuts down gracefully;
  those still running after the longest queue shutdown timeout plus the settle wait and a
  margin (:func:`shutdown_grace_s`) are killed (SIGKILL), and the supervisor says so. A
  second signal is forwarded too (each process then stops at once); processes still there
  5 s later are killed. The processes run in process groups of their own, so a Ctrl-C at a
  terminal reaches them once, through the supervisor.
- **Observability.** Each process writes its metrics to a fresh temporary directory
  (``PROMETHEUS_MULTIPROC_DIR``) and serves its health on a loopback port; the supervisor
  serves ``/metrics``, ``/healthz`` and ``/readyz`` for all of them on ``METRICS_PORT``
  (:mod:`worker.fleet`).

Example::

    WORKER_PROCESSES=4 WORKER_APP=myapp.worker:app REDIS_URL=redis://redis:6379/0 \\
    QUEUE_CONSUMER_INGESTION_IS_ENABLED=true METRICS_PORT=9100 python -m worker
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamq.app import App
from streamq.errors import ConfigurationError
from worker import launch
from worker.__main__ import Shutdown, resolve_redis_url, run_loop
from worker.dashboard import start_dashboard
from worker.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from worker.fleet import FleetServer, ProcessState, ProcessStatus
from worker.settings import Settings, worker_overrides

__all__ = ["Supervisor", "shutdown_grace_s", "supervise"]

_log = logging.getLogger("streamq.worker.supervisor")

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
STABLE_AFTER_S = 60.0
"""A process that ran this long before it died is restarted after the first delay again."""
SHUTDOWN_MARGIN_S = 5.0
FORCED_WAIT_S = 5.0
"""After a second signal, how long processes may take to stop before they are killed."""


def shutdown_grace_s(settings: Settings, app: App) -> float:
    """How long a worker process may take to stop gracefully: its longest queue
    ``shutdown_timeout`` for running jobs, then the settle wait (the longer of 5 s and that
    timeout), plus a margin."""
    overrides = worker_overrides(settings, app)
    longest = 0.0
    for lane in settings.queues:
        reg = app.registration(lane)
        if reg is not None:
            opts = reg.options.merged(**overrides.get(lane, {}))
            longest = max(longest, opts.shutdown_timeout_s)
    return longest + max(5.0, longest) + SHUTDOWN_MARGIN_S


def supervise(settings: Settings, app: App, env: Mapping[str, str]) -> int:
    """Run ``settings.processes`` worker processes until SIGTERM/SIGINT; the exit code."""
    with launch.metrics_dir(enabled=settings.metrics_port is not None) as metrics_dir:
        supervisor = Supervisor(
            settings,
            child_env=launch.child_env(env, metrics_dir),
            metrics_dir=metrics_dir,
            grace_s=shutdown_grace_s(settings, app),
            app=app,
        )
        # The supervisor runs no jobs: asyncio's own loop is enough, and its subprocess
        # support takes every Popen option.
        own = dataclasses.replace(settings, event_loop="asyncio")
        return run_loop(own, supervisor.run, Shutdown())


@dataclass
class _Child:
    """One slot and the process currently in it."""

    slot: int
    proc: asyncio.subprocess.Process | None = None
    state: ProcessState = "starting"
    port: int | None = None
    started_at: float = 0.0
    reported: bool = False  # this incarnation reached "consuming"
    consumed: bool = False  # some incarnation did
    restarts: int = 0
    quick_deaths: int = 0
    last_exit: str | None = None
    restart_at: float | None = None
    report: asyncio.Task[None] | None = None
    killed: bool = False  # the supervisor killed it after its grace period

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def name(self) -> str:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return f"worker process {self.slot}{pid}"

    def extra(self) -> dict[str, object]:
        return {"worker_process": self.slot, "pid": self.pid}

    def status(self, now: float) -> ProcessStatus:
        wait = None if self.restart_at is None else max(0.0, self.restart_at - now)
        return ProcessStatus(
            slot=self.slot,
            pid=self.pid if self.alive else None,
            state=self.state,
            port=self.port,
            restarts=self.restarts,
            last_exit=self.last_exit,
            restart_in_s=wait,
        )


class Supervisor:
    """Starts, restarts and stops the worker processes; serves their metrics and health.

    Args:
        settings: the parsed settings (``processes``, ``metrics_port``...).
        child_env: the environment of every worker process.
        metrics_dir: the multiprocess directory the processes write their metrics to (None
            without prometheus-client).
        grace_s: how long processes may take to stop gracefully before they are killed.
        app: the app, for the dashboard the supervisor serves (``DASHBOARD_IS_ENABLED``).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        child_env: Mapping[str, str],
        metrics_dir: Path | None,
        grace_s: float,
        app: App | None = None,
    ) -> None:
        self.settings = settings
        self.app = app if app is not None else App()
        self.child_env = dict(child_env)
        self.metrics_dir = metrics_dir
        self.grace_s = grace_s
        self.children = [_Child(slot) for slot in range(settings.processes)]
        self.stop_signal: signal.Signals | None = None
        self.failed_start: int | None = None
        self.unclean = 0
        self.signals = 0
        self._announced = False
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Act as if ``sig`` arrived: the first call stops gracefully, a second forces."""
        self._on_signal(sig)

    def statuses(self) -> list[ProcessStatus]:
        now = time.monotonic()
        return [c.status(now) for c in self.children]

    async def run(self) -> int:
        """Start every process, keep them running until a signal, stop them; the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        server = None
        dashboard = None
        try:
            url = self.settings.redis_url
            if url is None:
                # Start the embedded Redis once, here, rather than race N processes to it.
                url = await asyncio.to_thread(resolve_redis_url, self.settings)
            server = await self._serve()
            dashboard = await start_dashboard(self.settings, self.app, url)
            _log.info("starting worker processes",
                      extra={"processes": len(self.children),
                             "event_loop": self.settings.event_loop,
                             "metrics_port": server.port if server else None,
                             "shutdown_grace_s": self.grace_s})
            keepers = []
            for child in self.children:
                if self._stop.is_set():  # a signal came while starting: start no more
                    child.state = "stopped"
                    continue
                await self._spawn(child)
                keepers.append(asyncio.create_task(self._keep(child),
                                                   name=f"streamq-keep-{child.slot}"))
            await self._stop.wait()
            await self._wait_stopped(keepers)
        finally:
            if dashboard is not None:
                await dashboard.close()
            if server is not None:
                await server.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        code = self._exit_code()
        _log.info("stopped", extra={"exit_code": code})
        return code

    async def _serve(self) -> FleetServer | None:
        port = self.settings.metrics_port
        if port is None:
            return None
        server = FleetServer(self.statuses, metrics_dir=self.metrics_dir,
                             stopping=self._stop.is_set)
        host = self.settings.metrics_host
        try:
            await server.serve(host, port)
        except OSError as exc:
            raise ConfigurationError(
                f"METRICS_PORT: cannot serve /metrics on {host}:{port}: {exc} "
                "(METRICS_HOST, METRICS_PORT)"
            ) from exc
        _log.info("serving /metrics, /healthz and /readyz for every worker process",
                  extra={"host": host, "port": server.port})
        return server

    # -- one slot ----------------------------------------------------------------------------
    async def _spawn(self, c: _Child) -> None:
        try:
            c.proc, report_fd = await launch.launch(c.slot, self.child_env)
        except OSError as exc:
            c.proc = None
            c.last_exit = f"failed to launch: {exc}"
            _log.error(f"worker process {c.slot} failed to launch: {exc}",
                       extra={"worker_process": c.slot})
            return
        c.state, c.port, c.reported, c.restart_at, c.killed = "starting", None, False, None, False
        c.started_at = time.monotonic()
        c.report = asyncio.create_task(self._started(c, report_fd))
        if self.stop_signal is not None:  # a stop began while it was being started
            c.state = "stopping"
            self._send(c, self.stop_signal)

    async def _started(self, c: _Child, report_fd: int) -> None:
        """Wait for the process to report that it consumes (or to end first)."""
        started = await launch.read_report(report_fd)
        if started is None:
            return  # it ended before it consumed
        c.port = started.port
        c.reported = c.consumed = True
        if c.state == "starting":
            c.state = "running"
        _log.info("worker process started", extra={**c.extra(), "restarts": c.restarts})
        if not self._announced and all(x.reported for x in self.children):
            self._announced = True
            _log.info("worker processes consuming",
                      extra={"processes": len(self.children),
                             "pids": [x.pid for x in self.children]})

    async def _keep(self, c: _Child) -> None:
        """Restart ``c`` whenever its process ends, until the supervisor stops."""
        while True:
            code = await c.proc.wait() if c.proc is not None else EXIT_FAILED
            if c.report is not None:
                # Its end closed the pipe: read what it wrote before it died, if anything.
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(c.report, 1.0)
                c.report = None
            self._ended(c, code)
            if self._stop.is_set():
                return
            if not c.consumed:
                self._fail_start(c, code)
                return
            delay = self._restart_delay(c)
            _log.warning(f"{c.name()} {c.last_exit}; restarting it in {delay:g} s",
                         extra={**c.extra(), "exit_code": code, "restart_in_s": delay,
                                "restarts": c.restarts})
            c.state, c.restart_at = "restarting", time.monotonic() + delay
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
                c.state = "stopped"
                return
            c.restarts += 1
            await self._spawn(c)

    def _ended(self, c: _Child, code: int) -> None:
        c.last_exit = launch.describe_exit(code) if c.proc is not None else c.last_exit
        c.port = None
        c.state = "stopped"
        if c.proc is not None and self.metrics_dir is not None:
            from prometheus_client import multiprocess

            # Its live gauges (running jobs, depth readings) no longer count; its counters do.
            multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                c.proc.pid, str(self.metrics_dir)
            )
        if self._stop.is_set():
            # A process stopped before it consumed may have been ended by the signal itself.
            stopped_early = (not c.reported and self.stop_signal is not None
                             and code == -self.stop_signal)
            if code != EXIT_OK and not stopped_early:
                self.unclean += 1
            quiet = (code == EXIT_OK or stopped_early or c.killed or self._forced.is_set()
                     or self.failed_start is not None)
            if quiet:
                _log.debug(f"{c.name()} {c.last_exit}", extra={**c.extra(), "exit_code": code})
            else:
                _log.warning(f"{c.name()} {c.last_exit} while stopping",
                             extra={**c.extra(), "exit_code": code})

    def _restart_delay(self, c: _Child) -> float:
        if time.monotonic() - c.started_at >= STABLE_AFTER_S:
            c.quick_deaths = 0
        c.quick_deaths += 1
        return min(RESTART_MAX_S, RESTART_FIRST_S * 2.0 ** (c.quick_deaths - 1))

    def _fail_start(self, c: _Child, code: int) -> None:
        self.failed_start = code if code in (EXIT_FAILED, EXIT_USAGE) else EXIT_FAILED
        _log.error(f"{c.name()} could not start: it {c.last_exit}; stopping the others",
                   extra={**c.extra(), "exit_code": code})
        self._begin_stop(signal.SIGTERM)

    # -- stopping ----------------------------------------------------------------------------
    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            _log.info("shutting down gracefully; send the signal again to stop at once",
                      extra={"signal": sig.name, "processes": len(self.children)})
            self._begin_stop(sig)
            return
        if self._forced.is_set():
            return
        _log.warning("second signal: stopping now; unfinished jobs are reclaimed after their "
                     "lock expires", extra={"signal": sig.name})
        self._forced.set()
        for c in self.children:
            self._send(c, sig)

    def _begin_stop(self, sig: signal.Signals) -> None:
        if self.stop_signal is not None:
            return
        self.stop_signal = sig
        self._stop.set()
        for c in self.children:
            if c.alive:
                c.state = "stopping"
            self._send(c, sig)

    def _send(self, c: _Child, sig: signal.Signals) -> None:
        if c.proc is not None and c.alive:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(sig)

    async def _wait_stopped(self, keepers: list[asyncio.Task[None]]) -> None:
        """Wait for every process to end: up to the grace period (or, after a second signal,
        a few seconds), then kill what is left."""
        everyone: asyncio.Future[Any] = asyncio.gather(*keepers)
        forced: asyncio.Future[Any] = asyncio.create_task(self._forced.wait())
        try:
            await asyncio.wait({everyone, forced}, timeout=self.grace_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not everyone.done() and self._forced.is_set():
                await asyncio.wait({everyone}, timeout=FORCED_WAIT_S)
            if not everyone.done():
                waited = FORCED_WAIT_S if self._forced.is_set() else self.grace_s
                self._kill_stragglers(waited)
            await everyone
        finally:
            forced.cancel()

    def _kill_stragglers(self, waited_s: float) -> None:
        for c in self.children:
            if not c.alive or c.proc is None:
                continue
            _log.warning(
                f"{c.name()} did not stop within {waited_s:g} s: killing it (SIGKILL); the "
                "jobs it still held stay pending and another worker reclaims them once their "
                "lock expires",
                extra=c.extra(),
            )
            c.killed = True
            with contextlib.suppress(ProcessLookupError):
                c.proc.kill()

    def _exit_code(self) -> int:
        if self.failed_start is not None:
            return self.failed_start
        if self._forced.is_set() or self.unclean:
            return EXIT_FAILED
        return EXIT_OK
