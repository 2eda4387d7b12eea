"""``python -m worker``: run the consumers of a streamq app, configured from the environment.

Example::

    WORKER_APP=myapp.worker:app REDIS_URL=redis://localhost:6379/0 \\
    QUEUE_CONSUMER_INGESTION_IS_ENABLED=true QUEUE_INGESTION_CONCURRENCY=50 \\
    python -m worker

Every variable is parsed and checked before anything connects; a bad one exits with code 2
and a message naming it, and so does an app that fails to import or a configuration Redis
refuses at start (see :mod:`worker.failures`). SIGTERM or SIGINT shuts down gracefully
(running jobs finish up to their queue's shutdown timeout, the rest are handed back) and
exits 0; a second signal stops at once (exit 1). Without ``REDIS_URL`` an embedded Redis is
started (or reused) for local use. With ``WORKER_PROCESSES`` > 1 this process becomes the
supervisor of that many worker processes (:mod:`worker.supervisor`). ``--help`` lists every
variable; see also ``docs/configuration.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamq.app import App
from streamq.errors import ConfigurationError
from streamq.observe import (
    ObservabilityConfig,
    ObservabilityServer,
    build_hooks,
    flush_metrics,
    start,
)
from streamq.runtime.manager import WorkerManager
from worker.dashboard import start_dashboard
from worker.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, explain
from worker.logs import configure_logging
from worker.loops import loop_factory, loop_name
from worker.settings import (
    AppImportError,
    Settings,
    SettingsError,
    apply_app_config,
    load_settings,
    worker_overrides,
)
from worker.usage import usage

__all__ = ["Shutdown", "exit_process", "main", "resolve_redis_url", "run", "run_loop"]

_log = logging.getLogger("streamq.worker.main")
_HELP = ("-h", "--help")


class _Counts(Protocol):
    def stats(self) -> Mapping[str, int]: ...


@dataclass
class Shutdown:
    """How a run ended, for what the process says as it exits.

    ``forced``: a second signal cancelled the graceful shutdown. ``workers``: the started
    lane workers, whose ``held`` count after the run is the jobs neither settled nor handed
    back.
    """

    forced: bool = False
    workers: list[_Counts] = field(default_factory=list)

    def unreleased(self) -> int | None:
        """Jobs still held by this process (not released, not settled); None if unknown."""
        try:
            return sum(int(w.stats()["held"]) for w in self.workers)
        except Exception:  # the last words must not fail: say less instead
            return None


def resolve_redis_url(settings: Settings) -> str:
    """``REDIS_URL``, or the URL of the embedded Redis (started or reused) when it is unset."""
    if settings.redis_url is not None:
        return settings.redis_url
    from streamq.embedded import ensure

    try:
        server = ensure(settings.data_dir, port=settings.embedded_port)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"REDIS_URL is not set, so an embedded Redis was to be used, but: {exc} "
            "(STREAMQ_DATA_DIR, STREAMQ_EMBEDDED_PORT)"
        ) from exc
    _log.info(
        "REDIS_URL is not set: using an embedded Redis for local use"
        f" ({'started' if server.started else 'already running'}) at {server.url};"
        " producers on this machine reach it at the same URL. Set REDIS_URL in production.",
        extra={"redis_url": server.url, "data_dir": str(server.data_dir), "pid": server.pid,
               "started": server.started},
    )
    return server.url


async def run(
    settings: Settings,
    app: App,
    *,
    stop: asyncio.Event | None = None,
    shutdown: Shutdown | None = None,
    ready: Callable[[int | None], None] | None = None,
) -> int:
    """Consume the enabled queues until ``stop`` is set (or SIGTERM/SIGINT). Returns the exit
    code; ``shutdown`` records how the run ended. ``ready`` is called with the port of
    ``/metrics`` (None when not serving) once consuming."""
    stop = stop or asyncio.Event()
    shutdown = shutdown if shutdown is not None else Shutdown()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    signals = 0

    def on_signal(signame: str) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            _log.info("shutting down gracefully; send the signal again to stop at once",
                      extra={"signal": signame})
            stop.set()
        elif main_task is not None:
            _log.warning("second signal: stopping now; unfinished jobs are reclaimed after "
                         "their lock expires", extra={"signal": signame})
            shutdown.forced = True
            main_task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig.name)

    obs_config = ObservabilityConfig(
        metrics_port=settings.metrics_port,
        host=settings.metrics_host,
        liveness_redis_timeout_s=settings.liveness_redis_timeout_s,
        liveness_wedge_timeout_s=settings.liveness_wedge_timeout_s,
        otlp_endpoint=settings.otlp_endpoint,
        service_name=settings.otel_service_name,
    )
    # SCHEDULER_IS_ENABLED, SCHEDULE_<NAME>_IS_ENABLED, RUNNER_<NAME>_IS_ENABLED: set on the
    # app here, so every worker process (a supervisor's children too) obeys them.
    apply_app_config(settings, app)
    url = await asyncio.to_thread(resolve_redis_url, settings)
    manager = WorkerManager(
        redis_url=url,
        cluster=settings.redis_cluster,
        tls=settings.redis_tls,
        prefix=settings.redis_prefix,
        group=settings.worker_group,
        hooks=build_hooks(obs_config),
        allow_unsafe_eviction=settings.allow_unsafe_eviction,
        refuse_incompatible_contract=settings.refuse_incompatible_contract,
    )
    manager.register_app(app, queues=settings.queues,
                         overrides=worker_overrides(settings, app))
    try:
        await manager.start()
    except BaseException:
        # The start error is the one to report; closing workers that never ran may fail
        # too, and the process exits right after.
        with contextlib.suppress(Exception):
            await manager.close_workers()
        raise
    shutdown.workers = list(manager.workers)
    server = None
    dashboard = None
    try:
        server = await _serve(manager, obs_config)
        dashboard = await start_dashboard(settings, app, url)
        if ready is not None:
            ready(server.port)
        _log.info("consuming", extra={"queues": list(settings.queues),
                                      "prefix": settings.redis_prefix,
                                      "group": settings.worker_group,
                                      "consumer": manager.consumer,
                                      "event_loop": loop_name(loop),
                                      "metrics_port": server.port})
        await stop.wait()
    finally:
        if dashboard is not None:
            await dashboard.close()
        if server is not None:
            await server.close()
        await manager.close_workers()
        # Per-job figures wait up to 50 ms on the loop before they reach the metrics (in
        # multiprocess mode, the files the parent serves): write the last ones before exit.
        flush_metrics(manager.hooks)
        _log.info("stopped")
    return EXIT_OK


async def _serve(manager: WorkerManager, config: ObservabilityConfig) -> ObservabilityServer:
    try:
        return await start(manager, config)
    except OSError as exc:  # the port is taken, or the address is not this host's
        raise ConfigurationError(
            f"METRICS_PORT: cannot serve /metrics on {config.host}:{config.metrics_port}: "
            f"{exc} (METRICS_HOST, METRICS_PORT)"
        ) from exc


def main(
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] = (),
    *,
    shutdown: Shutdown | None = None,
) -> int:
    """Parse the arguments and the environment, then run; the process's exit code.

    The only arguments are ``-h`` / ``--help``; anything else is refused (exit 2).
    """
    unknown = [a for a in argv if a not in _HELP]
    if unknown:
        print(f"python -m worker: unknown argument {unknown[0]!r}: the worker takes no "
              "arguments, only environment variables (python -m worker --help lists them)",
              file=sys.stderr)
        return EXIT_USAGE
    if argv:
        print(usage(), end="")
        return EXIT_OK
    env = os.environ if env is None else env
    try:
        settings, app = load_settings(env)
    except SettingsError as exc:
        if isinstance(exc, AppImportError):
            print(exc.user_traceback(), file=sys.stderr)
        print(f"python -m worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.log_format, settings.log_level)
    if settings.processes > 1:
        from worker.supervisor import supervise

        return supervise(settings, app, env)
    shutdown = shutdown if shutdown is not None else Shutdown()
    return run_loop(settings, lambda: run(settings, app, shutdown=shutdown), shutdown)


def run_loop(
    settings: Settings,
    main_coro: Callable[[], Coroutine[Any, Any, int]],
    shutdown: Shutdown,
) -> int:
    """Run ``main_coro()`` on the event loop ``WORKER_EVENT_LOOP`` chose; its exit code, or
    the code of the error it raised (logged in one line)."""
    runner = asyncio.Runner(loop_factory=loop_factory(settings.event_loop))
    try:
        return runner.run(main_coro())
    except asyncio.CancelledError:
        return EXIT_FAILED
    except Exception as exc:
        return _report(exc, settings)
    finally:
        # After a second signal, stop at once: closing the runner would cancel every task
        # left and wait for each to finish, which is the wait that signal asked to skip.
        if not shutdown.forced:
            runner.close()


def _report(exc: Exception, settings: Settings) -> int:
    """Log what ``exc`` means in one line (with a traceback only when unexpected); its code."""
    failure = explain(exc, settings)
    extra = {"error_type": type(exc).__name__}
    if failure.variable is not None:
        extra["variable"] = failure.variable
    if failure.cause is not None:
        # Where the user's code failed, then the one line saying so, last.
        _log.error("the traceback of %s", failure.subject, exc_info=failure.cause,
                   extra={**extra, "error_type": type(failure.cause).__name__})
        _log.error("%s", failure.message, extra=extra)
    elif failure.unexpected:
        _log.exception("%s", failure.message, extra=extra)
    elif failure.code == EXIT_USAGE:
        _log.error("cannot start: %s", failure.message, extra=extra)
    else:
        _log.error("%s", failure.message, extra=extra)
    return failure.code


def exit_process(code: int, shutdown: Shutdown) -> None:
    """Exit with ``code``, without waiting for what cannot be waited for.

    A sync processor's thread cannot be stopped, and interpreter exit would wait for it,
    maybe forever; after a second signal the tasks left on the loop are not waited for either.
    Whether a stuck thread's job was handed back is what the shutdown confirmed: a graceful
    one releases it; a forced one, or one that could not reach Redis, leaves it pending until
    its lock expires and another worker reclaims it.
    """
    stuck = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if stuck:
        held = shutdown.unreleased()
        _log.warning(
            f"exiting with processor threads still running; {_fate(held)}",
            extra={"threads": stuck, "unreleased": held, "forced": shutdown.forced},
        )
    if stuck or shutdown.forced:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _fate(held: int | None) -> str:
    """What became of the jobs of threads still running, given how many are still held."""
    if held == 0:
        return "their jobs were released"
    if held is None:
        return ("any job not released stays pending and another worker reclaims it once its "
                "lock expires")
    return (f"{held} job(s) were not released: they stay pending and another worker reclaims "
            "them once their lock expires")


if __name__ == "__main__":
    _last = Shutdown()
    exit_process(main(argv=sys.argv[1:], shutdown=_last), _last)
