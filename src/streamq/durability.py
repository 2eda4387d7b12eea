"""Durable adds: an add returns only once replicas hold the job.

Redis replicates asynchronously. An add that a primary acknowledged can still be lost when
that primary dies before its replicas received the write: a replica promoted in its place
(Redis Cluster failover, Sentinel) never saw the job. With :class:`Durability` a producer
sends ``WAIT <replicas> <timeout>`` right after the enqueue, **on the same connection** (Redis
counts a client's own writes: a ``WAIT`` on another connection confirms nothing), and raises
:class:`~streamq.errors.NotReplicated` when fewer replicas than asked confirmed it in time.

On a Redis Cluster the enqueue and the ``WAIT`` go to the primary that serves the shard's
slot, on one connection taken from that node's pool; a ``MOVED`` reply (the slot moved in a
failover) refreshes the client's slot table and the calls that did not run are sent again
to the new primary.

What a durable add promises: when it returns, the job is on the primary **and** on at least
``replicas`` replicas, so the failure of the primary alone cannot lose it. It does not make
the write synchronous to disk (see AOF ``appendfsync`` in the docs), and a replica that
acknowledged can itself fail before it is promoted.

Example::

    queue = Queue(Ingestion, client, durable=Durability(replicas=1, timeout=0.5))
    try:
        await queue.add(Ingestion.ingest_event, event, job_id=event.id)
    except NotReplicated:
        ...  # the job is on the primary only: it may run, or be lost if the primary dies now
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
)

from streamq._redis import Call, map_error
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError, NotReplicated, RedisUnavailable
from streamq.scripts import Script

__all__ = ["Durability", "run_durable", "run_durable_sync"]

_ROUNDS = 3
"""Sends of one batch at most: a NOSCRIPT or MOVED reply leaves its call for the next."""


@dataclass(frozen=True, slots=True)
class Durability:
    """Opt-in replication acknowledgement for a producer's adds.

    Args:
        replicas: how many replicas must confirm each add (``WAIT`` numreplicas), >= 1.
        timeout: how long to wait for them (a ``timedelta`` or seconds, > 0). On expiry the
            add raises :class:`~streamq.errors.NotReplicated`: it is not rolled back.
    """

    replicas: int = 1
    timeout: Duration = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) \
                or self.replicas < 1:
            raise ConfigurationError(
                f"Durability.replicas must be an integer >= 1, got {self.replicas!r}"
            )
        # WAIT 0 would block forever: at least 1 ms.
        to_ms(self.timeout, "Durability.timeout", minimum=1)

    @property
    def timeout_ms(self) -> int:
        """The timeout in whole milliseconds, as ``WAIT`` takes it."""
        return to_ms(self.timeout, "Durability.timeout", minimum=1)


def _is_cluster(client: Any) -> bool:
    return isinstance(client, redis.RedisCluster | aioredis.RedisCluster)


def _retry_elsewhere(reply: object) -> bool:
    """The call did not run on this node: a script to load, or a slot that moved."""
    if isinstance(reply, NoScriptError | MovedError | AskError):
        return True
    return isinstance(reply, ResponseError) and str(reply).startswith(
        ("NOSCRIPT", "MOVED", "ASK")
    )


class _Plan:
    """The state of one durable batch across rounds: replies, what is left to send, and the
    replica count the ``WAIT`` after each call's write confirmed."""

    def __init__(self, calls: Sequence[Call], durability: Durability, queue: str | None) -> None:
        self.calls = calls
        self.durability = durability
        self.queue = queue
        self.replies: list[Any] = [None] * len(calls)
        self.acked: list[int] = [0] * len(calls)
        self.todo = list(range(len(calls)))
        self.moved = False

    def commands(self, indexes: Sequence[int]) -> list[Sequence[Any]]:
        d = self.durability
        return [*(self.calls[i].redis_args() for i in indexes),
                ("WAIT", d.replicas, d.timeout_ms)]

    def absorb(self, indexes: Sequence[int], out: list[Any]) -> set[Script]:
        """Record one node's replies (the calls', then the WAIT's); return the scripts that
        node must load before the calls it did not run are sent again."""
        wait = out[-1]
        load: set[Script] = set()
        ran: list[int] = []
        for i, r in zip(indexes, out[:-1], strict=True):
            self.replies[i] = r
            if not _retry_elsewhere(r):
                ran.append(i)
            elif isinstance(r, MovedError | AskError) or str(r).startswith(("MOVED", "ASK")):
                self.todo.append(i)
                self.moved = True
            else:
                self.todo.append(i)
                load.add(self.calls[i].script)
        # A node that ran nothing (every call MOVED: it is a replica now) may refuse the WAIT.
        if ran and isinstance(wait, BaseException):
            mapped = map_error(wait, queue=self.queue)
            raise (mapped or wait) from wait
        for i in ran:
            self.acked[i] = int(wait)
        return load

    def by_node(self, client: Any) -> list[tuple[Any, list[int]]]:
        """The calls still to send, grouped by the node that serves their keys (one group,
        node None, on a single Redis)."""
        todo, self.todo, self.moved = self.todo, [], False
        if not _is_cluster(client):
            return [(None, todo)]
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i in todo:
            key = self.calls[i].keys[0]
            try:
                node = client.get_node_from_key(key)
            except SlotNotCoveredError as exc:  # mid-failover: no primary serves the slot
                raise RedisUnavailable(
                    f"queue {self.queue!r}: no primary serves the slot of {key!r} now "
                    "(a failover in progress?)",
                    queue=self.queue,
                ) from exc
            groups.setdefault(node.name, (node, []))[1].append(i)
        return list(groups.values())

    def result(self, job_ids: Sequence[Sequence[str]]) -> list[Any]:
        """Parsed replies; raises the first failed call's error, then NotReplicated."""
        for r in self.replies:
            if isinstance(r, BaseException):
                mapped = map_error(r, queue=self.queue)
                if mapped is None:
                    raise r
                if isinstance(mapped, RedisUnavailable) and _retry_elsewhere(r):
                    raise RedisUnavailable(
                        f"queue {self.queue!r}: the durable add could not reach the primary "
                        f"of its shard after {_ROUNDS} tries: {r}",
                        queue=self.queue,
                    ) from r
                raise mapped from r
        parsed = [c.parse(r) for c, r in zip(self.calls, self.replies, strict=True)]
        want = self.durability.replicas
        short = [i for i, n in enumerate(self.acked) if n < want]
        if short:
            ids = [jid for i in short for jid in job_ids[i]]
            got = min(self.acked[i] for i in short)
            shards = sorted({self.calls[i].keys[0] for i in short})
            raise NotReplicated(
                f"queue {self.queue!r}: {len(ids)} job(s) ({', '.join(ids[:5])}"
                f"{', ...' if len(ids) > 5 else ''}) were written on the primary but only "
                f"{got} of {want} replica(s) confirmed within {self.durability.timeout_ms} ms "
                f"(keys {', '.join(shards)}); they may run, or be lost if the primary fails "
                "now",
                queue=self.queue,
                job_id=ids[0],
                job_ids=ids,
                replicas=got,
                wanted=want,
            )
        return parsed


async def run_durable(
    client: Any,
    calls: Sequence[Call],
    durability: Durability,
    *,
    queue: str | None,
    job_ids: Sequence[Sequence[str]],
) -> list[Any]:
    """Run ``calls`` then ``WAIT`` on one connection per node (async); parsed replies in
    order. ``job_ids[i]`` are the jobs ``calls[i]`` adds, to name in errors.

    Raises:
        NotReplicated: every call ran, but some were confirmed by too few replicas.
        RedisUnavailable, RedisOutOfMemory, RedisRefused: as for a plain add.
    """
    plan = _Plan(calls, durability, queue)
    for _ in range(_ROUNDS):
        if not plan.todo:
            break
        if _is_cluster(client):
            # A fresh client has no slot table yet; one marked stale by a failed call
            # refreshes it here (both no-ops otherwise).
            try:
                await client.initialize()
            except Exception as exc:
                raise (map_error(exc, queue=queue) or exc) from exc
        for node, indexes in plan.by_node(client):
            await _send_async(client, node, plan, indexes)
        if plan.moved:
            await _refresh_async(client)
    return plan.result(job_ids)


def run_durable_sync(
    client: Any,
    calls: Sequence[Call],
    durability: Durability,
    *,
    queue: str | None,
    job_ids: Sequence[Sequence[str]],
) -> list[Any]:
    """The synchronous twin of :func:`run_durable`."""
    plan = _Plan(calls, durability, queue)
    for _ in range(_ROUNDS):
        if not plan.todo:
            break
        for node, indexes in plan.by_node(client):
            _send_sync(client, node, plan, indexes)
        if plan.moved:
            try:
                client.nodes_manager.initialize()
            except Exception as exc:
                raise (map_error(exc, queue=queue) or exc) from exc
    return plan.result(job_ids)


async def _refresh_async(client: Any) -> None:
    try:
        await client.nodes_manager.initialize()
    except Exception as exc:
        raise (map_error(exc) or exc) from exc


async def _send_async(client: Any, node: Any, plan: _Plan, indexes: list[int]) -> None:
    if node is None:
        pool = client.connection_pool
        conn = await pool.get_connection()
        release = pool.release
    else:
        conn = node.acquire_connection()
        release = node.release
    try:
        try:
            out = await _exchange_async(conn, plan.commands(indexes))
            for s in plan.absorb(indexes, out):
                await _exchange_async(conn, [("SCRIPT", "LOAD", s.source)])
        except (ConnectionError, OSError, redis.ConnectionError, redis.TimeoutError) as exc:
            await conn.disconnect()
            if node is not None:
                # The node may be gone for good (a failover): ask the live nodes for the slot
                # table now, so the next add goes where they say. While the failover is
                # still under way they name the dead node again, and the next add asks again.
                with contextlib.suppress(Exception):
                    await client.nodes_manager.initialize()
            raise (map_error(exc, queue=plan.queue) or exc) from exc
    finally:
        result = release(conn)
        if result is not None:
            await result


def _send_sync(client: Any, node: Any, plan: _Plan, indexes: list[int]) -> None:
    pool = (client if node is None else node.redis_connection).connection_pool
    conn = pool.get_connection()
    try:
        try:
            out = _exchange_sync(conn, plan.commands(indexes))
            for s in plan.absorb(indexes, out):
                _exchange_sync(conn, [("SCRIPT", "LOAD", s.source)])
        except (ConnectionError, OSError, redis.ConnectionError, redis.TimeoutError) as exc:
            conn.disconnect()
            if node is not None:
                with contextlib.suppress(Exception):  # see _send_async
                    client.nodes_manager.initialize()
            raise (map_error(exc, queue=plan.queue) or exc) from exc
    finally:
        pool.release(conn)


async def _exchange_async(conn: Any, commands: list[Sequence[Any]]) -> list[Any]:
    """Send ``commands`` in one write and read every reply; an error reply is returned in
    its place, so the replies after it are still read."""
    await conn.send_packed_command(conn.pack_commands(commands), False)
    out: list[Any] = []
    for _ in commands:
        try:
            out.append(await conn.read_response())
        except ResponseError as exc:
            out.append(exc)
    return out


def _exchange_sync(conn: Any, commands: list[Sequence[Any]]) -> list[Any]:
    conn.send_packed_command(conn.pack_commands(commands), False)
    out: list[Any] = []
    for _ in commands:
        try:
            out.append(conn.read_response())
        except ResponseError as exc:
            out.append(exc)
    return out
