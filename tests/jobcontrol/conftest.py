"""Fixtures of the job-control tests: the runtime tests' in-process managers (closed and
their keys removed after each test) and the chaos tests' worker processes, on the session's
own redis-server."""

from __future__ import annotations

from tests.chaos.conftest import queue, workers
from tests.runtime.conftest import managers

__all__ = ["managers", "queue", "workers"]
