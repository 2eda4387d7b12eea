"""One queue lane's consumer: wires fetch, dispatch, run, settle, renewal and maintenance.

The policies live in their own modules and share a :class:`LaneContext`; this class only
connects them and runs their loops under a :class:`Supervisor`. The invariants it wires:

* entries held (running + buffered) never exceed ``concurrency + prefetch`` (fetch.py);
* an outcome is reported only once Redis confirmed it (process.py, settle.py);
* a stalled entry is claimed only when it can start, and charged only for starts (reclaim.py);
* no loop dies silently (supervise.py);
* a graceful stop leaves this consumer nothing pending (heartbeat.reconcile_pending).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamq.app import Registration
from streamq.contracts import Lane
from streamq.hooks import Hooks
from streamq.keys import QueueKeys, ShardKeys
from streamq.options import WorkerOptions
from streamq.runtime import heartbeat
from streamq.runtime.context import LaneContext, ServerClock
from streamq.runtime.dispatch import Dispatcher, PauseFlag
from streamq.runtime.fetch import Entry, Intake, Reader, check_foreign_groups, ensure_groups
from streamq.runtime.process import JobRunner
from streamq.runtime.promote import Promoter
from streamq.runtime.reclaim import Reclaimer
from streamq.runtime.renewal import HeldEntries, LockRenewer
from streamq.runtime.settle import SettleOp, Settler, Status
from streamq.runtime.supervise import RedisStatus, Supervisor
from streamq.runtime.tenancy import TenantGate
from streamq.runtime.tracking import Tracker
from streamq.tenants import TenantControl

__all__ = ["Worker", "stop_tasks"]

_log = logging.getLogger("streamq.worker")


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
        status: RedisStatus | None = None,
    ) -> None:
        self.ctx = ctx = LaneContext(
            lane=lane, keys=QueueKeys(prefix, lane.name, lane.shards), group=group,
            consumer=consumer, options=options, hooks=hooks, client=client,
            clock=ServerClock(), cluster=cluster,
        )
        self.registration = registration
        self.fetch_clients = list(fetch_clients)
        self.status = status or RedisStatus(hooks)
        self.closing = False
        self.batch = registration.batch
        # A batch lane's slots are entries: concurrency batches of up to max_size each.
        per_slot = self.batch.max_size if self.batch else 1
        self.intake = Intake(options.concurrency * per_slot, options.prefetch)
        self.held = HeldEntries(ctx.shards)
        self.pause = PauseFlag(client, ctx.keys.meta)
        self.supervisor = Supervisor(lane.name, hooks, self.status)
        self.pool = ThreadPoolExecutor(
            max_workers=options.concurrency + 4, thread_name_prefix=f"streamq-{lane.name}"
        )
        self.settler = Settler(ctx, on_settled=self._settled, on_error=self._redis_error,
                               on_ok=self._flushed, delay_s=options.settle_delay_s,
                               batch_target=options.concurrency * per_slot)
        self.tracker = Tracker(ctx)
        self.renewer = LockRenewer(
            renew_client, self.held, queue=lane.name, group=group, consumer=consumer,
            interval_s=options.lock_renew_interval_ms / 1000,
            on_lost=self._lost_from_thread, on_error=self._renew_failed_from_thread,
            riders=self.tracker.riders,
        )
        closing = self._is_closing
        contract = lane.contract
        self.gate = (TenantGate(ctx, closing=closing)
                     if options.tenant_concurrency and contract.tenant_field else None)
        self.tenants = (TenantControl(contract, client, prefix=prefix)
                        if contract.tenant_field and contract.secondary else None)
        self.runner = JobRunner(ctx, registration, self.pool, submit=self.settler.submit,
                                extend_lock=self.renewer.renew_now, gate=self.gate,
                                tenants=self.tenants, tracker=self.tracker)
        self.promoter = Promoter(ctx, on_ok=self.status.ok, closing=closing)
        self.reclaimer = Reclaimer(ctx, self.intake, self.held, on_lost=self._mark_lost,
                                   is_paused=self.pause, closing=closing,
                                   on_finals=self.tracker.write_finals)
        self.heartbeat = heartbeat.Heartbeat(ctx, on_ok=self.status.ok, closing=closing)
        self.readers: list[Reader] = []
        self.dispatcher = Dispatcher(
            ctx, self.intake, self.runner, self.held, pause=self.pause,
            hand_back=self._hand_back, closing=closing, batch=self.batch,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False

    # -- what the rest of the package reads ------------------------------------------------------
    @property
    def name(self) -> str:
        return self.ctx.name

    @property
    def lane(self) -> Lane:
        return self.ctx.lane

    @property
    def contract(self) -> Any:
        return self.ctx.contract

    @property
    def options(self) -> WorkerOptions:
        return self.ctx.options

    @property
    def client(self) -> Any:
        return self.ctx.client

    @property
    def keys(self) -> QueueKeys:
        return self.ctx.keys

    @property
    def shards(self) -> tuple[ShardKeys, ...]:
        return self.ctx.shards

    @property
    def group(self) -> str:
        return self.ctx.group

    @property
    def consumer(self) -> str:
        return self.ctx.consumer

    @property
    def hooks(self) -> Hooks:
        return self.ctx.hooks

    @property
    def active(self) -> int:
        return self.intake.active

    def server_now_ms(self) -> float:
        """Now on the Redis server's clock."""
        return self.ctx.clock.now_ms()

    def _is_closing(self) -> bool:
        return self.closing

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Check and create the groups, then start every loop under supervision.

        Raises:
            ForeignConsumerGroup: a stream has another consumer group (jobs would be lost).
        """
        self._loop = asyncio.get_running_loop()
        await check_foreign_groups(self.ctx)
        await ensure_groups(self.ctx)
        await self.ctx.clock.sync(self.ctx.client)
        self.renewer.start()
        self.hooks.consumer_started(self.name, [s.name for s in self.shards],
                                    list(self.contract.jobs))
        sup = self.supervisor
        sup.spawn("settler", self.settler.run)
        d = self.dispatcher
        sup.spawn("dispatcher", d.run_batches if self.batch else d.run)
        sup.spawn("promoter", self.promoter.run)
        sup.spawn("reclaimer", self.reclaimer.run)
        sup.spawn("heartbeat", self.heartbeat.run)
        if self.gate is not None:
            sup.spawn("tenant-slots", self.gate.run)
        if self.tenants is not None:
            self.tenants.bind()
        groups = [[s] for s in self.shards] if self.ctx.cluster else [list(self.shards)]
        if len(self.fetch_clients) < len(groups):
            raise ValueError(f"{len(groups)} readers need as many fetch clients")
        for i, (shards, client) in enumerate(zip(groups, self.fetch_clients, strict=False)):
            reader = Reader(
                self.ctx, self.intake, client, shards, is_paused=self.pause,
                on_excess=self._hand_back, on_taken=self._hold, on_ok=self.status.ok,
                closing=self._is_closing, readers=len(groups),
                paused_now=lambda: self.pause.value,
                settling=lambda: self.settler.pending > 0,
            )
            self.readers.append(reader)
            if len(groups) == 1:
                self.settler.rider = reader.rider
            sup.spawn(f"reader-{i}" if len(groups) > 1 else "reader", reader.run)
        self._started = True

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop fetching, let running jobs finish up to the shutdown timeout, release the rest.

        Entries fetched but not started are released at once; running jobs past the timeout
        are cancelled and released (fenced), so another worker takes them immediately. Then
        the consumer's own pending list is reconciled: whatever a cancelled read or claim left
        under its name is released too, so a graceful stop leaves it nothing pending.
        """
        if self.closing:
            return
        self.closing = True
        self.intake.wake()
        if not self._started:
            self.renewer.stop()
            self.pool.shutdown(wait=False, cancel_futures=True)
            return
        timeout = self.options.shutdown_timeout_s if timeout_s is None else timeout_s
        tasks = self.supervisor.tasks
        # Nothing may add to the buffer once it is released: stop fetching, dispatching,
        # promoting and reclaiming first (a claim would hand this worker entries to hold).
        await stop_tasks([t for n, t in tasks.items() if n != "settler"])
        self._hand_back(self.intake.drain())
        pending: set[asyncio.Task[None]] = set()
        if self.dispatcher.jobs:
            _done, pending = await asyncio.wait(set(self.dispatcher.jobs), timeout=timeout)
            # Cancel only processors still running (their jobs are released). A task whose
            # processor returned waits for its settle's answer, which _settle_all brings (or
            # gives up on: "unsettled"); it reports the outcome. A cancelled processor may
            # still clean up: re-cancel it only now and then.
            await stop_tasks(self.dispatcher.processing(pending), every_s=1.0)
        await self._settle_all(max(5.0, timeout))
        left = {t for t in pending if not t.done()}
        if left:
            _done, left = await asyncio.wait(left, timeout=5.0)
            await stop_tasks(left)
        try:
            await heartbeat.reconcile_pending(self.ctx, self.held)
        except Exception as exc:
            # Whatever it could not hand back stays pending and is reclaimed after its lock.
            self.status.error(self.name, exc, task="shutdown")
            _log.warning("could not reconcile the pending list at shutdown",
                         extra={"queue": self.name, "error": repr(exc)})
        self.renewer.stop()
        await stop_tasks([tasks["settler"]])
        try:
            await heartbeat.leave_group(self.ctx)
        except Exception as exc:
            self.status.error(self.name, exc, task="shutdown")
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _settle_all(self, timeout_s: float) -> None:
        if await self.settler.wait_idle(timeout_s):
            return
        left = self.settler.abandon()
        _log.warning(
            "shutting down with settles Redis never answered (unreachable); those jobs stay "
            "pending and run again elsewhere after their lock expires",
            extra={"queue": self.name, "unsettled": left},
        )

    # -- fetching and dispatch -------------------------------------------------------------------
    def _hold(self, entries: list[Entry]) -> None:
        for e in entries:
            self.held.add(e.shard, e.entry_id)

    def _hand_back(self, entries: list[Entry]) -> None:
        """Release entries this worker will not run (excess of a read, a paused lane)."""
        for e in entries:
            self.settler.submit(SettleOp("release", self.shards[e.shard], e.entry_id))

    # -- settles and locks -----------------------------------------------------------------------
    def _settled(self, op: SettleOp, status: Status | None) -> None:
        if status is None:
            return  # unanswered at shutdown: still pending in Redis, reclaimed elsewhere
        self.held.discard(op.shard.index, op.entry_id)
        if status == Status.APPLIED:
            return
        self.hooks.lock_lost(self.name, op.shard.name, 1)
        _log.warning(
            "lock lost: another worker reclaimed the job; not acknowledged"
            if status == Status.OTHER_OWNER else
            "lock lost: the job was settled elsewhere (or deleted) meanwhile; not acknowledged",
            extra={"queue": self.name, "shard": op.shard.name, "entry_id": op.entry_id,
                   "settle": op.kind},
        )

    def _flushed(self) -> None:
        self.status.ok()
        self.intake.wake()  # a reader that left the read to the flush re-checks its room

    def _redis_error(self, exc: BaseException) -> None:
        self.status.error(self.name, exc, task="settler")

    def _renew_failed_from_thread(self, exc: BaseException) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._renew_failed, exc)

    def _renew_failed(self, exc: BaseException) -> None:
        self.status.error(self.name, exc, task="renewer")

    def _lost_from_thread(self, idx: int, ids: list[str]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._mark_lost, idx, ids)

    def _mark_lost(self, idx: int, ids: list[str]) -> None:
        rest = self.runner.mark_lost(idx, ids)
        dropped = self.intake.drop(idx, set(rest))
        for eid in rest:
            self.held.discard(idx, eid)
        if dropped:
            self.hooks.lock_lost(self.name, self.shards[idx].name, dropped)

    def renew_now(self) -> None:
        self.renewer.renew_now()

    # -- introspection ---------------------------------------------------------------------------
    def local_idle(self) -> bool:
        return (not self.intake.buffer and self.intake.active == 0
                and self.settler.pending == 0 and not len(self.held))

    def stats(self) -> dict[str, int]:
        return {
            "active": self.intake.active,
            "buffered": len(self.intake.buffer),
            "held": len(self.held),
            "started": self.dispatcher.started_total,
            "settling": self.settler.pending,
            "peak_held": self.intake.peak_held,
        }

    def wedged_for(self, now: float | None = None) -> float:
        """See :meth:`Dispatcher.wedged_for`."""
        return self.dispatcher.wedged_for(now)

    @property
    def started_total(self) -> int:
        return self.dispatcher.started_total

    @property
    def last_started(self) -> float:
        return self.dispatcher.last_started

    async def wait_stopped(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.supervisor.tasks.values(), return_exceptions=True)
