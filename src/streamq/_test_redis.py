"""A Redis for tests: a real ``redis-server`` when one can be found, else fakeredis.

fakeredis runs streamq's Lua scripts (with ``lupa``), consumer groups, blocking reads and
``XAUTOCLAIM``, so the queue's behaviour (add, process, retry, delay, dead letters, dedup,
pause) is the same on both; streamq's own suite runs one set of behavioural tests on each to
prove it. What fakeredis cannot do is listed in :data:`FAKE_LIMITS`: the commands it does not
know fail on their own ("unknown command"), and the ones it would accept without doing what
they say (``CLIENT PAUSE``, ``SAVE``...) are refused by the fake served here, with a message
naming the limit, instead of silently behaving differently.

Example::

    redis = start_test_redis("auto")      # "real", "fake" or "auto" (real when available)
    try:
        redis.require("memory_limits")    # ConfigurationError on the fake
        ...                               # redis.url
    finally:
        redis.stop()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from streamq.errors import ConfigurationError

__all__ = [
    "FAKE_LIMITS",
    "REFUSED_COMMANDS",
    "FakeRedisServer",
    "TestRedis",
    "start_test_redis",
]

Kind = Literal["real", "fake"]

FAKE_LIMITS: dict[str, str] = {
    "memory_limits": "maxmemory and out-of-memory refusals: fakeredis keeps no memory account "
    "(CONFIG, MEMORY and OBJECT are unknown commands)",
    "server_config": "CONFIG GET/SET and INFO are unknown commands (the worker's check of "
    "maxmemory-policy is then skipped with a warning)",
    "persistence": "AOF, RDB and restarts: nothing is written to disk and the server cannot "
    "be restarted (SAVE and BGSAVE are refused, SHUTDOWN and DEBUG are unknown)",
    "client_control": "CLIENT KILL, CLIENT PAUSE and CLIENT NO-EVICT: fakeredis accepts them "
    "without effect, so they are refused",
    "cluster": "Redis Cluster: fakeredis is a single node (CLUSTER is unknown)",
    "replication": "replicas, WAIT, REPLICAOF and failover are unknown",
}
"""What a test cannot do on the fake, by name (the names :meth:`TestRedis.require` takes)."""

REFUSED_COMMANDS: dict[str, str] = {
    "client kill": "client_control",
    "client pause": "client_control",
    "client unpause": "client_control",
    "client no-evict": "client_control",
    "save": "persistence",
    "bgsave": "persistence",
    "lastsave": "persistence",
}
"""Commands fakeredis would accept without doing what they say: the fake refuses them."""


def _refusal(command: str, limit: str) -> str:
    return (
        f"ERR {command.upper()} is refused by streamq's fake Redis: {FAKE_LIMITS[limit]}; "
        "run this test on a real redis-server"
    )


class FakeRedisServer:
    """fakeredis served over TCP on a free loopback port (a thread of this process), so
    producers and workers reach it by URL like any Redis.

    Raises:
        ConfigurationError: (at :meth:`start`) fakeredis or lupa is not installed.
    """

    def __init__(self) -> None:
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise ConfigurationError("the fake Redis is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FakeRedisServer:
        try:
            import lupa  # noqa: F401 - fakeredis runs Lua scripts only with it
            from fakeredis import TcpFakeServer
        except ImportError as exc:
            raise ConfigurationError(
                f"the fake Redis needs fakeredis and lupa ({exc}): pip install "
                "'streamq[testing]', or install redis-server to test on a real one"
            ) from exc

        server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
        base: Any = server.RequestHandlerClass

        class Handler(base):  # type: ignore[misc]
            def setup(self) -> None:
                super().setup()
                _refuse_commands(self.current_client.get_socket())

        server.RequestHandlerClass = Handler
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05},
            name="streamq-fake-redis", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = None


def _refuse_commands(sock: Any) -> None:
    """Make ``sock`` (a fakeredis socket) answer :data:`REFUSED_COMMANDS` with an error."""
    from fakeredis._helpers import SimpleError

    lookup: Callable[[str], Any] = sock._name_to_func

    def name_to_func(cmd: str) -> Any:
        limit = REFUSED_COMMANDS.get(cmd.lower())
        if limit is not None:
            raise SimpleError(_refusal(cmd, limit))
        return lookup(cmd)

    sock._name_to_func = name_to_func


@dataclass
class TestRedis:
    """A Redis started for tests.

    Attributes:
        kind: ``real`` (a ``redis-server``) or ``fake`` (fakeredis).
        url: ``redis://127.0.0.1:<port>/0``.
        port: its port.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    kind: Kind
    url: str
    port: int
    _stop: Callable[[], None] = field(repr=False)

    def supports(self, feature: str) -> bool:
        """Whether ``feature`` (a key of :data:`FAKE_LIMITS`) works here.

        Raises:
            ConfigurationError: ``feature`` is not one of them.
        """
        if feature not in FAKE_LIMITS:
            raise ConfigurationError(
                f"unknown Redis feature {feature!r}; known: {', '.join(sorted(FAKE_LIMITS))}"
            )
        return self.kind == "real"

    def require(self, *features: str) -> None:
        """Refuse to go on without ``features``.

        Raises:
            ConfigurationError: this is the fake and cannot do them (the message says why).
        """
        missing = [f for f in features if not self.supports(f)]
        if missing:
            raise ConfigurationError(
                "this test needs a real redis-server; fakeredis cannot do: "
                + "; ".join(f"{f} ({FAKE_LIMITS[f]})" for f in missing)
            )

    def stop(self) -> None:
        self._stop()


def start_test_redis(kind: Literal["auto", "real", "fake"] = "auto") -> TestRedis:
    """Start a Redis for tests: ``real`` (a ``redis-server`` from ``PATH`` or the
    ``embedded`` extra, on a free loopback port, ``maxmemory-policy noeviction``), ``fake``
    (fakeredis over TCP), or ``auto``: real when a binary is found, else fake.

    Raises:
        ConfigurationError: ``real`` without a binary, ``fake`` without fakeredis and lupa,
            or an unknown ``kind``.
    """
    from streamq.testing import RedisServer, find_binary

    if kind not in ("auto", "real", "fake"):
        raise ConfigurationError(f"unknown test Redis kind {kind!r}: use auto, real or fake")
    binary = find_binary() if kind != "fake" else None
    if binary is not None:
        server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
        return TestRedis("real", server.url, server.port, lambda: server.stop(kill=True))
    if kind == "real":
        raise ConfigurationError(
            "no redis-server found for a real test Redis: install redis-server, or the "
            "'embedded' extra (pip install 'streamq[embedded]')"
        )
    fake = FakeRedisServer().start()
    return TestRedis("fake", fake.url, fake.port, fake.stop)
