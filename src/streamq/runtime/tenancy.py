"""The per-tenant concurrency cap: at most ``tenant_concurrency`` jobs of one tenant run at
once, across every worker and both lanes of a queue.

Before a job of a capped queue runs, it takes one of its tenant's slots: a lease in the zset
``<prefix>:{<queue>}:tenant-slots:<tenant>`` (holder -> expiry on the Redis clock), taken by a
script that first drops expired leases. The slot is given back as soon as the processor
returns (or raises, or is cancelled), renewed every lock renewal interval while the job runs,
and expires one ``lock_duration`` after the last renewal: a killed worker's slots free
themselves within that bound.

A job that finds its tenant's slots all taken does not run and spends no attempt: it is
re-delayed by about ``tenant_wait`` (the job runner settles it like a ``Retry``) and counted
(``tenant_cap_waited``). Requests of the jobs started together are sent in one pipelined
round trip, so a dispatch round costs one call, not one per job.

Renewal runs on the event loop (a loop blocked for a whole lock duration lets the slots expire:
the tenant may then briefly run over its cap; no job is lost or run twice by it).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from streamq import ops
from streamq._redis import run_calls_each
from streamq.envelope import RawJob
from streamq.keys import QueueKeys, ShardKeys
from streamq.runtime.context import LaneContext

__all__ = ["TenantGate", "TenantSlot"]

_log = logging.getLogger("streamq.worker")


class TenantSlot:
    """One running job's slot (or no slot: a job without a tenant); given back once."""

    __slots__ = ("_gate", "holder", "tenant")

    def __init__(self, gate: TenantGate | None, tenant: str, holder: str) -> None:
        self._gate = gate
        self.tenant = tenant
        self.holder = holder

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.give_back(self.tenant, self.holder)

    def then(self, free: Callable[[], None]) -> Callable[[], None]:
        """``free``, giving this slot back first (the processor is done with it)."""

        def both() -> None:
            self.release()
            free()

        return both


class TenantGate:
    """Takes, renews and gives back one lane's tenant slots.

    Args:
        ctx: the lane (its options carry ``tenant_concurrency`` and ``tenant_wait``).
        closing: whether the lane is closing (ends the renewal loop).
    """

    def __init__(self, ctx: LaneContext, *, closing: Callable[[], bool]) -> None:
        cap = ctx.options.tenant_concurrency
        assert cap is not None
        assert ctx.contract.tenant_field
        self.ctx = ctx
        self.cap = cap
        self.field = ctx.contract.tenant_field
        primary = ctx.contract.primary
        # Both lanes of a queue share the tenant's slots: the keys of its primary lane.
        self.keys = QueueKeys(ctx.keys.prefix, primary.name, primary.shards)
        self.lease_ms = ctx.options.lock_duration_ms
        self.renew_s = ctx.options.lock_renew_interval_ms / 1000
        self.wait_ms = ctx.options.tenant_wait_ms
        self.closing = closing
        self.held: dict[str, set[str]] = {}
        self._acquires: list[tuple[str, str, asyncio.Future[bool]]] = []
        self._releases: dict[str, list[str]] = {}
        self._flusher: asyncio.Task[None] | None = None

    def tenant_of(self, payload: Any) -> str | None:
        value = getattr(payload, self.field, None)
        return None if value is None or value == "" else str(value)

    def delay_ms(self) -> int:
        """How long a job over its tenant's cap waits: ``tenant_wait``, jittered."""
        return max(1, round(self.wait_ms * random.uniform(0.75, 1.25)))

    async def enter(self, shard: ShardKeys, raw: RawJob, payload: Any) -> TenantSlot | None:
        """A slot for this job (a no-op slot when it has no tenant), or None: its tenant
        runs ``tenant_concurrency`` jobs already (or Redis did not answer)."""
        tenant = self.tenant_of(payload)
        if tenant is None:
            return TenantSlot(None, "", "")
        holder = f"{self.ctx.consumer}/{self.ctx.name}/{shard.index}/{raw.entry_id}"
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._acquires.append((tenant, holder, fut))
        self._kick()
        try:
            granted = await fut
        except asyncio.CancelledError:
            # The slot may have been granted meanwhile: give it back (a ZREM of a slot never
            # taken is harmless).
            self._releases.setdefault(tenant, []).append(holder)
            self._kick()
            raise
        if not granted:
            _log.debug("tenant at its concurrency cap; job waits", extra={
                "queue": self.ctx.name, "job_id": raw.id, "tenant": tenant,
                "tenant_concurrency": self.cap})
            return None
        self.held.setdefault(tenant, set()).add(holder)
        return TenantSlot(self, tenant, holder)

    def give_back(self, tenant: str, holder: str) -> None:
        holders = self.held.get(tenant)
        if holders is not None:
            holders.discard(holder)
            if not holders:
                del self.held[tenant]
        self._releases.setdefault(tenant, []).append(holder)
        self._kick()

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # One turn of the loop lets every job of this dispatch round queue its request.
        await asyncio.sleep(0)
        while self._acquires or self._releases:
            acquires, self._acquires = self._acquires, []
            releases, self._releases = self._releases, {}
            try:
                await self._send(acquires, releases)
            except Exception:
                # Not Redis (_send answers those itself): a bug. Say so; the next request
                # starts a new flusher, and every job waiting below is answered.
                _log.exception("tenant slot requests failed", extra={"queue": self.ctx.name})
                self.ctx.hooks.task_crashed(self.ctx.name, "tenant-slots")
            finally:
                # Whatever happened, no job waits forever for its answer: unanswered is
                # refused (the job waits and tries again).
                for _, _, fut in acquires:
                    if not fut.done():
                        fut.set_result(False)

    async def _send(self, acquires: list[tuple[str, str, asyncio.Future[bool]]],
                    releases: dict[str, list[str]]) -> None:
        calls = [ops.tenant_slot_release(self.keys, t, hs) for t, hs in releases.items()]
        calls += [
            ops.tenant_slot_acquire(self.keys, t, cap=self.cap, lease_ms=self.lease_ms,
                                    holder=h)
            for t, h, _ in acquires
        ]
        try:
            replies: list[Any] = await run_calls_each(self.ctx.client, calls,
                                                      queue=self.ctx.name)
        except Exception as exc:
            replies = [exc] * len(calls)
        failed = [r for r in replies[: len(releases)] if isinstance(r, Exception)]
        if failed:
            # Their leases expire on their own, one lock duration from their last renewal.
            _log.debug("could not give tenant slots back", extra={
                "queue": self.ctx.name, "error": repr(failed[0])})
        for (tenant, holder, fut), reply in zip(acquires, replies[len(releases):],
                                                 strict=True):
            granted = isinstance(reply, ops.SlotGrant) and reply.granted
            if isinstance(reply, Exception):
                # The request may have landed with its reply lost: give the slot back.
                self._releases.setdefault(tenant, []).append(holder)
            if not fut.done():
                fut.set_result(granted)

    async def run(self) -> None:
        """Renew the leases of the slots held, every lock renewal interval."""
        while not self.closing():
            await asyncio.sleep(self.renew_s)
            if self.held:
                await self.renew()

    async def renew(self) -> None:
        tenants = [(t, sorted(hs)) for t, hs in self.held.items() if hs]
        calls = [ops.tenant_slot_renew(self.keys, t, lease_ms=self.lease_ms, holders=hs)
                 for t, hs in tenants]
        replies = await run_calls_each(self.ctx.client, calls, queue=self.ctx.name)
        for (tenant, _), reply in zip(tenants, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            for holder in reply:
                self.held.get(tenant, set()).discard(holder)
                _log.warning(
                    "a tenant slot's lease expired while its job ran; the tenant may run "
                    "over its cap until it ends",
                    extra={"queue": self.ctx.name, "tenant": tenant, "holder": holder},
                )
