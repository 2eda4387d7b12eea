"""How the supervisor launches a worker process and hears from it: the supervisor's half of
the protocol whose other half is :mod:`worker.child`.

A worker process is ``python -m worker.child <slot> <report-fd> <supervisor-pid>`` in a
process group of its own, with the supervisor's environment plus the multiprocess metrics
directory. Once it consumes it writes one line, ``{"port": <port or null>}``, to the report
pipe; a pipe that closes without that line means it ended before it started.

Example::

    with metrics_dir(enabled=True) as path:
        proc, report = await launch(0, child_env(os.environ, path))
        started = await read_report(report)      # None: it ended first
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Started", "child_env", "describe_exit", "launch", "metrics_dir", "read_report"]


@dataclass(frozen=True, slots=True)
class Started:
    """What a worker process reported once it consumed: its health port (None when it
    serves nothing)."""

    port: int | None


@contextlib.contextmanager
def metrics_dir(*, enabled: bool) -> Iterator[Path | None]:
    """A fresh, empty multiprocess metrics directory, removed at exit; None when nothing
    serves metrics or prometheus-client is not installed."""
    if not enabled or importlib.util.find_spec("prometheus_client") is None:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="streamq-metrics-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def child_env(env: Mapping[str, str], metrics: Path | None) -> dict[str, str]:
    """The environment of every worker process: ``env`` with ``PROMETHEUS_MULTIPROC_DIR``
    pointing at ``metrics`` (replacing any value given, in either spelling)."""
    out = {k: v for k, v in env.items() if k.lower() != "prometheus_multiproc_dir"}
    if metrics is not None:
        out["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
    return out


async def launch(slot: int, env: Mapping[str, str]) -> tuple[asyncio.subprocess.Process, int]:
    """Start the worker process of ``slot``: the process and the read end of its report pipe.

    Raises:
        OSError: the process could not be started (no file descriptor or process left).
    """
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "worker.child", str(slot), str(write_fd), str(os.getpid()),
            env=dict(env), stdin=subprocess.DEVNULL, pass_fds=(write_fd,),
            # Its own group: a Ctrl-C at a terminal reaches it once, through the supervisor.
            process_group=0,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return proc, read_fd


async def read_report(fd: int) -> Started | None:
    """Wait for the report line on ``fd`` (closed afterwards); None when the process ended
    without one."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        line = await reader.readline()
    finally:
        transport.close()
    if not line:
        return None
    try:
        port = json.loads(line).get("port")
    except (ValueError, AttributeError):
        port = None
    return Started(port if isinstance(port, int) else None)


def describe_exit(code: int) -> str:
    """How a process ended, from its return code: ``exited with code 1``, ``was killed by
    SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
