"""Queue administration: depth per shard, pause and resume, consumers, job status and cancel.

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
* **oldest ready age** = the Redis clock (``TIME``, same snapshot) minus the time part of the
  first entry after the group's last-delivered id; **consumers** = the group's consumer count.

Pausing sets the ``paused`` field of the lane's meta hash. Workers check it before each read,
so a paused lane starts no new jobs; jobs already running finish. A worker notices a pause
within about a second (plus one blocking read) and a resume within a fifth of a second.
Each lane pauses on its own: pausing ``ingestion`` leaves ``ingestion-secondary`` running.

Tenant flags (:mod:`streamq.tenants`) belong to the queue, whichever of its lanes the admin
was made for: ``flag_tenant`` sends a tenant's new jobs to the secondary lane for a while.

Example::

    admin = QueueAdmin(client, Ingestion)
    depth = await admin.depth()
    print(depth.ready, depth.in_flight, depth.delayed, depth.dead)
    await admin.pause()
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from streamq._redis import run_calls, run_calls_sync
from streamq.contracts import Lane, QueueContract
from streamq.deadletters import resolve_lane
from streamq.driver import Cmds, Steps, cmd, drive, drive_sync, is_cluster, text
from streamq.durations import Duration
from streamq.jobstatus import CancelResult, JobStatus, Lookup
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX, QueueKeys, ShardKeys
from streamq.tenants import (
    TenantFlag,
    flag_tenant,
    flag_tenant_sync,
    flagged_tenants,
    flagged_tenants_sync,
    unflag_tenant,
    unflag_tenant_sync,
)

__all__ = [
    "ConsumerInfo",
    "QueueAdmin",
    "QueueDepth",
    "ShardDepth",
    "SyncQueueAdmin",
    "depth_steps",
]



@dataclass(frozen=True, slots=True)
class ShardDepth:
    """Job counts of one shard (see the module docstring for how each is measured).

    ``oldest_ready_age_s`` (seconds since the oldest job not yet delivered was added, by the
    Redis clock; 0 when none waits) and ``consumers`` (the group's consumers on this shard)
    are read by :meth:`QueueAdmin.depth` and by the worker's depth poller alike.
    """

    shard: str
    ready: int
    in_flight: int
    delayed: int
    dead: int
    oldest_ready_age_s: float = 0.0
    consumers: int = 0


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Job counts of one queue lane: per shard, and summed (or the largest) by the
    properties; ``paused`` as read in the same snapshot."""

    queue: str
    shards: tuple[ShardDepth, ...]
    paused: bool = False

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

    @property
    def oldest_ready_age_s(self) -> float:
        return max((s.oldest_ready_age_s for s in self.shards), default=0.0)

    @property
    def consumers(self) -> int:
        return max((s.consumers for s in self.shards), default=0)


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


def _group_info(reply: Any, group: str) -> dict[str, Any]:
    if isinstance(reply, Exception):
        _raise_other(reply)
        return {}
    for g in reply or ():
        if text(g.get("name")) == group:
            return dict(g)
    return {}


def _id_ms(entry_id: Any) -> int:
    return int(text(entry_id).split("-", 1)[0])


def depth_steps(client: Any, keys: QueueKeys, group: str) -> Steps[QueueDepth]:
    """One lane's depth: counts per shard in one snapshot (``MULTI`` on one server, a
    pipeline on a cluster) with the group's consumers, the paused flag and the server time
    (on a cluster, which routes no keyless command in a pipeline, this machine's clock);
    then, for the shards with ready jobs only, the oldest one's entry (a second round trip).
    """
    cmds = []
    for s in keys.shards:
        cmds += [
            cmd("xlen", s.stream),
            cmd("xpending", s.stream, group),
            cmd("zcard", s.delayed),
            cmd("xlen", s.dead),
            cmd("xinfo_groups", s.stream),
        ]
    cluster = is_cluster(client)
    cmds.append(cmd("hget", keys.meta, "paused"))
    if not cluster:  # a cluster pipeline refuses TIME (no key to route it by)
        cmds.append(cmd("time"))
    reply = yield Cmds(cmds, transaction=not cluster, raise_on_error=False)
    if cluster:
        paused_reply, now_ms = reply[-1], int(time.time() * 1000)
    else:
        paused_reply, now = reply[-2], reply[-1]
        _raise_other(now)
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    _raise_other(paused_reply)
    rows = []
    for i, s in enumerate(keys.shards):
        length, pending, delayed, dead, groups = reply[5 * i : 5 * i + 5]
        for r in (length, delayed, dead):
            _raise_other(r)
        in_flight = _pending_count(pending)
        info = _group_info(groups, group)
        ready = max(0, int(length) - in_flight)
        rows.append((s, ready, in_flight, int(delayed), int(dead), info))
    waiting = [(s, info) for s, ready, *_, info in rows if ready]
    ages: dict[int, float] = {}
    if waiting:
        # The oldest job not yet delivered is the first entry after the last delivered one.
        firsts = yield Cmds([
            cmd("xrange", s.stream, min=f"({text(info.get('last-delivered-id') or '0-0')}",
                max="+", count=1)
            for s, info in waiting
        ], raise_on_error=False)
        for (s, _), entries in zip(waiting, firsts, strict=True):
            _raise_other(entries)
            if entries and not isinstance(entries, Exception):
                ages[s.index] = max(0.0, (now_ms - _id_ms(entries[0][0])) / 1000)
    return QueueDepth(keys.queue, tuple(
        ShardDepth(
            shard=s.name, ready=ready, in_flight=in_flight, delayed=delayed, dead=dead,
            oldest_ready_age_s=ages.get(s.index, 0.0), consumers=int(info.get("consumers", 0)),
        )
        for s, ready, in_flight, delayed, dead, info in rows
    ), paused=bool(paused_reply))


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
        self.prefix = prefix
        self.lookup = Lookup(self.lane.contract, prefix, group, lanes=[self.lane])

    def _targets(self, sharding_key: str | None) -> list[tuple[str, ShardKeys]]:
        return self.lookup.targets(sharding_key)

    def depth_steps(self) -> Steps[QueueDepth]:
        return depth_steps(self.client, self.keys, self.group)

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

    async def flag_tenant(self, tenant: str, duration: Duration, *, reason: str = "",
                          by: str = "admin") -> TenantFlag:
        """Route ``tenant``'s new jobs to the queue's secondary lane for ``duration``
        (timedelta or seconds). A flag only lengthens; producers follow it within their
        staleness bound (1 s by default).

        Raises:
            ConfigurationError: the queue has no secondary lane or no ``tenant_field``; the
                tenant, duration or reason is malformed.
        """
        return await flag_tenant(self.client, self.lane.contract, tenant, duration,
                                 reason=reason, by=by, prefix=self.prefix)

    async def unflag_tenant(self, tenant: str, *, by: str = "admin") -> bool:
        """Lift ``tenant``'s flag now; True when it was flagged."""
        return await unflag_tenant(self.client, self.lane.contract, tenant, by=by,
                                   prefix=self.prefix)

    async def flagged_tenants(self) -> list[TenantFlag]:
        """The queue's tenants flagged now, soonest expiry first."""
        return await flagged_tenants(self.client, self.lane.contract, prefix=self.prefix)

    async def status(self, job_id: str, *, sharding_key: str | None = None) -> JobStatus:
        """A tracked job's status on this lane (see :meth:`streamq.Queue.status`): every
        shard is asked in one pipelined round trip, or only ``sharding_key``'s shard."""
        targets = self._targets(sharding_key)
        calls = self.lookup.status_calls(job_id, targets)
        replies = await run_calls(self.client, calls, queue=self.lane.name)
        return self.lookup.pick(job_id, targets, replies)[0]

    async def cancel(self, job_id: str, *, sharding_key: str | None = None) -> CancelResult:
        """Cancel a tracked job of this lane (see :meth:`streamq.Queue.cancel`)."""
        targets = self._targets(sharding_key)
        calls = self.lookup.cancel_calls(job_id, targets)
        replies = await run_calls(self.client, calls, queue=self.lane.name)
        return self.lookup.cancel_result(job_id, targets, replies)


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

    def flag_tenant(self, tenant: str, duration: Duration, *, reason: str = "",
                    by: str = "admin") -> TenantFlag:
        """See :meth:`QueueAdmin.flag_tenant`."""
        return flag_tenant_sync(self.client, self.lane.contract, tenant, duration,
                                reason=reason, by=by, prefix=self.prefix)

    def unflag_tenant(self, tenant: str, *, by: str = "admin") -> bool:
        """See :meth:`QueueAdmin.unflag_tenant`."""
        return unflag_tenant_sync(self.client, self.lane.contract, tenant, by=by,
                                  prefix=self.prefix)

    def flagged_tenants(self) -> list[TenantFlag]:
        """See :meth:`QueueAdmin.flagged_tenants`."""
        return flagged_tenants_sync(self.client, self.lane.contract, prefix=self.prefix)

    def status(self, job_id: str, *, sharding_key: str | None = None) -> JobStatus:
        """See :meth:`QueueAdmin.status`."""
        targets = self._targets(sharding_key)
        calls = self.lookup.status_calls(job_id, targets)
        replies = run_calls_sync(self.client, calls, queue=self.lane.name)
        return self.lookup.pick(job_id, targets, replies)[0]

    def cancel(self, job_id: str, *, sharding_key: str | None = None) -> CancelResult:
        """See :meth:`QueueAdmin.cancel`."""
        targets = self._targets(sharding_key)
        calls = self.lookup.cancel_calls(job_id, targets)
        replies = run_calls_sync(self.client, calls, queue=self.lane.name)
        return self.lookup.cancel_result(job_id, targets, replies)
