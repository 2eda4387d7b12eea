"""Fixtures of the security tests: a Redis of their own for ACL users, TLS certificates made by
``openssl`` and a TLS-only redis-server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from streamq.security import Role, acl_rules
from tests.conftest import _binary_or_stop
from tests.security.support import Certs, TLSRedisServer, make_certs
from tests.support.redis_server import RedisServer

MakeUser = Callable[..., str]


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A redis-server of this module's own: the ACL users made here stay here."""
    server = RedisServer(_binary_or_stop(), extra=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
async def admin(acl_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """The default user: sets up ACL users and looks at every key."""
    client = aioredis.Redis(port=acl_server.port)
    yield client
    await client.aclose()


@pytest.fixture
def make_user(acl_server: RedisServer) -> Iterator[MakeUser]:
    """``make_user(role, prefix, grant=..., deny=...)``: an ACL user with ``role``'s rules
    (plus ``grant``, minus ``deny``); returns its ``redis://`` URL."""
    import redis

    made: list[str] = []
    admin = redis.Redis(port=acl_server.port)

    def make(role: Role, prefix: str, *, grant: Sequence[str] = (),
             deny: Sequence[str] = ()) -> str:
        user = f"{prefix}-{role}-{uuid.uuid4().hex[:4]}"
        rules = [*acl_rules(role, prefix=prefix), *grant, *(f"-{c}" for c in deny)]
        admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules)
        made.append(user)
        return f"redis://{user}:pw@127.0.0.1:{acl_server.port}/0"

    yield make
    for user in made:
        admin.execute_command("ACL", "DELUSER", user)
    admin.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and a second
    CA that signed nothing here."""
    return make_certs(Path(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[TLSRedisServer]:
    """A TLS-only redis-server (no plaintext port) that asks for, but does not require,
    client certificates."""
    server = TLSRedisServer(_binary_or_stop(), certs, auth_clients="optional").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_server(certs: Certs) -> Iterator[TLSRedisServer]:
    """A TLS-only redis-server that requires a client certificate signed by the CA."""
    server = TLSRedisServer(_binary_or_stop(), certs, auth_clients="yes").start()
    yield server
    server.stop()
