"""Fixtures of the job-control tests: the runtime tests' in-process managers (closed and
their keys removed after each test) on the session's own redis-server."""

from __future__ import annotations

from tests.runtime.conftest import managers

__all__ = ["managers"]
