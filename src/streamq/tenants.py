"""Tenant isolation: flag a noisy tenant so producers route its jobs to the secondary lane.

A queue whose contract names a ``tenant_field`` and declares a secondary lane
(``secondary_shards=``) can have tenants *flagged* for a while: a processor that sees a
tenant hit an upstream's throttling flags it (``await job.flag_tenant(...)``), an operator
does with :class:`~streamq.admin.QueueAdmin` or ``streamq tenant flag``. Every producer of the
queue then writes that tenant's new jobs to the secondary lane until the flag expires or is
lifted, so one tenant's backlog stops delaying everyone else's.

Flags live in Redis on the queue's primary lane (``<prefix>:{<queue>}:tenant-flags``, a zset
tenant -> expiry, and ``:tenant-reasons``); expiry is on the Redis clock.

Producers never read Redis per add: each keeps a local view of the flags (:class:`FlagView`)
that it refreshes at most every half staleness bound; a flag set or lifted at time *T* is
followed by every add from *T* + ``tenant_flags_staleness`` on (default 1 s) while Redis
answers. A flag's expiry needs no refresh: the view knows it on the Redis clock.

Example::

    admin = QueueAdmin(client, Ingestion)
    await admin.flag_tenant("project-7", timedelta(minutes=10), reason="upstream 429s")
    print(await admin.flagged_tenants())
    await admin.unflag_tenant("project-7")
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from streamq import ops
from streamq._redis import run_calls, run_calls_sync
from streamq.contracts import QueueContract
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError
from streamq.keys import DEFAULT_PREFIX, QueueKeys

__all__ = [
    "DEFAULT_FLAG_STALENESS_S",
    "FlagView",
    "TenantControl",
    "TenantFlag",
    "flag_tenant",
    "flag_tenant_sync",
    "flagged_tenants",
    "flagged_tenants_sync",
    "shared_view",
    "unflag_tenant",
    "unflag_tenant_sync",
]

_log = logging.getLogger("streamq.tenants")

DEFAULT_FLAG_STALENESS_S = 1.0
"""How stale a producer's view of the flagged tenants may be, by default (seconds)."""
MAX_TENANT_CHARS = 200
MAX_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class TenantFlag:
    """One flagged tenant of a queue.

    Attributes:
        queue: the queue (its primary lane's name).
        tenant: the tenant (the value of the contract's ``tenant_field``).
        expires_at_ms: when the flag ends, ms since the epoch on the Redis clock.
        reason: why it was flagged (free text; may be empty).
        since_ms: when it was first flagged (a re-flag while flagged keeps it), or None.
        by: who flagged it: ``processor``, ``admin``, ``cli``... (may be empty).
    """

    queue: str
    tenant: str
    expires_at_ms: int
    reason: str = ""
    since_ms: int | None = None
    by: str = ""


def flag_keys(contract: type[QueueContract], prefix: str) -> QueueKeys:
    """The keys holding ``contract``'s tenant flags (its primary lane's); refuses a queue
    that cannot route a tenant anywhere."""
    name = contract.queue_name
    if contract.secondary is None:
        raise ConfigurationError(
            f"queue {name!r} cannot flag tenants: it declares no secondary lane "
            "(set secondary_shards= on the contract)",
            queue=name,
        )
    if not contract.tenant_field:
        raise ConfigurationError(
            f"queue {name!r} cannot flag tenants: its contract names no tenant_field",
            queue=name,
        )
    return QueueKeys(prefix, name, contract.primary.shards)


def _check_tenant(queue: str, tenant: object) -> str:
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_CHARS:
        raise ConfigurationError(
            f"queue {queue!r}: tenant must be a string of 1..{MAX_TENANT_CHARS} characters, "
            f"got {tenant!r}",
            queue=queue,
        )
    return tenant


def _flag_call(
    contract: type[QueueContract], tenant: str, duration: Duration, reason: str, by: str,
    prefix: str,
) -> Any:
    qkeys = flag_keys(contract, prefix)
    queue = contract.queue_name
    _check_tenant(queue, tenant)
    try:
        ms = to_ms(duration, f"queue {queue!r}: tenant flag duration", minimum=1)
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc), queue=queue) from None
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ConfigurationError(
            f"queue {queue!r}: reason must be a string of at most {MAX_REASON_CHARS} "
            "characters", queue=queue,
        )
    return ops.tenant_flag(qkeys, tenant, duration_ms=ms,
                           reason_json=json.dumps({"reason": reason, "by": by}))


def _flagged(contract: type[QueueContract], tenant: str, reply: ops.TenantFlagReply,
             reason: str, by: str) -> TenantFlag:
    queue = contract.queue_name
    # A new flag is news; flagging a tenant that is flagged already (every throttled job of
    # it may do so) only keeps it flagged.
    _log.log(
        logging.INFO if reply.was_flagged else logging.WARNING,
        "tenant flag renewed" if reply.was_flagged else
        "tenant flagged: its new jobs go to the secondary lane until the flag expires",
        extra={"queue": queue, "tenant": tenant, "flag_reason": reason, "by": by,
               "expires_in_ms": reply.expiry_ms - reply.now_ms,
               "was_flagged": reply.was_flagged},
    )
    return TenantFlag(queue, tenant, reply.expiry_ms, reason, None, by)


def _unflag_call(contract: type[QueueContract], tenant: str, prefix: str) -> Any:
    qkeys = flag_keys(contract, prefix)
    _check_tenant(contract.queue_name, tenant)
    return ops.tenant_flag(qkeys, tenant, duration_ms=0, reason_json="{}")


def _unflagged(contract: type[QueueContract], tenant: str, reply: ops.TenantFlagReply,
               by: str) -> bool:
    if reply.was_flagged:
        _log.warning("tenant unflagged: its new jobs go to the primary lane again",
                     extra={"queue": contract.queue_name, "tenant": tenant, "by": by})
    return reply.was_flagged


def _flags(contract: type[QueueContract], read: ops.TenantFlagsRead) -> list[TenantFlag]:
    out = []
    for tenant, expiry in sorted(read.expiries.items(), key=lambda kv: (kv[1], kv[0])):
        info: dict[str, Any] = {}
        raw = read.reasons.get(tenant)
        if raw:
            try:
                got = json.loads(raw)
                info = got if isinstance(got, dict) else {}
            except ValueError:
                info = {}
        since = info.get("since_ms")
        out.append(TenantFlag(
            contract.queue_name, tenant, expiry, str(info.get("reason") or ""),
            int(since) if isinstance(since, int | float) else None, str(info.get("by") or ""),
        ))
    return out


async def flag_tenant(
    client: Any, contract: type[QueueContract], tenant: str, duration: Duration, *,
    reason: str = "", by: str = "", prefix: str = DEFAULT_PREFIX,
) -> TenantFlag:
    """Flag ``tenant`` of ``contract``'s queue for ``duration`` (timedelta or seconds).

    A flag only lengthens: flagging a tenant already flagged for longer keeps the later
    expiry. Logged (warning) with the queue, tenant, reason and who flagged it.

    Raises:
        ConfigurationError: the queue has no secondary lane or no ``tenant_field``; the
            tenant, duration or reason is malformed.
    """
    call = _flag_call(contract, tenant, duration, reason, by, prefix)
    (reply,) = await run_calls(client, [call], queue=contract.queue_name)
    return _flagged(contract, tenant, reply, reason, by)


def flag_tenant_sync(
    client: Any, contract: type[QueueContract], tenant: str, duration: Duration, *,
    reason: str = "", by: str = "", prefix: str = DEFAULT_PREFIX,
) -> TenantFlag:
    """The synchronous twin of :func:`flag_tenant`."""
    call = _flag_call(contract, tenant, duration, reason, by, prefix)
    (reply,) = run_calls_sync(client, [call], queue=contract.queue_name)
    return _flagged(contract, tenant, reply, reason, by)


async def unflag_tenant(
    client: Any, contract: type[QueueContract], tenant: str, *, by: str = "",
    prefix: str = DEFAULT_PREFIX,
) -> bool:
    """Lift ``tenant``'s flag now; True when it was flagged."""
    call = _unflag_call(contract, tenant, prefix)
    (reply,) = await run_calls(client, [call], queue=contract.queue_name)
    return _unflagged(contract, tenant, reply, by)


def unflag_tenant_sync(
    client: Any, contract: type[QueueContract], tenant: str, *, by: str = "",
    prefix: str = DEFAULT_PREFIX,
) -> bool:
    """The synchronous twin of :func:`unflag_tenant`."""
    call = _unflag_call(contract, tenant, prefix)
    (reply,) = run_calls_sync(client, [call], queue=contract.queue_name)
    return _unflagged(contract, tenant, reply, by)


async def flagged_tenants(
    client: Any, contract: type[QueueContract], *, prefix: str = DEFAULT_PREFIX
) -> list[TenantFlag]:
    """The tenants of ``contract``'s queue flagged now, soonest expiry first."""
    call = ops.tenant_flags(flag_keys(contract, prefix), with_reasons=True)
    (read,) = await run_calls(client, [call], queue=contract.queue_name)
    return _flags(contract, read)


def flagged_tenants_sync(
    client: Any, contract: type[QueueContract], *, prefix: str = DEFAULT_PREFIX
) -> list[TenantFlag]:
    """The synchronous twin of :func:`flagged_tenants`."""
    call = ops.tenant_flags(flag_keys(contract, prefix), with_reasons=True)
    (read,) = run_calls_sync(client, [call], queue=contract.queue_name)
    return _flags(contract, read)


class FlagView:
    """A producer's local view of a queue's flagged tenants, refreshed without a round trip
    per add.

    The view is refreshed when it is older than half the staleness bound: in the background
    (an asyncio task) by an async producer, inline under a lock by a sync one. An add that
    finds the view older than the whole bound (the producer was idle) waits for one refresh
    first. So at most one read per half bound, and never one per add. A flag's expiry is
    applied locally on the Redis clock (the read brings the server's time). When the read
    fails (Redis unreachable, an ACL without EVALSHA), the last view is kept and the read is
    tried again after half the bound; the failure is logged once.

    Args:
        contract: the queue's contract (with a tenant field and a secondary lane).
        prefix: the key prefix.
        staleness_s: the bound (seconds, > 0).
    """

    def __init__(self, contract: type[QueueContract], *, prefix: str, staleness_s: float) -> None:
        self.queue = contract.queue_name
        self.call = ops.tenant_flags(flag_keys(contract, prefix))
        self.staleness_s = staleness_s
        self.interval_s = staleness_s / 2
        self.expiries: dict[str, int] = {}
        self.server_ms = 0
        self.read_at = 0.0  # time.monotonic() when the last good read was sent
        self.tried_at = -1e18  # ... when the last read (good or not) was sent
        self.reads = 0
        self._failing = False
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None

    def flagged(self, tenant: str) -> bool:
        """Whether ``tenant`` is flagged, as of the last read (expiry applied now)."""
        expiry = self.expiries.get(tenant)
        if expiry is None:
            return False
        return expiry > self.server_ms + (time.monotonic() - self.read_at) * 1000

    def _apply(self, read: ops.TenantFlagsRead, sent: float) -> None:
        before = set(self.expiries)
        self.expiries, self.server_ms, self.read_at = read.expiries, read.now_ms, sent
        self.reads += 1
        if self._failing:
            self._failing = False
            _log.info("tenant flags read again", extra={"queue": self.queue})
        if set(read.expiries) != before:
            _log.debug("flagged tenants changed", extra={
                "queue": self.queue, "flagged": len(read.expiries)})

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            _log.warning(
                "could not read the flagged tenants; routing with the last view",
                extra={"queue": self.queue, "error": repr(exc)},
            )

    # -- sync ------------------------------------------------------------------------------
    def refresh_sync(self, client: Any) -> None:
        """Refresh when due (sync producers): inline, one thread at a time."""
        now = time.monotonic()
        if now - self.tried_at < self.interval_s:
            return
        must = now - self.read_at >= self.staleness_s
        if not self._lock.acquire(blocking=must):
            return  # another thread refreshes; the view is still within the bound
        try:
            now = time.monotonic()
            if now - self.tried_at < self.interval_s:
                return
            self.tried_at = now
            try:
                (read,) = run_calls_sync(client, [self.call], queue=self.queue)
            except Exception as exc:
                self._failed(exc)
                return
            self._apply(read, now)
        finally:
            self._lock.release()

    # -- async -----------------------------------------------------------------------------
    async def refresh(self, client: Any) -> None:
        """Refresh when due (async producers): in a background task, awaited only when the
        view is older than the bound."""
        now = time.monotonic()
        if now - self.tried_at < self.interval_s:
            return
        task = self._task
        loop = asyncio.get_running_loop()
        if task is None or task.done() or task.get_loop() is not loop:
            self.tried_at = now
            task = self._task = loop.create_task(self._read(client, now))
        if now - self.read_at >= self.staleness_s:
            await asyncio.shield(task)

    async def _read(self, client: Any, sent: float) -> None:
        try:
            (read,) = await run_calls(client, [self.call], queue=self.queue)
        except Exception as exc:
            self._failed(exc)
            return
        self._apply(read, sent)


_VIEWS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], FlagView]] = (
    weakref.WeakKeyDictionary()
)
_VIEWS_LOCK = threading.Lock()


def shared_view(client: Any, contract: type[QueueContract], *, prefix: str,
                staleness_s: float) -> FlagView:
    """The flag view of ``contract``'s queue for producers on ``client``: one per client,
    queue, prefix and bound, so that many short-lived producers (a ``Queue`` per request)
    share one view and its reads instead of each reading the flags on its first add. The
    view holds no reference to the client; it goes with the client."""
    key = (contract, prefix, staleness_s)
    with _VIEWS_LOCK:
        try:
            views = _VIEWS.setdefault(client, {})
        except TypeError:  # a client that cannot be weakly referenced: a view of its own
            return FlagView(contract, prefix=prefix, staleness_s=staleness_s)
        view = views.get(key)
        if view is None:
            view = views[key] = FlagView(contract, prefix=prefix, staleness_s=staleness_s)
        return view


class TenantControl:
    """A worker's handle to flag tenants of one queue from its processors
    (``job.flag_tenant``); it uses the worker's command connection."""

    def __init__(self, contract: type[QueueContract], client: Any, *, prefix: str) -> None:
        self.contract = contract
        self.client = client
        self.prefix = prefix
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Remember the worker's event loop (sync processors flag through it)."""
        self._loop = asyncio.get_running_loop()

    async def flag(self, tenant: str, duration: Duration, *, reason: str = "") -> TenantFlag:
        return await flag_tenant(self.client, self.contract, tenant, duration, reason=reason,
                                 by="processor", prefix=self.prefix)

    def flag_from_thread(self, tenant: str, duration: Duration, *, reason: str = "",
                         timeout_s: float = 10.0) -> TenantFlag:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the worker's event loop is not running")
        fut = asyncio.run_coroutine_threadsafe(
            self.flag(tenant, duration, reason=reason), loop
        )
        return fut.result(timeout_s)
