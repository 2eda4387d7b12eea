"""Connecting to Redis over verified TLS: one settings object and the clients built from it.

A ``rediss://`` URL is TLS; the server's certificate is verified against a CA (the system's
trust store, or ``ca_file``) and its name against the URL's host, unless a :class:`TLSConfig`
says ``verify=False`` in so many words. A URL cannot turn verification off by itself
(``?ssl_cert_reqs=none`` is refused), and TLS settings next to a plaintext ``redis://`` URL
are refused rather than ignored: nothing falls back to plaintext.

Example::

    tls = TLSConfig(ca_file="/etc/redis/ca.pem", cert_file="client.pem", key_file="client.key")
    queue = Queue(Ingestion, streamq.connect("rediss://redis.internal:6380/0", tls=tls))
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio as aioredis

from streamq.errors import ConfigurationError

__all__ = ["TLSConfig", "check_tls_url", "connect", "connect_sync", "tls_options"]

_log = logging.getLogger("streamq.tls")

# URL options (redis-py reads them from the query string) that would weaken verification.
_UNVERIFIED = {
    "ssl_cert_reqs": {"none", "optional"},
    "ssl_check_hostname": {"false", "0", "no", "off", "n", "f"},
}


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """How to verify a Redis server and, for mutual TLS, how to prove who we are.

    Args:
        ca_file: PEM file of the CA(s) that signed the server's certificate; None uses the
            system's trust store.
        cert_file: PEM client certificate, for servers that require one (mutual TLS). It may
            hold the private key too.
        key_file: PEM private key of ``cert_file`` when it is a file of its own.
        verify: check the server's certificate and host name (the default). ``False``
            encrypts without knowing who answers: for tests only; a warning is logged.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    def __post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise ConfigurationError("TLS key_file is set without cert_file: the client "
                                     "certificate it belongs to is missing")


def tls_options(tls: TLSConfig | None) -> dict[str, Any]:
    """redis-py's connection options for ``tls`` (empty for None: the URL decides)."""
    if tls is None:
        return {}
    if not tls.verify:
        _log.warning("TLS certificate verification is off: the connection is encrypted but "
                     "the server is not authenticated")
    opts: dict[str, Any] = {
        "ssl_cert_reqs": "required" if tls.verify else "none",
        "ssl_check_hostname": tls.verify,
    }
    if tls.ca_file is not None:
        opts["ssl_ca_certs"] = tls.ca_file
    if tls.cert_file is not None:
        opts["ssl_certfile"] = tls.cert_file
    if tls.key_file is not None:
        opts["ssl_keyfile"] = tls.key_file
    return opts


def check_tls_url(url: str, tls: TLSConfig | None) -> None:
    """Refuse a URL that would connect in plaintext despite ``tls``, or turn verification off.

    Raises:
        ConfigurationError: TLS settings with a ``redis://`` or ``unix://`` URL, ``ssl_*``
            options in the URL beside a :class:`TLSConfig`, or a URL option that disables
            certificate or host-name verification.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return  # redis-py reports a malformed URL itself
    options = {k.lower(): v for k, v in parse_qs(parts.query).items()}
    for name, off in _UNVERIFIED.items():
        if any(v.strip().lower() in off for v in options.get(name, [])):
            raise ConfigurationError(
                f"the Redis URL sets {name}={options[name][0]}, which turns TLS verification "
                "off; remove it (to go without verification on purpose, pass "
                "TLSConfig(verify=False))"
            )
    if tls is None:
        return
    if parts.scheme != "rediss":
        raise ConfigurationError(
            f"TLS settings are given but the Redis URL's scheme is {parts.scheme!r}, which "
            "connects in plaintext; use a rediss:// URL"
        )
    given = sorted(k for k in options if k.startswith("ssl_"))
    if given:
        raise ConfigurationError(
            f"the Redis URL sets {', '.join(given)} and TLS settings are given too; set TLS "
            "in one place (the TLS settings)"
        )


def connect(
    url: str, *, tls: TLSConfig | None = None, cluster: bool = False, **options: Any
) -> aioredis.Redis | aioredis.RedisCluster:
    """An asyncio client for ``url`` (``redis://``, ``rediss://``, ``unix://``), TLS verified.

    ``options`` go to redis-py (``socket_timeout``, ``health_check_interval``...). Nothing
    connects until the first command.

    Example::

        client = streamq.connect("rediss://redis.internal:6380/0",
                                 tls=TLSConfig(ca_file="ca.pem"))
        await Queue(Ingestion, client).add(Ingestion.ingest, payload)

    Raises:
        ConfigurationError: see :func:`check_tls_url`.
    """
    check_tls_url(url, tls)
    kw = {**options, **tls_options(tls)}
    if cluster:
        return aioredis.RedisCluster.from_url(url, **kw)
    return aioredis.Redis.from_url(url, **kw)


def connect_sync(
    url: str, *, tls: TLSConfig | None = None, cluster: bool = False, **options: Any
) -> redis.Redis | redis.RedisCluster:
    """The synchronous twin of :func:`connect` (for :class:`~streamq.SyncQueue`, scripts)."""
    check_tls_url(url, tls)
    kw = {**options, **tls_options(tls)}
    if cluster:
        return redis.RedisCluster.from_url(url, **kw)
    return redis.Redis.from_url(url, **kw)
