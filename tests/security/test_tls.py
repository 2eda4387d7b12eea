"""Verified TLS against a TLS-only redis-server with certificates made for the test: a good CA
connects, a wrong CA or host name is refused, mutual TLS works, and nothing falls back to
plaintext or silently stops verifying."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import BaseModel

from streamq import (
    App,
    ConfigurationError,
    Job,
    Queue,
    QueueContract,
    RedisUnavailable,
    SyncQueue,
    TLSConfig,
    WorkerManager,
    connect,
    connect_sync,
    job,
)
from streamq.cli import main as cli_main
from streamq.keys import QueueKeys
from tests.conftest import _binary_or_stop
from tests.entrypoint.helpers import WorkerProcess, clean_env, last_line, run_worker, wait_for
from tests.runtime.support import wait_until
from tests.security.support import Certs, TLSRedisServer
from tests.support.redis_server import free_port


class Ping(BaseModel):
    n: int


class Tls(QueueContract, name="tls-q"):
    ping = job("ping", Ping)


@pytest.fixture(scope="module")
def misnamed_server(certs: Certs) -> Iterator[TLSRedisServer]:
    """A TLS-only redis-server whose certificate (signed by the test CA) names another host."""
    server = TLSRedisServer(_binary_or_stop(), certs, misnamed=True).start()
    yield server
    server.stop()


def verified(certs: Certs) -> TLSConfig:
    return TLSConfig(ca_file=certs.ca)


def mutual(certs: Certs) -> TLSConfig:
    return TLSConfig(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)


def refusal_chain(exc: BaseException) -> str:
    parts = []
    e: BaseException | None = exc
    while e is not None:
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    return " | ".join(parts)


async def test_a_worker_processes_a_job_a_producer_added_over_verified_tls(
    tls_server: TLSRedisServer, certs: Certs, prefix: str
) -> None:
    ran: list[int] = []
    app = App([Tls])

    @app.processor(Tls, block_timeout=0.1)
    async def proc(j: Job[Ping]) -> None:
        ran.append(j.payload.n)

    m = WorkerManager(redis_url=tls_server.url, prefix=prefix, tls=verified(certs))
    m.register_app(app)
    client = connect(tls_server.url, tls=verified(certs))
    try:
        await m.start()
        await Queue(Tls, client, prefix=prefix).add(Tls.ping, Ping(n=7))
        await wait_until(lambda: ran == [7], what="the job over TLS")
        await m.run_until_idle(10)
    finally:
        await m.close_workers(timeout_s=2)
        await client.aclose()


def test_a_sync_producer_adds_over_verified_tls(
    tls_server: TLSRedisServer, certs: Certs, prefix: str
) -> None:
    client = connect_sync(tls_server.url, tls=verified(certs))
    try:
        SyncQueue(Tls, client, prefix=prefix).add(Tls.ping, Ping(n=1))
    finally:
        client.close()
    admin = tls_server.admin()
    try:
        assert admin.xlen(QueueKeys(prefix, "tls-q", 1).shards[0].stream) == 1
    finally:
        admin.close()


def test_a_server_signed_by_another_ca_is_refused(
    tls_server: TLSRedisServer, certs: Certs
) -> None:
    client = connect_sync(tls_server.url, tls=TLSConfig(ca_file=certs.other_ca),
                          socket_connect_timeout=5)
    with pytest.raises(redis.ConnectionError) as info:
        client.ping()
    assert "certificate verify failed" in str(info.value)


def test_verification_is_on_by_default_so_an_unknown_ca_is_refused_without_settings(
    tls_server: TLSRedisServer,
) -> None:
    # No TLSConfig at all: redis-py's defaults verify against the system's CAs, which do not
    # include the test CA.
    for client in (connect_sync(tls_server.url), connect_sync(tls_server.url, tls=TLSConfig())):
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            client.ping()


def test_a_certificate_for_another_host_name_is_refused(
    misnamed_server: TLSRedisServer, certs: Certs
) -> None:
    client = connect_sync(misnamed_server.url, tls=verified(certs))
    with pytest.raises(redis.ConnectionError) as info:
        client.ping()
    assert "mismatch" in str(info.value), str(info.value)


async def test_a_worker_that_cannot_verify_the_server_refuses_to_start(
    misnamed_server: TLSRedisServer, certs: Certs, prefix: str
) -> None:
    m = WorkerManager(redis_url=misnamed_server.url, prefix=prefix, tls=verified(certs))
    m.register_app(_app())
    with pytest.raises(RedisUnavailable) as info:
        await m.start()
    await m.close_workers()
    assert "certificate verify failed" in refusal_chain(info.value)


def test_mutual_tls_connects_with_a_client_certificate_and_is_refused_without(
    mtls_server: TLSRedisServer, certs: Certs
) -> None:
    good = connect_sync(mtls_server.url, tls=mutual(certs))
    try:
        assert good.ping()
    finally:
        good.close()
    bare = connect_sync(mtls_server.url, tls=verified(certs), socket_connect_timeout=5)
    with pytest.raises((redis.ConnectionError, ssl.SSLError)):
        bare.ping()


def test_a_plaintext_url_to_the_tls_port_fails(tls_server: TLSRedisServer) -> None:
    client = redis.Redis.from_url(f"redis://127.0.0.1:{tls_server.port}/0",
                                  socket_connect_timeout=3, socket_timeout=3)
    with pytest.raises(redis.RedisError):
        client.ping()


def test_tls_settings_beside_a_plaintext_url_are_refused_not_ignored(certs: Certs) -> None:
    with pytest.raises(ConfigurationError, match="rediss://"):
        connect_sync("redis://127.0.0.1:6379/0", tls=verified(certs))
    with pytest.raises(ConfigurationError, match="rediss://"):
        WorkerManager(redis_url="redis://127.0.0.1:6379/0", tls=verified(certs))


@pytest.mark.parametrize("query", ["ssl_cert_reqs=none", "ssl_cert_reqs=optional",
                                   "ssl_check_hostname=false"])
def test_a_url_cannot_switch_verification_off(query: str) -> None:
    url = f"rediss://127.0.0.1:6379/0?{query}"
    with pytest.raises(ConfigurationError, match="verification off"):
        connect_sync(url)
    with pytest.raises(ConfigurationError, match="verification off"):
        WorkerManager(redis_url=url)


def test_a_key_file_without_its_certificate_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cert_file"):
        TLSConfig(key_file="client.key")


def test_verification_off_must_be_asked_for_and_is_logged(
    tls_server: TLSRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="streamq.tls"):
        client = connect_sync(tls_server.url, tls=TLSConfig(verify=False))
        try:
            assert client.ping()
        finally:
            client.close()
    assert any("verification is off" in r.getMessage() for r in caplog.records)


def _app() -> App[None]:
    app = App([Tls])

    @app.processor(Tls, block_timeout=0.1)
    async def proc(j: Job[Ping]) -> None: ...

    return app


# -- python -m worker and the CLI ----------------------------------------------------------------
def worker_env(server: TLSRedisServer, prefix: str, **extra: str) -> dict[str, str]:
    values = {"WORKER_APP": "tests.entrypoint.sample_app:app", "REDIS_URL": server.url,
              "REDIS_PREFIX": prefix, "QUEUE_CONSUMER_CHORES_IS_ENABLED": "true",
              "METRICS_PORT": str(free_port()), "LOG_FORMAT": "json", **extra}
    return clean_env(**values)


def test_python_m_worker_consumes_over_mutual_tls(
    mtls_server: TLSRedisServer, certs: Certs, prefix: str, tmp_path: Path
) -> None:
    from tests.entrypoint.sample_app import Chores, Note

    env = worker_env(mtls_server, prefix, REDIS_TLS_CA_FILE=certs.ca,
                     REDIS_TLS_CERT_FILE=certs.client_cert,
                     REDIS_TLS_KEY_FILE=certs.client_key)
    w = WorkerProcess(env, tmp_path / "worker.log")
    admin = mtls_server.admin()
    try:
        w.wait_consuming(60)
        SyncQueue(Chores, admin, prefix=prefix).add(Chores.chore, Note(n=1))
        stream = QueueKeys(prefix, "chores", 1).shards[0].stream
        wait_for(lambda: w.logged("chore done") and admin.xlen(stream) == 0, 30,
                 "the chore done over TLS")
        assert w.terminate() == 0
    finally:
        w.kill()
        admin.close()


@pytest.mark.parametrize(
    ("extra", "variable", "says"),
    [
        ({"REDIS_TLS_VERIFY": "maybe"}, "REDIS_TLS_VERIFY", "maybe"),
        ({"REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "REDIS_TLS_CA_FILE", "no such file"),
        ({"REDIS_TLS_KEY_FILE": "{key}"}, "REDIS_TLS_KEY_FILE", "REDIS_TLS_CERT_FILE"),
        ({"REDIS_TLS_CA_FILE": "{ca}", "REDIS_URL": "redis://127.0.0.1:1/0"},
         "REDIS_TLS_CA_FILE", "plaintext"),
        ({"REDIS_URL": "rediss://127.0.0.1:1/0?ssl_cert_reqs=none"}, "REDIS_URL",
         "verification off"),
    ],
    ids=["verify-not-a-bool", "missing-ca-file", "key-without-cert", "tls-with-redis-url",
         "url-disables-verification"],
)
def test_python_m_worker_exits_2_naming_a_malformed_tls_setting(
    tls_server: TLSRedisServer, certs: Certs, prefix: str, extra: dict[str, str],
    variable: str, says: str,
) -> None:
    values = {k: v.format(ca=certs.ca, key=certs.client_key) for k, v in extra.items()}
    done = run_worker(worker_env(tls_server, prefix, **values))
    assert done.returncode == 2, done.stderr
    assert variable in done.stderr
    assert says in done.stderr


@pytest.mark.parametrize(
    ("server", "extra", "variable"),
    [("tls_server", {"REDIS_TLS_CA_FILE": "{other_ca}"}, "REDIS_TLS_CA_FILE"),
     ("misnamed_server", {"REDIS_TLS_CA_FILE": "{ca}"}, "REDIS_URL"),
     ("mtls_server", {"REDIS_TLS_CA_FILE": "{ca}"}, "REDIS_TLS_CERT_FILE")],
    ids=["wrong-ca", "wrong-host-name", "no-client-certificate"],
)
def test_python_m_worker_exits_2_when_the_tls_handshake_is_refused(
    request: pytest.FixtureRequest, certs: Certs, prefix: str, server: str,
    extra: dict[str, str], variable: str,
) -> None:
    srv: TLSRedisServer = request.getfixturevalue(server)
    values = {k: v.format(ca=certs.ca, other_ca=certs.other_ca) for k, v in extra.items()}
    done = run_worker(worker_env(srv, prefix, **values))
    assert done.returncode == 2, done.stderr
    assert variable in last_line(done.stderr), done.stderr


def test_the_cli_connects_over_verified_tls_and_refuses_an_unknown_ca(
    tls_server: TLSRedisServer, certs: Certs, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--redis-url", tls_server.url, "--prefix", prefix, "--contracts",
            "tests.security.test_acl_roles:CONTRACTS"]
    assert cli_main([*base, "--tls-ca-file", certs.ca, "depth"]) == 0, capsys.readouterr()
    assert "sec" in capsys.readouterr().out
    assert cli_main([*base, "--tls-ca-file", certs.other_ca, "depth"]) != 0
    assert "certificate verify failed" in capsys.readouterr().err

