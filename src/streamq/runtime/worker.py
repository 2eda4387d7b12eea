"""One queue lane's consumer: fetch, dispatch, and the state its policies share.

Fetching asks for as many entries as there are free slots, all shards in one
``XREADGROUP`` (one per shard on a cluster, where the shards live in different slots).
Entries wait in a small local buffer until a slot (and a rate-limit token) is free; they are
held, so their locks are renewed, and they are released on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import ResponseError

from streamq import ops
from streamq._redis import map_error, run_calls
from streamq.app import Registration
from streamq.backoff import BackoffLike
from streamq.contracts import Lane
from streamq.envelope import RawJob
from streamq.hooks import Hooks
from streamq.job import Job
from streamq.keys import QueueKeys, ShardKeys
from streamq.options import WorkerOptions
from streamq.redact import scrub_text, secret_values
from streamq.runtime import maintenance
from streamq.runtime.process import process_entry
from streamq.runtime.renewal import HeldEntries, LockRenewer
from streamq.runtime.settle import SettleOp, Settler

__all__ = ["Worker"]

_log = logging.getLogger("streamq.worker")

Entry = tuple[int, str, dict[bytes, bytes]]


async def stop_tasks(
    tasks: Iterable[asyncio.Task[Any]], *, every_s: float = 0.05, timeout_s: float = 10.0
) -> None:
    """Cancel ``tasks`` and wait until they end, cancelling again every ``every_s``.

    One ``cancel()`` is not enough: on Python 3.11 ``asyncio.wait_for`` (which redis-py uses
    around socket reads) swallows a cancellation that lands as the reply arrives, and the
    task carries on as if it was never cancelled.
    """
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + timeout_s
    while pending:
        for t in pending:
            t.cancel()
        _done, pending = await asyncio.wait(pending, timeout=every_s)
        if pending and time.monotonic() > deadline:
            _log.warning("tasks did not stop after cancellation",
                         extra={"tasks": sorted(t.get_name() for t in pending)})
            return


def _group_gone(exc: BaseException) -> bool:
    """True when a read failed because the stream or its group was deleted.

    A read blocked on a stream whose key is deleted fails with ``UNBLOCKED the stream key no
    longer exists``; the next read of the missing group with ``NOGROUP``.
    """
    msg = str(exc)
    return isinstance(exc, ResponseError) and ("NOGROUP" in msg or msg.startswith("UNBLOCKED"))


class Worker:
    """Consumes one lane (a queue, or its secondary lane) with one processor registration."""

    def __init__(
        self,
        *,
        lane: Lane,
        registration: Registration,
        options: WorkerOptions,
        client: Any,
        fetch_clients: Sequence[Any],
        renew_client: Any,
        prefix: str,
        group: str,
        consumer: str,
        hooks: Hooks,
        cluster: bool = False,
    ) -> None:
        self.lane = lane
        self.contract = lane.contract
        self.registration = registration
        self.options = options
        self.client = client
        self.fetch_clients = list(fetch_clients)
        self.keys = QueueKeys(prefix, lane.name, lane.shards)
        self.shards: tuple[ShardKeys, ...] = self.keys.shards
        self._by_stream = {s.stream.encode(): s for s in self.shards}
        self.group = group
        self.consumer = consumer
        self.hooks = hooks
        self.cluster = cluster
        self.max_attempts = options.attempts or self.contract.defaults.attempts
        self.backoff: BackoffLike = options.backoff or self.contract.defaults.backoff
        self.held = HeldEntries(self.shards)
        self.running: dict[tuple[int, str], Job[Any]] = {}
        self.buffer: deque[Entry] = deque()
        self.active = 0
        self.started_total = 0
        self.last_started = time.monotonic()
        self.clock_offset_ms = 0.0
        self.closing = False
        self.pool = ThreadPoolExecutor(
            max_workers=options.concurrency + 4, thread_name_prefix=f"streamq-{lane.name}"
        )
        self.settler = Settler(
            client, queue=lane.name, group=group, consumer=consumer, hooks=hooks,
            on_settled=self._settled,
        )
        self.renewer = LockRenewer(
            renew_client,
            self.held,
            queue=lane.name,
            group=group,
            consumer=consumer,
            interval_s=options.lock_renew_interval_ms / 1000,
            on_lost=self._lost_from_thread,
            on_error=self._renew_failed_from_thread,
        )
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._service: list[asyncio.Task[None]] = []
        self._readers: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused_until = 0.0
        self._paused = False

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.lane.name

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.ensure_groups()
        await maintenance.sync_clock(self)
        self.renewer.start()
        self.hooks.consumer_started(
            self.name, [s.name for s in self.shards], list(self.contract.jobs)
        )
        spawn = self._loop.create_task
        self._service = [
            spawn(self.settler.run(), name=f"settle-{self.name}"),
            spawn(self._dispatcher(), name=f"dispatch-{self.name}"),
            spawn(maintenance.promote_loop(self), name=f"promote-{self.name}"),
            spawn(maintenance.reclaim_loop(self), name=f"reclaim-{self.name}"),
        ]
        groups = [[s] for s in self.shards] if self.cluster else [list(self.shards)]
        if len(self.fetch_clients) < len(groups):
            raise ValueError(f"{len(groups)} readers need as many fetch clients")
        self._readers = [
            spawn(self._reader(g, c), name=f"fetch-{self.name}")
            for g, c in zip(groups, self.fetch_clients, strict=False)
        ]

    async def ensure_groups(self) -> None:
        for s in self.shards:
            try:
                await self.client.xgroup_create(s.stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop fetching, let running jobs finish up to the shutdown timeout, release the rest.

        Entries fetched but not started are released at once; running jobs past the timeout
        are cancelled and released (fenced), so another worker takes them immediately.
        """
        if self.closing:
            return
        self.closing = True
        if not self._service:
            # start() never finished: nothing was fetched, so nothing is held or running.
            self.renewer.stop()
            self.pool.shutdown(wait=False, cancel_futures=True)
            return
        timeout = self.options.shutdown_timeout_s if timeout_s is None else timeout_s
        async with self._cond:
            self._cond.notify_all()
        # Nothing may add to the buffer once it is released: stop fetching, dispatching,
        # promoting and reclaiming first (a reclaim would hand this worker entries to hold).
        settle_task, *others = self._service
        await stop_tasks([*self._readers, *others])
        while self.buffer:
            idx, eid, _ = self.buffer.popleft()
            self.settle(SettleOp("release", self.shards[idx], eid))
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            # A cancelled processor may still clean up: re-cancel it only now and then.
            await stop_tasks(pending, every_s=1.0)
        if not await self.settler.wait_idle(max(5.0, timeout)):
            _log.warning(
                "shutting down with settles not sent (Redis unreachable); those jobs stay "
                "pending and run again elsewhere after their lock expires",
                extra={"queue": self.name, "unsent": self.settler.pending},
            )
        self.renewer.stop()
        await stop_tasks([settle_task])
        await maintenance.leave_group(self)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- fetching and dispatch -------------------------------------------------------------
    def _free(self) -> int:
        return self.options.concurrency - self.active

    async def _reader(self, shards: list[ShardKeys], fetch_client: Any) -> None:
        streams = {s.stream: ">" for s in shards}
        backoff = 0.05
        while not self.closing:
            async with self._cond:
                await self._cond.wait_for(
                    lambda: self.closing or (not self.buffer and self._free() > 0)
                )
            if self.closing:
                return
            try:
                if await self.is_paused():
                    await asyncio.sleep(0.2)
                    continue
                reply = await fetch_client.xreadgroup(
                    self.group,
                    self.consumer,
                    streams,
                    count=self._free(),
                    block=self.options.block_timeout_ms,
                )
                backoff = 0.05
            except Exception as exc:
                if _group_gone(exc):
                    _log.warning("consumer group missing; recreating", extra={"queue": self.name})
                    await self._safe(self.ensure_groups())
                    continue
                if map_error(exc) is None:
                    # A reader that dies leaves the worker silently wedged: report, go on.
                    _log.exception("unexpected error fetching jobs; retrying",
                                   extra={"queue": self.name})
                self.hooks.redis_error(self.name, exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                # Capped low: after an outage of any length the worker fetches again within
                # ~3 s of Redis's return (a 5 s cap left it idle up to 7.5 s); a failed
                # attempt every 2 s costs Redis nothing.
                backoff = min(backoff * 2, 2.0)
                continue
            self._take(reply)

    def _take(self, reply: Any) -> None:
        if not reply:
            return
        items = reply.items() if isinstance(reply, dict) else reply
        for stream, entries in items:
            entries = entries[0] if isinstance(entries, list) and entries and isinstance(
                entries[0], list
            ) else entries
            shard = self._by_stream[stream if isinstance(stream, bytes) else stream.encode()]
            for eid, fields in entries:
                sid = eid.decode() if isinstance(eid, bytes) else eid
                self.held.add(shard.index, sid)
                self.buffer.append((shard.index, sid, fields))
        self._notify()

    def add_reclaimed(self, shard: ShardKeys, entry_id: str, fields: dict[bytes, bytes]) -> bool:
        """Queue a reclaimed entry; False when this worker already holds it (still running)."""
        if (shard.index, entry_id) in self.held:
            return False
        self.held.add(shard.index, entry_id)
        self.buffer.append((shard.index, entry_id, fields))
        self._notify()
        return True

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._cond:
                self._cond.notify_all()

        task = asyncio.get_running_loop().create_task(wake())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatcher(self) -> None:
        limiter = self.options.limiter
        while True:
            async with self._cond:
                await self._cond.wait_for(
                    lambda: self.closing or (bool(self.buffer) and self._free() > 0)
                )
            if self.closing:
                return
            # A read already in flight when the lane was paused can still return entries:
            # hand them back (fenced release) so a paused lane holds nothing.
            if await self._safe(self.is_paused()):
                while self.buffer:
                    idx, eid, _ = self.buffer.popleft()
                    self.settle(SettleOp("release", self.shards[idx], eid))
                continue
            n = min(len(self.buffer), self._free())
            if limiter is not None:
                grant = await self._safe(
                    run_calls(
                        self.client,
                        [ops.limiter(self.keys, max_jobs=limiter.max_jobs,
                                     window_ms=limiter.duration_ms, want=n)],
                        queue=self.name,
                    )
                )
                if grant is None:
                    await asyncio.sleep(0.2)
                    continue
                n = grant[0].granted
                if n == 0:
                    await asyncio.sleep(max(grant[0].window_left_ms, 1) / 1000)
                    continue
            for _ in range(n):
                if not self.buffer or self.closing:
                    break
                self._start(*self.buffer.popleft())

    def _start(
        self, idx: int, eid: str, fields: dict[bytes, bytes], *, report: bool = True
    ) -> None:
        self.active += 1
        self.started_total += 1
        self.last_started = time.monotonic()
        if report:
            self.hooks.active_changed(self.name, self.active)
        task = asyncio.get_running_loop().create_task(self._guarded(idx, eid, fields))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, idx: int, eid: str, fields: dict[bytes, bytes]) -> None:
        shard = self.shards[idx]
        try:
            await process_entry(self, shard, eid, fields)
        except asyncio.CancelledError:
            # Shutdown ran out of time: hand the job back so another worker takes it now.
            self.settle(SettleOp("release", shard, eid))
            raise
        except Exception:
            _log.exception("unexpected error processing a job", extra={"queue": self.name})
            # Its settle may never come: stop renewing it, so it stalls and is reclaimed
            # (then dead-lettered as stalled) instead of being held here forever.
            self.held.discard(idx, eid)
        finally:
            self.active -= 1
            if self.buffer and not self.closing and self.options.limiter is None:
                # The freed slot takes the next buffered entry now: waking the dispatcher
                # (and the reader, whose wait needs an empty buffer) through the condition
                # cost two task switches per job. The active count is unchanged: no report.
                self._start(*self.buffer.popleft(), report=False)
            else:
                self.hooks.active_changed(self.name, self.active)
                async with self._cond:
                    self._cond.notify_all()

    # -- settles and locks -----------------------------------------------------------------
    def settle(self, op: SettleOp) -> None:
        """Submit a settle; when it lands the entry is no longer held (see :meth:`_settled`)."""
        self.settler.submit(op)

    def _settled(self, op: SettleOp, ok: bool) -> None:
        self.held.discard(op.shard.index, op.entry_id)
        if not ok:
            self.hooks.lock_lost(self.name, op.shard.name, 1)
            _log.warning(
                "lock lost: another worker reclaimed the job; not acknowledged",
                extra={"queue": self.name, "shard": op.shard.name, "entry_id": op.entry_id},
            )

    def _renew_failed_from_thread(self, exc: BaseException) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.hooks.redis_error, self.name, exc)

    def _lost_from_thread(self, idx: int, ids: list[str]) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._mark_lost, idx, ids)

    def _mark_lost(self, idx: int, ids: list[str]) -> None:
        lost = set(ids)
        keep = deque(e for e in self.buffer if not (e[0] == idx and e[1] in lost))
        dropped = len(self.buffer) - len(keep)
        self.buffer = keep
        for eid in ids:
            job = self.running.get((idx, eid))
            if job is not None:
                job._lost = True
            else:
                self.held.discard(idx, eid)
        if dropped:
            self.hooks.lock_lost(self.name, self.shards[idx].name, dropped)

    def renew_now(self) -> None:
        self.renewer.renew_now()

    def on_dead(self, shard: ShardKeys, job_name: str, reason: str) -> None:
        self.hooks.job_dead_lettered(self.name, shard.name, job_name, reason)

    # -- helpers ---------------------------------------------------------------------------
    def server_now_ms(self) -> float:
        """Now on the Redis server's clock (estimated from the last promote round trip)."""
        return time.time() * 1000 + self.clock_offset_ms

    def log_failure(self, raw: RawJob, exc: BaseException, *, final: bool) -> None:
        _log.warning(
            "job failed; dead-lettering" if final else "job failed; will retry",
            extra={
                "queue": self.name,
                "job_id": raw.id,
                "job": raw.name,
                "attempt": raw.attempt,
                "error_type": type(exc).__name__,
                "error": scrub_text(
                    str(exc), secret_values(raw.payload_json, self.contract.secret_fields)
                )[:500],
            },
        )

    async def is_paused(self) -> bool:
        """Whether the lane is paused (meta hash ``paused``); cached for up to a second."""
        now = time.monotonic()
        if now >= self._paused_until:
            self._paused = bool(await self.client.hget(self.keys.meta, "paused"))
            self._paused_until = now + (0.2 if self._paused else 1.0)
        return self._paused

    async def _safe(self, coro: Any) -> Any:
        """Await ``coro``; a Redis connection error is reported and yields None."""
        try:
            return await coro
        except Exception as exc:
            if map_error(exc) is None:
                raise
            self.hooks.redis_error(self.name, exc)
            return None

    def local_idle(self) -> bool:
        return not self.buffer and self.active == 0 and self.settler.pending == 0 and not len(
            self.held
        )

    def stats(self) -> dict[str, int]:
        return {
            "active": self.active,
            "buffered": len(self.buffer),
            "held": len(self.held),
            "started": self.started_total,
        }

    async def wait_stopped(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._service, *self._readers, return_exceptions=True)
