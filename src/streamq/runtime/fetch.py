"""Fetching within the bound: running + buffered never exceeds ``concurrency + prefetch``.

While settles flow, the next read rides in the same round trip (:meth:`Reader.rider`), so
a read brings several entries even when jobs finish one at a time; otherwise the blocking
reader reads whatever room there is.

``XREADGROUP``'s ``COUNT`` applies **per stream**: one read over S shards with COUNT n can
return S x n entries. So a read over every shard asks each for ``room // S``; when the room
is smaller than S it first tries a non-blocking read of ``room`` shards (rotating which), and
only then blocks on all of them with COUNT 1, handing back at once (fenced release) whatever
came beyond the room. On a cluster each shard has its own blocking reader; they reserve room
from the same :class:`Intake` before they read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from streamq._redis import Call
from streamq.errors import ForeignConsumerGroup
from streamq.keys import ShardKeys
from streamq.runtime.context import LaneContext
from streamq.runtime.settle import Rider
from streamq.scripts import script

__all__ = ["Entry", "Intake", "Reader", "check_foreign_groups", "ensure_groups"]

_log = logging.getLogger("streamq.worker")

SCARCE_BLOCK_MS = 100
"""Blocking read time of a cluster reader while room is scarcer than shards: short, so a
reader blocked on an empty shard does not keep a slot from a shard that has jobs."""


@dataclass(slots=True)
class Entry:
    """One fetched or claimed entry waiting to start (``starts``: the run it begins)."""

    shard: int
    entry_id: str
    fields: dict[bytes, bytes]
    starts: int = 1


class Intake:
    """The lane's slots and its local buffer; wakes whoever waits for room or entries.

    Owns ``active`` (jobs running), ``buffer`` (entries held, not started) and ``reserved``
    (room promised to reads in flight). Only this class writes them.
    """

    def __init__(self, concurrency: int, prefetch: int) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.active = 0
        self.reserved = 0
        self.buffer: deque[Entry] = deque()
        self.peak_held = 0
        self._waiters: list[asyncio.Future[None]] = []

    # -- accounting --------------------------------------------------------------------------
    @property
    def bound(self) -> int:
        return self.concurrency + self.prefetch

    def room(self) -> int:
        """How many more entries this lane may take (read, claim) now."""
        return self.bound - self.active - len(self.buffer) - self.reserved

    def free_slots(self) -> int:
        return self.concurrency - self.active

    def claimable(self) -> int:
        """Entries a reclaim may take: slots free once the buffer has started.

        Room reserved by a blocking read in flight is not subtracted: an idle worker is
        almost always blocked in a read, and its claims must not starve. If that read then
        returns entries too, whatever exceeds the bound is handed back at once.
        """
        return max(0, self.free_slots() - len(self.buffer))

    def _note(self) -> None:
        held = self.active + len(self.buffer)
        if held > self.peak_held:
            self.peak_held = held

    # -- changes -----------------------------------------------------------------------------
    def add(self, entries: Sequence[Entry], *, front: bool = False) -> None:
        if front:
            self.buffer.extendleft(reversed(entries))
        else:
            self.buffer.extend(entries)
        self._note()
        self.wake()

    def take(self) -> Entry | None:
        """The next entry to start, counted as running."""
        if not self.buffer or self.active >= self.concurrency:
            return None
        entry = self.buffer.popleft()
        self.active += 1
        self._note()
        return entry

    def drain(self) -> list[Entry]:
        """Every buffered entry (to hand back)."""
        out = list(self.buffer)
        self.buffer.clear()
        self.wake()
        return out

    def drop(self, shard: int, ids: set[str]) -> int:
        """Forget buffered entries whose lock was lost; how many were dropped."""
        keep = deque(e for e in self.buffer if not (e.shard == shard and e.entry_id in ids))
        dropped = len(self.buffer) - len(keep)
        self.buffer = keep
        if dropped:
            self.wake()
        return dropped

    def finished(self) -> None:
        """A running job freed its slot."""
        self.active -= 1
        self.wake()

    def reserve(self, n: int) -> None:
        self.reserved += n

    def unreserve(self, n: int) -> None:
        self.reserved -= n
        self.wake()

    # -- waiting -----------------------------------------------------------------------------
    def wake(self) -> None:
        """Wake every waiter so it re-checks its condition (synchronous, no task)."""
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for f in waiters:
                if not f.done():
                    f.set_result(None)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait until ``predicate()`` holds; False when ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not predicate():
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            if deadline is None:
                await fut
                continue
            left = deadline - loop.time()
            if left <= 0:
                return False
            handle = loop.call_later(left, _resolve, fut)
            try:
                await fut
            finally:
                handle.cancel()
        return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def ensure_groups(ctx: LaneContext) -> None:
    """Create the consumer group on every shard's stream (and the stream) if missing.

    Looks first (a read): Redis refuses ``XGROUP CREATE`` under ``maxmemory`` even when the
    group exists, and a worker must be able to start and drain a backlog then.
    """
    for s in ctx.shards:
        try:
            groups = await ctx.client.xinfo_groups(s.stream)
        except ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            groups = []
        if any(_text(g["name"]) == ctx.group for g in groups):
            continue
        try:
            await ctx.client.xgroup_create(s.stream, ctx.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


async def check_foreign_groups(ctx: LaneContext) -> None:
    """Refuse a stream that has a consumer group other than ours.

    Completing deletes the entry (``XDEL``) for every group: a second group would lose jobs
    without a trace. streamq supports one group per queue; fan-out is refused.

    Raises:
        ForeignConsumerGroup: naming the stream and the other groups.
    """
    for s in ctx.shards:
        try:
            groups = await ctx.client.xinfo_groups(s.stream)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                continue
            raise
        names = sorted(_text(g["name"]) for g in groups)
        foreign = [n for n in names if n != ctx.group]
        if foreign:
            raise ForeignConsumerGroup(
                f"stream {s.stream!r} of queue {ctx.name!r} has consumer group(s) {foreign} "
                f"besides this worker's group {ctx.group!r}. Completing a job deletes it for "
                "every group, so the other group would lose jobs; streamq does not support "
                f"fan-out. Remove the other group (XGROUP DESTROY {s.stream} <group>) or "
                "use the same group name everywhere (WORKER_GROUP).",
                queue=ctx.name, shard=s.name, groups=foreign,
            )


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def group_gone(exc: BaseException) -> bool:
    """True when a read failed because the stream or its group was deleted."""
    msg = str(exc)
    return isinstance(exc, ResponseError) and ("NOGROUP" in msg or msg.startswith("UNBLOCKED"))


class Reader:
    """One blocking read loop over ``shards`` (all of them, or one on a cluster).

    ``on_excess(entries)`` hands back entries a read returned beyond the room (fenced
    release); ``is_paused()`` is checked before every read; ``on_ok()`` after each.
    """

    def __init__(
        self,
        ctx: LaneContext,
        intake: Intake,
        client: Any,
        shards: Sequence[ShardKeys],
        *,
        is_paused: Callable[[], Awaitable[bool]],
        on_excess: Callable[[list[Entry]], None],
        on_taken: Callable[[list[Entry]], None],
        on_ok: Callable[[], None],
        closing: Callable[[], bool],
        readers: int = 1,
        paused_now: Callable[[], bool] = lambda: False,
        settling: Callable[[], bool] = lambda: False,
    ) -> None:
        self.ctx = ctx
        self.intake = intake
        self.client = client
        self.shards = list(shards)
        self.is_paused = is_paused
        self.on_excess = on_excess
        self.on_taken = on_taken
        self.on_ok = on_ok
        self.closing = closing
        self.readers = readers
        self.paused_now = paused_now
        self.settling = settling
        self.rides = 0
        self._by_stream = {s.stream.encode(): s for s in self.shards}
        self._rotate = 0
        self.reads = 0

    def _should_read(self) -> bool:
        # While settles are on their way the next read rides with them (see rider()): not
        # one blocking read per freed slot. Otherwise any room is read at once: a slot freed
        # while long jobs run must not wait for them to end.
        if self.intake.room() <= 0:
            return False
        return self.readers > 1 or not self.settling()

    async def run(self) -> None:
        """Read until the lane closes; errors propagate to the supervisor."""
        while not self.closing():
            await self.intake.wait_for(lambda: self.closing() or self._should_read())
            if self.closing():
                return
            if await self.is_paused():
                await asyncio.sleep(0.2)
                continue
            try:
                await self._read_once()
            except ResponseError as exc:
                if not group_gone(exc):
                    raise
                _log.warning("consumer group missing; recreating it",
                             extra={"queue": self.ctx.name})
                await ensure_groups(self.ctx)

    async def _read_once(self) -> None:
        room = self.intake.room()
        if room <= 0:
            return
        n_shards = len(self.shards)
        if self.readers > 1:
            # A cluster reader of one shard: reserve part of the shared room.
            share = max(1, room // self.readers)
            block = self.ctx.options.block_timeout_ms if room >= self.readers else SCARCE_BLOCK_MS
            if not await self._read(self.shards, share, block, reserve=share):
                # Let the readers of other shards take the room before reserving it again:
                # without this yield one reader of an empty shard keeps it all.
                await asyncio.sleep(0)
            return
        if room >= n_shards:
            await self._read(self.shards, room // n_shards, self.ctx.options.block_timeout_ms,
                             reserve=room)
            return
        # Fewer free places than shards: a non-blocking look at `room` shards first.
        start = self._rotate % n_shards
        self._rotate += room
        subset = [self.shards[(start + i) % n_shards] for i in range(room)]
        if await self._read(subset, 1, None, reserve=room):
            return
        await self._read(self.shards, 1, self.ctx.options.block_timeout_ms, reserve=room)

    async def _read(
        self, shards: Sequence[ShardKeys], count: int, block: int | None, *, reserve: int
    ) -> int:
        self.intake.reserve(reserve)
        try:
            if self.ctx.cluster:
                reply = await self._read_routed(shards, count, block)
            else:
                reply = await self.client.xreadgroup(
                    self.ctx.group, self.ctx.consumer, {s.stream: ">" for s in shards},
                    count=count, block=block,
                )
        finally:
            self.intake.unreserve(reserve)
        self.reads += 1
        self.on_ok()
        return self._keep(self._entries(reply))

    async def _read_routed(
        self, shards: Sequence[ShardKeys], count: int, block: int | None
    ) -> Any:
        """A cluster read sent to the node that serves the shard's slot, as this client's
        slot table says.

        redis-py's async cluster client asks one fixed node (``COMMAND GETKEYS``) where a
        command with movable keys such as ``XREADGROUP`` should go. When that node dies in a
        failover every read fails before it is sent, so the client never refreshes its
        topology and the reader never recovers. Routing by the stream's slot here avoids the
        question; a failed call marks the slot table stale, and ``initialize()`` refreshes it
        before the next read picks its node.
        """
        await self.client.initialize()
        node = self.client.get_node_from_key(shards[0].stream)
        args: list[str | int] = ["XREADGROUP", "GROUP", self.ctx.group, self.ctx.consumer,
                                 "COUNT", count]
        if block is not None:
            args += ["BLOCK", block]
        streams = [s.stream for s in shards]
        args += ["STREAMS", *streams, *([">"] * len(streams))]
        return await self.client.execute_command(*args, target_nodes=node)

    def _keep(self, entries: list[Entry]) -> int:
        """Hold what a read returned: up to the room, the excess handed back at once.

        A reply that arrives once the lane is closing (a read riding a flush already in
        flight) is handed back whole: the buffer was released already.
        """
        if not entries:
            return 0
        room = 0 if self.closing() else max(0, self.intake.room())
        keep, excess = entries[:room], entries[room:]
        self.on_taken(entries)
        if keep:
            self.intake.add(keep)
        if excess:
            self.on_excess(excess)
        return len(entries)

    def rider(self) -> Rider | None:
        """A non-blocking read of the lane's room, to send with a settle flush.

        Under load a flush goes every few ms: the next entries come back in the same round
        trip as the acknowledgements, instead of a blocking read of their own. Not on a
        cluster (each shard is on its own node) nor while the lane is paused or closing.
        """
        if self.readers != 1 or self.closing() or self.paused_now():
            return None
        room = self.intake.room()
        if room <= 0:
            return None
        n_shards = len(self.shards)
        if room >= n_shards:
            shards, count = self.shards, room // n_shards
        else:
            start = self._rotate % n_shards
            self._rotate += room
            shards, count = [self.shards[(start + i) % n_shards] for i in range(room)], 1
        self.intake.reserve(room)
        streams = [s.stream for s in shards]
        command: tuple[str | int, ...] = (
            "XREADGROUP", "GROUP", self.ctx.group, self.ctx.consumer, "COUNT", count,
            "STREAMS", *streams, *([">"] * len(streams)),
        )

        def done(reply: Any) -> None:
            self.intake.unreserve(room)
            if isinstance(reply, BaseException):
                return  # the blocking reader sees the same problem and handles it
            self.rides += 1
            self._keep(self._entries(reply))

        # A plain command, not a script: the Call's script is only consulted on NOSCRIPT.
        return Rider(Call(script("complete"), (), (), command=command), done)

    def _entries(self, reply: Any) -> list[Entry]:
        if not reply:
            return []
        out: list[Entry] = []
        items = reply.items() if isinstance(reply, dict) else reply
        for stream, entries in items:
            if isinstance(entries, list) and entries and isinstance(entries[0], list):
                entries = entries[0]  # RESP3 shape
            shard = self._by_stream[stream if isinstance(stream, bytes) else stream.encode()]
            for eid, fields in entries:
                sid = eid.decode() if isinstance(eid, bytes) else eid
                out.append(Entry(shard.index, sid, fields))
        return out
