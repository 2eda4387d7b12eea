"""What a run cost Redis: INFO commandstats and CPU deltas, and the commands a client sent.

``INFO commandstats`` counts a script call (``evalsha``) *and* every command the script ran
inside Redis, each under its own name, and a script's microseconds include those of the
commands it ran. So the server alone cannot say which calls a client made: this process
counts the commands it sends (:class:`ClientCommands`), and :func:`cost` combines both.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio.connection as aconn
import redis.connection as sconn

# Commands the harness itself sends to read the figures; never part of a measured cost.
HARNESS = frozenset({"info", "config|resetstat", "config|get", "xlen", "memory|usage", "dbsize"})


class ClientCommands:
    """Counts, by name, every command this process sends through redis-py (sync and async).

    Installed once per process; counting costs a dict increment per command, for raw
    baselines and streamq alike.
    """

    counts: collections.Counter[str] = collections.Counter()
    _lock = threading.Lock()
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True
        counts, lock = cls.counts, cls._lock
        # A command's name by its first argument, worked out once: counting must cost the
        # measured code next to nothing, or the side sending more commands (a pipeline of
        # XADDs against one script call) pays for being counted.
        names: dict[object, str] = {}
        with_sub = ("config", "client", "xgroup", "xinfo", "script", "memory")

        def name_of(args: tuple[Any, ...]) -> str:
            first = args[0]
            name = names.get(first)
            if name is not None:
                return name
            words = (first.decode() if isinstance(first, bytes) else str(first)).lower().split()
            if len(words) == 1 and len(args) > 1 and words[0] in with_sub:
                sub = args[1]
                words.append((sub.decode() if isinstance(sub, bytes) else str(sub)).lower())
                return "|".join(words)
            name = names[first] = "|".join(words[:2])
            return name

        a_pack = aconn.AbstractConnection.pack_command

        def a_pack_command(self: Any, *args: Any) -> Any:
            with lock:
                counts[name_of(args)] += 1
            return a_pack(self, *args)

        aconn.AbstractConnection.pack_command = a_pack_command  # type: ignore[method-assign]

        # The sync connection packs a single command inside send_command, a pipeline in
        # pack_commands.
        s_send = sconn.AbstractConnection.send_command
        s_pack_many = sconn.AbstractConnection.pack_commands

        def s_send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                counts[name_of(args)] += 1
            return s_send(self, *args, **kwargs)  # type: ignore[no-untyped-call]

        def s_pack_commands(self: Any, commands: Any) -> Any:
            commands = list(commands)
            with lock:
                for c in commands:
                    counts[name_of(tuple(c))] += 1
            return s_pack_many(self, commands)  # type: ignore[no-untyped-call]

        sconn.AbstractConnection.send_command = s_send_command  # type: ignore[method-assign]
        sconn.AbstractConnection.pack_commands = s_pack_commands  # type: ignore[method-assign]

    @classmethod
    def snapshot(cls) -> dict[str, int]:
        with cls._lock:
            return dict(cls.counts)


@dataclass
class ServerSnapshot:
    calls: dict[str, int]
    usec: dict[str, int]
    cpu_s: float
    client: dict[str, int]


def snapshot(r: redis.Redis) -> ServerSnapshot:
    """Commandstats, Redis CPU and this process's client command counts, now."""
    client = ClientCommands.snapshot()
    stats = r.info("commandstats")
    cpu = r.info("cpu")
    calls: dict[str, int] = {}
    usec: dict[str, int] = {}
    for key, v in stats.items():
        name = key.removeprefix("cmdstat_")
        calls[name] = int(v["calls"])
        usec[name] = int(v["usec"])
    cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return ServerSnapshot(calls, usec, cpu_s, client)


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = {k: v - a.get(k, 0) for k, v in b.items()}
    return {k: v for k, v in out.items() if v > 0 and k not in HARNESS}


def cost(before: ServerSnapshot, after: ServerSnapshot, jobs: int) -> dict[str, Any]:
    """Per-job Redis cost between two snapshots.

    - ``client_cmds_per_job``: commands this process sent (a script call counts once).
    - ``server_cmds_per_job``: commands Redis ran, including those run inside scripts.
    - ``server_us_per_job``: commandstats microseconds of the client's own commands (a script
      call's time includes the commands it ran; those are not counted twice).
    - ``redis_cpu_us_per_job``: Redis process CPU (user+sys), which also covers network I/O
      and protocol parsing that commandstats leaves out.
    """
    calls = _delta(before.calls, after.calls)
    usec = _delta(before.usec, after.usec)
    client = _delta(before.client, after.client)
    top_usec = 0.0
    for name, n in client.items():
        server_n = calls.get(name, 0)
        if server_n:
            # A command the client sends that scripts also run (TIME, HGET): charge the
            # client its share of the calls.
            top_usec += usec.get(name, 0) * min(1.0, n / server_n)
    jobs = max(1, jobs)
    return {
        "jobs": jobs,
        "client_cmds_per_job": sum(client.values()) / jobs,
        "server_cmds_per_job": sum(calls.values()) / jobs,
        "server_us_per_job": top_usec / jobs,
        "redis_cpu_us_per_job": (after.cpu_s - before.cpu_s) * 1e6 / jobs,
        "client_commands": dict(sorted(client.items())),
        "server_commands": dict(sorted(calls.items())),
    }
