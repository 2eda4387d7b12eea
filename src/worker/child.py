"""One worker process under the supervisor of ``python -m worker`` (``WORKER_PROCESSES`` > 1).

The supervisor starts it as ``python -m worker.child <slot> <report-fd> <supervisor-pid>``
with the supervisor's environment plus ``PROMETHEUS_MULTIPROC_DIR``; it is not meant to be
started by hand. It is a complete worker, exactly as ``python -m worker`` with one process
(its own consumer name, graceful SIGTERM/SIGINT, a second signal stops at once), except that:

- it serves ``/metrics``, ``/healthz`` and ``/readyz`` on a free loopback port (when
  ``METRICS_PORT`` is set), which the supervisor reads to answer for every process;
- once consuming it writes ``{"port": <port or null>}`` and a newline to ``report-fd`` and
  closes it: that line is how the supervisor knows it started;
- every log record carries ``worker_process`` (its slot, 0..N-1);
- when the supervisor is gone (it was killed), it shuts down gracefully on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from streamq.app import App
from worker.__main__ import Shutdown, exit_process, run, run_loop
from worker.failures import EXIT_USAGE
from worker.logs import configure_logging
from worker.settings import AppImportError, Settings, SettingsError, load_settings

__all__ = ["main"]

_log = logging.getLogger("streamq.worker.main")
PARENT_CHECK_S = 0.5


class _SlotFilter(logging.Filter):
    def __init__(self, slot: int) -> None:
        super().__init__()
        self.slot = slot

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker_process = self.slot
        return True


class _Report:
    """Tells the supervisor, once, that this process consumes and where its health is."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def __call__(self, port: int | None) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        # A supervisor that died meanwhile closed its end: the watch below notices it.
        with contextlib.suppress(OSError):
            os.write(fd, json.dumps({"port": port}).encode() + b"\n")
        with contextlib.suppress(OSError):
            os.close(fd)


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    # No event says "the parent died" portably: once it has, this process's parent changes.
    while True:
        await asyncio.sleep(PARENT_CHECK_S)
        if os.getppid() != parent_pid:
            break
    _log.warning("the supervisor is gone: shutting down gracefully",
                 extra={"supervisor_pid": parent_pid})
    stop.set()


async def _child(
    settings: Settings, app: App, shutdown: Shutdown, report: _Report, parent_pid: int
) -> int:
    stop = asyncio.Event()
    watch = asyncio.create_task(_watch_parent(parent_pid, stop), name="streamq-parent-watch")
    try:
        return await run(settings, app, stop=stop, shutdown=shutdown, ready=report)
    finally:
        watch.cancel()


def _arguments(argv: Sequence[str]) -> tuple[int, int, int] | None:
    if len(argv) != 3 or not all(a.isdigit() for a in argv):
        return None
    return int(argv[0]), int(argv[1]), int(argv[2])


def main(env: Mapping[str, str], argv: Sequence[str], shutdown: Shutdown) -> int:
    """Run one worker process for the supervisor; the process's exit code."""
    args = _arguments(argv)
    if args is None:
        print("python -m worker.child is started by python -m worker when WORKER_PROCESSES "
              "> 1; run python -m worker instead", file=sys.stderr)
        return EXIT_USAGE
    slot, report_fd, parent_pid = args
    report = _Report(report_fd)
    try:
        settings, app = load_settings(env)
    except SettingsError as exc:
        if isinstance(exc, AppImportError):
            print(exc.user_traceback(), file=sys.stderr)
        print(f"python -m worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.log_format, settings.log_level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_SlotFilter(slot))
    settings = dataclasses.replace(
        settings,
        processes=1,
        metrics_host="127.0.0.1",
        metrics_port=None if settings.metrics_port is None else 0,
        dashboard_enabled=False,  # the supervisor serves it for the whole fleet
    )
    return run_loop(settings, lambda: _child(settings, app, shutdown, report, parent_pid),
                    shutdown)


if __name__ == "__main__":
    _last = Shutdown()
    exit_process(main(os.environ, sys.argv[1:], _last), _last)
