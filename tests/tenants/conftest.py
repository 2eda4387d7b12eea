"""Fixtures of the tenant tests: the runtime tests' in-process managers."""

from __future__ import annotations

from tests.runtime.conftest import managers

__all__ = ["managers"]
