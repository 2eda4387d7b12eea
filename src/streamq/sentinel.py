"""Redis Sentinel: one URL naming the sentinels and the service, clients that follow the
primary through a failover.

The URL form::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

``user`` and ``password`` are the primary's (the sentinels are reached without them; put
``sentinel_password`` in the query string when the sentinels need one). The clients are
redis-py's Sentinel-managed clients (``Sentinel(...).master_for(service)``): every new
connection asks the sentinels where the primary is now, so after a failover a call fails
once as an outage (connection lost, or ``READONLY`` from the demoted node) and the next one
reaches the promoted replica. streamq's producers and workers treat that failure like any
other outage: the worker retries with backoff, a producer raises ``RedisUnavailable``.

Example::

    target = SentinelURL.parse("redis+sentinel://s1:26379,s2:26379,s3:26379/jobs/0")
    queue = Queue(Ingestion, target.async_client())
    manager = WorkerManager(redis_url="redis+sentinel://s1:26379,s2:26379/jobs/0")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from streamq.errors import ConfigurationError

__all__ = ["SCHEME", "SentinelURL"]

SCHEME = "redis+sentinel"
FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]"
_OPTIONS = frozenset({"sentinel_password", "sentinel_username"})


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """Where the sentinels are and which service (primary) they watch.

    Build one with :meth:`parse`; :meth:`async_client` and :meth:`sync_client` give clients
    of the current primary that find the new one after a failover.
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    @staticmethod
    def matches(url: str) -> bool:
        """True when ``url`` is a ``redis+sentinel://`` URL."""
        return url.strip().lower().startswith(SCHEME + "://")

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """Read a ``redis+sentinel://`` URL.

        Raises:
            ConfigurationError: the reason, naming the part at fault (never the password).
        """
        raw = url.strip()
        if not cls.matches(raw):
            raise ConfigurationError(f"a Sentinel URL must start with {SCHEME}://; "
                                     f"expected {FORM}")
        parts = urlsplit(raw)
        creds, _, hosts = parts.netloc.rpartition("@")
        username, _, password = creds.partition(":") if creds else ("", "", "")
        sentinels = tuple(_host_port(h) for h in hosts.split(","))
        path = [p for p in unquote(parts.path).split("/") if p]
        if not path:
            raise ConfigurationError(f"the Sentinel URL names no service; expected {FORM}")
        if len(path) > 2:
            raise ConfigurationError(
                f"the Sentinel URL path has {len(path)} parts; expected /service_name[/db]"
            )
        db = 0
        if len(path) == 2:
            if not path[1].isdigit():
                raise ConfigurationError(
                    f"the database index must be a whole number >= 0, got {path[1]!r}"
                )
            db = int(path[1])
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - _OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {', '.join(unknown)} in the Sentinel URL; known: "
                f"{', '.join(sorted(_OPTIONS))}"
            )
        return cls(
            sentinels=sentinels,
            service=path[0],
            db=db,
            username=unquote(username) or None,
            password=unquote(password) or None,
            sentinel_username=_first(query, "sentinel_username"),
            sentinel_password=_first(query, "sentinel_password"),
        )

    def where(self) -> str:
        """The URL without credentials, for messages and logs."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"{SCHEME}://{hosts}/{self.service}/{self.db}"

    def _sentinel_kwargs(self) -> dict[str, Any]:
        # A sentinel answers at once or is down: short timeouts, so a dead sentinel costs a
        # look-up little before the next one is asked.
        out: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
        if self.sentinel_username:
            out["username"] = self.sentinel_username
        if self.sentinel_password:
            out["password"] = self.sentinel_password
        return out

    def _primary_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        out = dict(kwargs)
        out["db"] = self.db
        if self.username:
            out["username"] = self.username
        if self.password:
            out["password"] = self.password
        return out

    def async_client(self, **kwargs: Any) -> aioredis.Redis:
        """A ``redis.asyncio.Redis`` of the service's current primary; ``kwargs`` go to its
        connections (``socket_timeout``, ``health_check_interval``...)."""
        sentinel = AsyncSentinel(  # type: ignore[no-untyped-call]
            list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs()
        )
        client: aioredis.Redis = sentinel.master_for(
            self.service, **self._primary_kwargs(kwargs)
        )
        return client

    def sync_client(self, **kwargs: Any) -> redis.Redis:
        """The synchronous twin of :meth:`async_client`."""
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs()
        )
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            self.service, **self._primary_kwargs(kwargs)
        )
        return client


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = text.strip(), "26379"
    host = host.strip("[]")
    if not host:
        raise ConfigurationError(f"a sentinel address has no host; expected {FORM}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"sentinel {host!r} has an invalid port {port!r}; expected an integer 1..65535"
        )
    return host, int(port)
