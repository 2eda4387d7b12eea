"""Supervision: no long-lived task of a worker dies silently.

Every loop of a lane (readers, dispatcher, settler, promoter, reclaimer, heartbeat) runs under
a :class:`Supervisor`. When one raises, the supervisor sorts the error:

* a Redis outage (connection lost, or a transient refusal: ``READONLY``, ``NOREPLICAS``,
  ``LOADING``, ``BUSY``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``MASTERDOWN``; or OOM) is reported
  to :class:`RedisStatus`, which logs the outage once when it starts and once when it ends;
* a permanent refusal (``NOPERM``, ``WRONGTYPE``, a script that cannot be loaded) is logged
  at ERROR with what to fix, and makes health fail at once;
* anything else is a bug: logged at ERROR with the task's name and traceback, counted
  (``task_crashed``).

In every case the task is restarted after a capped, jittered backoff, and every error is
counted as a Redis error where it is one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from streamq._redis import map_error, refusal_code
from streamq.errors import ConfigurationError, RedisOutOfMemory, RedisRefused, RedisUnavailable
from streamq.hooks import Hooks

__all__ = ["RedisStatus", "Supervisor"]

_log = logging.getLogger("streamq.worker")

MAX_BACKOFF_S = 5.0
"""The longest wait before a crashed task is restarted."""


class RedisStatus:
    """Redis reachability and refusals as the runtime saw them (one per manager).

    Logs an outage once when it starts and once when it ends, with its duration; keeps the
    last permanent refusal so health can fail at once and say what to fix.
    """

    def __init__(self, hooks: Hooks, clock: Callable[[], float] = time.monotonic) -> None:
        self.hooks = hooks
        self.clock = clock
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.refusal: str | None = None
        self.refused_at: float | None = None
        self.outages = 0

    def error(self, queue: str | None, exc: BaseException, *, task: str = "") -> None:
        """Count and classify a failed Redis call (an outage, or a permanent refusal)."""
        self.hooks.redis_error(queue, exc)
        mapped = map_error(exc, queue=queue)
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if isinstance(mapped, RedisRefused):
            self._refused(queue, task, exc)
            return
        if self.down_since is None:
            self.down_since = self.clock()
            self.outages += 1
            _log.warning(
                "Redis outage: calls are failing; the worker retries with backoff",
                extra={"queue": queue, "task": task, "error": self.last_error},
            )

    def _refused(self, queue: str | None, task: str, exc: BaseException) -> None:
        code = refusal_code(exc) or "ERR"
        message = f"{code}: {exc}"[:300]
        if message != self.refusal:
            _log.error(
                "Redis refused a call in a way retrying cannot fix; %s",
                _what_to_fix(code),
                extra={"queue": queue, "task": task, "error": message},
            )
        self.refusal = message
        self.refused_at = self.clock()

    def misconfigured(self, queue: str | None, task: str, exc: BaseException) -> None:
        """A setup problem found while running; logged at ERROR, and health fails."""
        message = str(exc)[:500]
        if message != self.refusal:
            _log.error("the worker found a configuration problem: %s", message,
                       extra={"queue": queue, "task": task})
        self.refusal = message
        self.refused_at = self.clock()

    def ok(self) -> None:
        """A call went through: an outage in progress has ended."""
        if self.down_since is not None:
            lasted = self.clock() - self.down_since
            self.down_since = None
            _log.warning("Redis outage ended", extra={"duration_s": round(lasted, 3)})
        if self.refusal is not None and self.refused_at is not None and (
            self.clock() - self.refused_at > 2 * MAX_BACKOFF_S
        ):
            # The same calls have gone through again for a while: the refusal was fixed.
            _log.warning("Redis accepts the calls it refused again",
                         extra={"error": self.refusal})
            self.refusal = None

    def unreachable_for(self) -> float:
        return 0.0 if self.down_since is None else self.clock() - self.down_since


def _what_to_fix(code: str) -> str:
    if code == "NOPERM":
        return ("the Redis user lacks a command or key pattern streamq needs: grant the "
                "stream, hash, zset, script (EVALSHA, SCRIPT LOAD) commands on the prefix's keys")
    if code == "WRONGTYPE":
        return "a queue key holds another type of value: another application uses the prefix"
    if code == "NOSCRIPT":
        return "the scripts cannot be loaded (SCRIPT LOAD refused or flushed continuously)"
    if code in ("NOAUTH", "WRONGPASS"):
        return "the credentials in the Redis URL are missing or wrong"
    return "see the error"


class Supervisor:
    """Runs a lane's loops and restarts any that raises (see the module doc)."""

    def __init__(self, queue: str, hooks: Hooks, status: RedisStatus) -> None:
        self.queue = queue
        self.hooks = hooks
        self.status = status
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.crashes: dict[str, int] = {}

    def spawn(self, name: str, run: Callable[[], Awaitable[Any]]) -> asyncio.Task[None]:
        """Start ``run()`` as the task ``name``; restart it whenever it raises.

        A ``run()`` that returns ends the task (its loop saw the lane closing).
        """
        task = asyncio.get_running_loop().create_task(
            self._guard(name, run), name=f"{name}-{self.queue}"
        )
        self.tasks[name] = task
        return task

    async def _guard(self, name: str, run: Callable[[], Awaitable[Any]]) -> None:
        delay = 0.05
        while True:
            began = time.monotonic()
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._report(name, exc)
            if time.monotonic() - began > 10 * MAX_BACKOFF_S:
                delay = 0.05  # it ran fine for a while: this is a new failure, not a loop
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, MAX_BACKOFF_S)

    def _report(self, name: str, exc: Exception) -> None:
        if isinstance(exc, ConfigurationError):
            # Found while running (a consumer group added beside ours): nothing a restart
            # fixes; health fails until it is.
            self.status.misconfigured(self.queue, name, exc)
            return
        mapped = map_error(exc, queue=self.queue)
        if isinstance(mapped, RedisUnavailable | RedisOutOfMemory | RedisRefused):
            self.status.error(self.queue, exc, task=name)
            return
        self.crashes[name] = self.crashes.get(name, 0) + 1
        self.hooks.task_crashed(self.queue, name)
        _log.error(
            "worker task %r crashed; restarting it", name,
            exc_info=exc, extra={"queue": self.queue, "task": name},
        )
