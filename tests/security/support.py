"""Certificates made with ``openssl`` and a TLS-only redis-server, for the TLS tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from streamq.testing import wait_answering
from tests.support.redis_server import free_port


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    misnamed_cert: str
    misnamed_key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-sha256", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}", cwd=d)


def _signed(d: Path, name: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext + "\n")
    _openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-sha256",
             "-extfile", f"{name}.ext", cwd=d)


def make_certs(d: Path) -> Certs:
    """A CA; a server certificate for 127.0.0.1 and localhost; a client certificate; a
    server certificate for another host name; and an unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make test certificates")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                         "extendedKeyUsage=serverAuth")
    _signed(d, "misnamed", "subjectAltName=DNS:redis.elsewhere.example\n"
                           "extendedKeyUsage=serverAuth")
    _signed(d, "client", "extendedKeyUsage=clientAuth")
    return Certs(
        ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"),
        server_key=str(d / "server.key"), client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"), other_ca=str(d / "other-ca.pem"),
        misnamed_cert=str(d / "misnamed.pem"), misnamed_key=str(d / "misnamed.key"),
    )


class TLSRedisServer:
    """A redis-server with no plaintext port (``--port 0``), TLS on a free loopback port."""

    def __init__(self, binary: str, certs: Certs, *, auth_clients: str = "optional",
                 misnamed: bool = False) -> None:
        self.binary = binary
        self.certs = certs
        self.auth_clients = auth_clients
        self.cert, self.key = ((certs.misnamed_cert, certs.misnamed_key) if misnamed
                               else (certs.server_cert, certs.server_key))
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="streamq-tls-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> TLSRedisServer:
        args = [
            self.binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
            "--tls-cert-file", self.cert, "--tls-key-file", self.key,
            "--tls-ca-cert-file", self.certs.ca, "--tls-auth-clients", self.auth_clients,
            "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
            "--protected-mode", "no", "--loglevel", "warning",
            "--maxmemory-policy", "noeviction",
        ]
        log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = self.admin()
        try:
            wait_answering(lambda: bool(client.ping()), self.proc,
                           what=f"TLS redis-server on port {self.port}",
                           log=f"{self.dir}/redis.log", timeout_s=timeout_s)
        finally:
            client.close()
        return self

    def admin(self) -> redis.Redis:
        """A verified mutual-TLS client (works whatever ``auth_clients`` says)."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=self.certs.ca,
            ssl_certfile=self.certs.client_cert, ssl_keyfile=self.certs.client_key,
            ssl_check_hostname=False, socket_connect_timeout=2,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None
