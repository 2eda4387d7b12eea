"""The plugin's fixtures, run on a real redis-server and on fakeredis: every test here that
uses ``streamq_redis`` runs once on each, so the fake is proven by the same tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from streamq.errors import ConfigurationError
from streamq.testing import TestRedis, start_test_redis


@pytest.fixture(scope="session", params=["real", "fake"])
def streamq_redis_server(request: pytest.FixtureRequest) -> Iterator[TestRedis]:
    try:
        server = start_test_redis(request.param)
    except ConfigurationError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    yield server
    server.stop()
