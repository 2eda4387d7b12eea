"""Queue administration: depth per shard, pause and resume, consumers.

:class:`QueueAdmin` (asyncio) and :class:`SyncQueueAdmin` share their steps with
:mod:`streamq.deadletters`: each operation is written once and driven by either client.

How depth is measured, per shard, in one ``MULTI`` snapshot (one pipeline on a cluster):

* **in flight** = the consumer group's pending count (``XPENDING``): delivered to a worker and
  not yet settled, including entries a worker fetched and has not started yet.
* **ready** = ``XLEN stream`` minus in flight. A settled job is acknowledged *and* deleted in
  one script, so every entry still in the stream is either pending or not yet delivered.
  (A pending entry whose body was trimmed away is counted in flight and not in ``XLEN``; the
  reclaimer soon records it as a lost payload. ``ready`` is never shown below 0.)
* **delayed** = ``ZCARD delayed``: scheduled jobs and retries waiting for their due time.
* **dead** = ``XLEN dead``.

Pausing sets the ``paused`` field of the lane's meta hash. Workers check it before each read,
so a paused lane starts no new jobs; jobs already running finish. A worker notices a pause
within about a second (plus one blocking read) and a resume within a fifth of a second.
Each lane pauses on its own: pausing ``ingestion`` leaves ``ingestion-secondary`` running.

Example::

    admin = QueueAdmin(client, Ingestion)
    depth = await admin.depth()
    print(depth.ready, depth.in_flight, depth.delayed, depth.dead)
    await admin.pause()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from streamq.contracts import Lane, QueueContract
from streamq.deadletters import (
    DEFAULT_PREFIX,
    Cmds,
    Steps,
    cmd,
    drive,
    drive_sync,
    is_cluster,
    resolve_lane,
    text,
)
from streamq.keys import QueueKeys

__all__ = ["ConsumerInfo", "QueueAdmin", "QueueDepth", "ShardDepth", "SyncQueueAdmin"]

DEFAULT_GROUP = "streamq"


@dataclass(frozen=True, slots=True)
class ShardDepth:
    """Job counts of one shard (see the module docstring for how each is measured)."""

    shard: str
    ready: int
    in_flight: int
    delayed: int
    dead: int


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Job counts of one queue lane: per shard, and summed by the properties."""

    queue: str
    shards: tuple[ShardDepth, ...]

    @property
    def ready(self) -> int:
        return sum(s.ready for s in self.shards)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.shards)

    @property
    def delayed(self) -> int:
        return sum(s.delayed for s in self.shards)

    @property
    def dead(self) -> int:
        return sum(s.dead for s in self.shards)


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer (worker process) of a lane.

    Attributes:
        name: the consumer name (``<host>-<pid>-<random>`` by default).
        pending: entries it holds, all shards together.
        pending_by_shard: entries it holds per shard name (shards where it holds none are
            left out).
        idle_ms: time since it last read or claimed anything, its least idle shard (None when
            it is known only from its heartbeat).
        last_heartbeat_ms: its last heartbeat, ms since the epoch (None when it has none:
            it left, or it is not a streamq worker).
    """

    name: str
    pending: int
    pending_by_shard: dict[str, int] = field(default_factory=dict)
    idle_ms: int | None = None
    last_heartbeat_ms: int | None = None


def _missing_group(reply: Any) -> bool:
    # No worker has created the group yet (or the stream does not exist): nothing delivered.
    return isinstance(reply, ResponseError) and (
        "NOGROUP" in str(reply) or "no such key" in str(reply)
    )


def _raise_other(reply: Any) -> None:
    if isinstance(reply, Exception) and not _missing_group(reply):
        raise reply


def _pending_count(reply: Any) -> int:
    _raise_other(reply)
    if isinstance(reply, dict):
        return int(reply.get("pending") or 0)
    if isinstance(reply, list | tuple) and reply:
        return int(reply[0] or 0)
    return 0


class _AdminCore:
    """State and steps shared by :class:`QueueAdmin` and :class:`SyncQueueAdmin`."""

    def __init__(
        self,
        client: Any,
        lane_or_contract: Lane | type[QueueContract],
        *,
        prefix: str,
        group: str,
    ) -> None:
        self.client = client
        self.lane = resolve_lane(lane_or_contract)
        self.keys = QueueKeys(prefix, self.lane.name, self.lane.shards)
        self.group = group

    def depth_steps(self) -> Steps[QueueDepth]:
        shards = self.keys.shards
        cmds = []
        for s in shards:
            cmds += [
                cmd("xlen", s.stream),
                cmd("xpending", s.stream, self.group),
                cmd("zcard", s.delayed),
                cmd("xlen", s.dead),
            ]
        reply = yield Cmds(cmds, transaction=not is_cluster(self.client), raise_on_error=False)
        out = []
        for i, s in enumerate(shards):
            length, pending, delayed, dead = reply[4 * i : 4 * i + 4]
            for r in (length, delayed, dead):
                _raise_other(r)
            in_flight = _pending_count(pending)
            out.append(
                ShardDepth(
                    shard=s.name,
                    ready=max(0, int(length) - in_flight),
                    in_flight=in_flight,
                    delayed=int(delayed),
                    dead=int(dead),
                )
            )
        return QueueDepth(self.lane.name, tuple(out))

    def set_paused_steps(self, paused: bool) -> Steps[None]:
        # Workers read the flag as "present and non-empty": resume removes it.
        op = (
            cmd("hset", self.keys.meta, "paused", "1")
            if paused
            else cmd("hdel", self.keys.meta, "paused")
        )
        yield Cmds([op])

    def is_paused_steps(self) -> Steps[bool]:
        (value,) = yield Cmds([cmd("hget", self.keys.meta, "paused")])
        return bool(value)

    def consumers_steps(self) -> Steps[list[ConsumerInfo]]:
        shards = self.keys.shards
        reply = yield Cmds(
            [cmd("xinfo_consumers", s.stream, self.group) for s in shards]
            + [cmd("hgetall", self.keys.workers)],
            raise_on_error=False,
        )
        beats_reply = reply[-1]
        _raise_other(beats_reply)
        beats = {text(k): int(v) for k, v in (beats_reply or {}).items()}
        pending: dict[str, dict[str, int]] = {}
        idle: dict[str, int] = {}
        for s, rows in zip(shards, reply[:-1], strict=True):
            _raise_other(rows)
            if isinstance(rows, Exception):
                continue
            for row in rows:
                info = {text(k): v for k, v in row.items()}
                name = text(info.get("name"))
                n = int(info.get("pending") or 0)
                by_shard = pending.setdefault(name, {})
                if n:
                    by_shard[s.name] = n
                i = int(info.get("idle") or 0)
                idle[name] = min(idle.get(name, i), i)
        names = sorted(set(pending) | set(beats))
        return [
            ConsumerInfo(
                name=n,
                pending=sum(pending.get(n, {}).values()),
                pending_by_shard=pending.get(n, {}),
                idle_ms=idle.get(n),
                last_heartbeat_ms=beats.get(n),
            )
            for n in names
        ]


class QueueAdmin(_AdminCore):
    """Administer one queue lane (asyncio client): depth, pause/resume, consumers.

    Args:
        client: a ``redis.asyncio.Redis`` (or ``RedisCluster``).
        lane_or_contract: a queue contract (its primary lane) or a :class:`Lane`.
        prefix: the key prefix shared with producers and workers.
        group: the consumer group the workers use.
    """

    def __init__(
        self,
        client: Any,
        lane_or_contract: Lane | type[QueueContract],
        *,
        prefix: str = DEFAULT_PREFIX,
        group: str = DEFAULT_GROUP,
    ) -> None:
        super().__init__(client, lane_or_contract, prefix=prefix, group=group)

    async def depth(self) -> QueueDepth:
        """Ready, in-flight, delayed and dead jobs per shard, read as one snapshot."""
        return await drive(self.client, self.lane.name, self.depth_steps())

    async def pause(self) -> None:
        """Stop workers of this lane from starting new jobs (running jobs finish)."""
        await drive(self.client, self.lane.name, self.set_paused_steps(True))

    async def resume(self) -> None:
        """Let workers of this lane start jobs again."""
        await drive(self.client, self.lane.name, self.set_paused_steps(False))

    async def is_paused(self) -> bool:
        """True while the lane is paused."""
        return await drive(self.client, self.lane.name, self.is_paused_steps())

    async def consumers(self) -> list[ConsumerInfo]:
        """The lane's consumers: what each holds, how idle it is, its last heartbeat."""
        return await drive(self.client, self.lane.name, self.consumers_steps())


class SyncQueueAdmin(_AdminCore):
    """The synchronous twin of :class:`QueueAdmin` (a ``redis.Redis`` client)."""

    def __init__(
        self,
        client: Any,
        lane_or_contract: Lane | type[QueueContract],
        *,
        prefix: str = DEFAULT_PREFIX,
        group: str = DEFAULT_GROUP,
    ) -> None:
        super().__init__(client, lane_or_contract, prefix=prefix, group=group)

    def depth(self) -> QueueDepth:
        """See :meth:`QueueAdmin.depth`."""
        return drive_sync(self.client, self.lane.name, self.depth_steps())

    def pause(self) -> None:
        """See :meth:`QueueAdmin.pause`."""
        drive_sync(self.client, self.lane.name, self.set_paused_steps(True))

    def resume(self) -> None:
        """See :meth:`QueueAdmin.resume`."""
        drive_sync(self.client, self.lane.name, self.set_paused_steps(False))

    def is_paused(self) -> bool:
        """See :meth:`QueueAdmin.is_paused`."""
        return drive_sync(self.client, self.lane.name, self.is_paused_steps())

    def consumers(self) -> list[ConsumerInfo]:
        """See :meth:`QueueAdmin.consumers`."""
        return drive_sync(self.client, self.lane.name, self.consumers_steps())
