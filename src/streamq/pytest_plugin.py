"""streamq's pytest plugin: a Redis for the test session, a worker that runs an app until
idle, queues and hand-made jobs. Installed with streamq (entry point ``pytest11``); nothing
starts unless a test uses one of its fixtures.

Fixtures (all prefixed ``streamq_`` so they never clash with an application's own):

- ``streamq_redis_server`` (session): a :class:`~streamq.testing.TestRedis`, a real
  ``redis-server`` when one is found, else fakeredis (``--streamq-redis=auto|real|fake``,
  or the ``streamq_redis`` ini option). Override it to choose per directory.
- ``streamq_redis``: the session's Redis seen by one test: ``url``, ``kind``, a key
  ``prefix`` of its own (tests never see each other's keys), ``require(...)``,
  ``sync_client()``.
- ``streamq_queue``: ``streamq_queue(Contract)`` is a :class:`~streamq.SyncQueue` on the
  test's Redis and prefix (usable from sync and async tests).
- ``streamq_worker``: ``await streamq_worker.run(app)`` (or ``run_sync``) runs the app's
  processors until every queue is idle and returns a :class:`~streamq.testing.RunReport`.
- ``streamq_job``: :func:`~streamq.testing.make_job`, for a processor with no Redis at all.

``@pytest.mark.streamq_needs("memory_limits", ...)`` refuses to run a test on the fake
(it fails, naming what fakeredis cannot do) instead of letting it behave differently.

Example::

    async def test_ingest(streamq_queue, streamq_worker):
        streamq_queue(Ingestion).add(Ingestion.ingest_event, IngestEvent(event_id="e1"))
        report = await streamq_worker.run(app)
        assert report.completed == 1
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from streamq.app import App
    from streamq.contracts import QueueContract
    from streamq.producer import SyncQueue
    from streamq.testing import RunReport, TestRedis

__all__ = ["StreamqRedis", "StreamqWorker"]

_KINDS = ("auto", "real", "fake")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamq")
    group.addoption(
        "--streamq-redis",
        choices=_KINDS,
        default=None,
        help="the Redis of streamq's fixtures: real (a redis-server), fake (fakeredis) or "
        "auto (real when a redis-server is found; the default)",
    )
    parser.addini("streamq_redis", "default for --streamq-redis: auto, real or fake",
                  default="auto")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "streamq_needs(*features): the test needs Redis features fakeredis lacks "
        "(memory_limits, server_config, persistence, client_control, cluster, replication); "
        "on the fake it fails saying so",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"streamq fixtures: --streamq-redis={_kind(config)}"


class StreamqRedis:
    """The session's Redis as one test sees it, with a key prefix of the test's own."""

    def __init__(self, server: TestRedis, prefix: str) -> None:
        self.server = server
        self.prefix = prefix
        self._clients: list[Any] = []

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def kind(self) -> str:
        """``real`` or ``fake``."""
        return self.server.kind

    def require(self, *features: str) -> None:
        """Fail the test, saying why, when this Redis cannot do ``features``."""
        from streamq.errors import ConfigurationError

        try:
            self.server.require(*features)
        except ConfigurationError as exc:
            pytest.fail(str(exc), pytrace=False)

    def sync_client(self) -> Any:
        """A ``redis.Redis`` on this Redis, closed after the test."""
        import redis

        client = redis.Redis.from_url(self.url)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()


class StreamqWorker:
    """Runs an app's processors on the test's Redis and prefix until every queue is idle."""

    def __init__(self, redis: StreamqRedis) -> None:
        self.redis = redis

    async def run(
        self,
        app: App[Any],
        *,
        queues: Iterable[str] | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        timeout_s: float = 10.0,
    ) -> RunReport:
        """Start a worker for ``app``, process until idle, stop; what happened.

        Raises:
            TimeoutError: not idle within ``timeout_s`` (the message says what is left).
        """
        from streamq.testing import run_app_until_idle

        return await run_app_until_idle(
            app, redis_url=self.redis.url, prefix=self.redis.prefix, queues=queues,
            overrides=overrides, timeout_s=timeout_s,
        )

    def run_sync(self, app: App[Any], **kwargs: Any) -> RunReport:
        """:meth:`run` from a sync test (on an event loop of its own)."""
        return asyncio.run(self.run(app, **kwargs))


def _kind(config: pytest.Config) -> str:
    given = config.getoption("--streamq-redis") or config.getini("streamq_redis") or "auto"
    if given not in _KINDS:
        raise pytest.UsageError(f"streamq_redis = {given!r}: use one of {', '.join(_KINDS)}")
    return str(given)


@pytest.fixture(scope="session")
def streamq_redis_server(request: pytest.FixtureRequest) -> Iterator[TestRedis]:
    """A Redis for the session: real when a ``redis-server`` is found, else fakeredis."""
    from streamq.errors import ConfigurationError
    from streamq.testing import start_test_redis

    try:
        server = start_test_redis(_kind(request.config))  # type: ignore[arg-type]
    except ConfigurationError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def streamq_redis(
    streamq_redis_server: TestRedis, request: pytest.FixtureRequest
) -> Iterator[StreamqRedis]:
    """The session's Redis with a key prefix of this test's own."""
    handle = StreamqRedis(streamq_redis_server, f"t{uuid.uuid4().hex[:12]}")
    for mark in request.node.iter_markers("streamq_needs"):
        handle.require(*mark.args)
    yield handle
    handle.close()


@pytest.fixture
def streamq_queue(
    streamq_redis: StreamqRedis,
) -> Callable[[type[QueueContract]], SyncQueue[Any]]:
    """``streamq_queue(Contract)``: a producer on the test's Redis and prefix."""
    from streamq.producer import SyncQueue

    def make(contract: type[QueueContract]) -> SyncQueue[Any]:
        return SyncQueue(contract, streamq_redis.sync_client(), prefix=streamq_redis.prefix)

    return make


@pytest.fixture
def streamq_worker(streamq_redis: StreamqRedis) -> StreamqWorker:
    """``await streamq_worker.run(app)``: process until idle; a RunReport."""
    return StreamqWorker(streamq_redis)


@pytest.fixture
def streamq_job() -> Callable[..., Any]:
    """:func:`streamq.testing.make_job`: a Job for a processor, with no Redis at all."""
    from streamq.testing import make_job

    return make_job
