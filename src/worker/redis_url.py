"""Checking ``REDIS_URL`` before anything connects.

redis-py misreads some URLs instead of refusing them: ``redis://host:6379/abc`` silently uses
database 0, ``redis://:6379`` connects to localhost, ``?foo=1`` fails as a ``TypeError`` deep
inside the first connection, and ``localhost:6379`` ends in a traceback. Each of these is a
one-line reason here. Reasons never repeat the URL itself: it may carry a password.

Example::

    check_redis_url("redis://localhost:6379/abc", cluster=False)
    # ValueError: the database index must be a whole number >= 0 (the path after the port), ...
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

import redis

from streamq.errors import ConfigurationError
from streamq.sentinel import SCHEME as SENTINEL_SCHEME
from streamq.sentinel import SentinelURL

__all__ = ["check_redis_url", "database", "location"]

SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
FORMS = ("redis://[[user]:password@]host[:port][/db], rediss://..., unix:///path/to/redis.sock "
         "or redis+sentinel://host:port[,host:port...]/service_name[/db]")
_DB_PATH = re.compile(r"^/?(?P<db>[^/]*)/?$")
_UNEXPECTED = re.compile(r"unexpected keyword argument '(?P<name>[^']+)'")


def check_redis_url(raw: str, *, cluster: bool) -> str:
    """``raw`` stripped, when redis-py will read it as written and ``cluster`` can use it.

    Raises:
        ValueError: the reason, naming the part at fault but never the whole URL.
    """
    url = raw.strip()
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"has no scheme; expected {FORMS}{_hint(url)}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(SCHEMES)}; "
                         f"expected {FORMS}")
    if scheme == SENTINEL_SCHEME:
        return _check_sentinel(url, cluster=cluster)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket
        raise ValueError(f"is not a valid URL ({exc}); expected {FORMS}") from None
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"has an invalid port {_port_text(url)!r}; expected an integer "
                         "1..65535") from None
    if scheme == "unix":
        if cluster:
            raise ValueError("REDIS_CLUSTER=true needs a redis:// or rediss:// URL of a "
                             "cluster node, not a unix socket")
        if not parts.path:
            raise ValueError("unix:// needs the socket's path, e.g. unix:///run/redis.sock")
    else:
        if not parts.hostname:
            raise ValueError(f"has no host; expected {FORMS}")
        if port == 0:
            raise ValueError("has an invalid port 0; expected an integer 1..65535")
    db = _database(parts.path if scheme != "unix" else "", parts.query)
    if cluster and db != 0:
        raise ValueError(f"selects database {db}, but a Redis Cluster has only database 0 "
                         "(REDIS_CLUSTER=true); use /0 or leave the path out")
    _check_options(url)
    return url


def _check_sentinel(url: str, *, cluster: bool) -> str:
    if cluster:
        raise ValueError("REDIS_CLUSTER=true cannot use a redis+sentinel:// URL: Sentinel "
                         "watches one primary, not a cluster")
    try:
        SentinelURL.parse(url)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    return url


def database(url: str) -> int:
    """The database index of a URL that passed :func:`check_redis_url`."""
    if SentinelURL.matches(url):
        return SentinelURL.parse(url).db
    parts = urlsplit(url)
    return _database(parts.path if parts.scheme != "unix" else "", parts.query)


def location(url: str | None, embedded_port: int) -> str:
    """Where Redis is, for a message: scheme, host and port, never the password."""
    if url is None:
        return f"the embedded Redis (127.0.0.1:{embedded_port})"
    if SentinelURL.matches(url):
        return SentinelURL.parse(url).where()
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}"


def _database(path: str, query: str) -> int:
    from_query = parse_qs(query).get("db")
    text = from_query[0] if from_query else None
    if text is None:
        m = _DB_PATH.match(unquote(path))
        if m is None:
            raise ValueError(f"path {path!r} is not a database index; expected {FORMS}")
        text = m["db"] or "0"
    if not text.isdigit():
        raise ValueError(f"the database index must be a whole number >= 0, got {text!r}")
    return int(text)


def _check_options(url: str) -> None:
    """Build (not connect) one connection, as redis-py will, to refuse bad query options."""
    try:
        pool = redis.ConnectionPool.from_url(url)
        pool.make_connection()
    except TypeError as exc:
        m = _UNEXPECTED.search(str(exc))
        name = m["name"] if m else str(exc)
        raise ValueError(f"unknown option {name!r} in the query string") from None
    except Exception as exc:  # redis-py's own checks: a bad value, protocol=9...
        raise ValueError(f"the query string is invalid: {exc}") from None
    pool.disconnect()


def _hint(url: str) -> str:
    # Only a URL without credentials or options is safe to repeat.
    if url and "@" not in url and "?" not in url:
        return f"; did you mean redis://{url}?"
    return ""


def _port_text(url: str) -> str:
    hostport = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    if hostport.startswith("["):
        return hostport.partition("]")[2].lstrip(":")
    return hostport.rpartition(":")[2] if ":" in hostport else hostport
