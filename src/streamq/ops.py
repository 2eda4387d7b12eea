"""One typed wrapper per Lua script: the only code that knows each script's argument order.

Every function returns a :class:`~streamq._redis.Call`; run a batch of them with
:func:`~streamq._redis.run_calls` (async) or :func:`~streamq._redis.run_calls_sync`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import chain
from typing import Any, Protocol

from streamq._redis import Call
from streamq.envelope import FIELD_NAMES, flat_fields
from streamq.keys import QueueKeys, ShardKeys
from streamq.scripts import script

__all__ = [
    "SETTLE_MEMO_MS",
    "EnqueueItem",
    "EnqueueJob",
    "LimiterGrant",
    "PromoteResult",
    "ReclaimPage",
    "ReclaimedEntry",
    "SettleStatus",
    "TrackedDone",
    "TrackedFinal",
    "cancel",
    "complete",
    "complete_tracked",
    "control",
    "dead_retry",
    "delayed_member",
    "drop_consumer",
    "enqueue",
    "enqueue_ready",
    "fail",
    "job_status",
    "limiter",
    "progress",
    "promote",
    "reclaim",
    "release",
    "renew",
    "retry",
    "settle_tracked",
    "tenant_flag",
    "tenant_flags",
    "tenant_slot_acquire",
    "tenant_slot_release",
    "tenant_slot_renew",
    "track_final",
]


def _str(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _str_list(reply: Any) -> list[str]:
    return [_str(x) for x in reply or []]


def delayed_member(job_id: str) -> str:
    """A fresh, unique key for one delayed record of ``job_id``: ``<job_id>:<16 hex digits>``.

    The delayed zset member and the jobs hash field of a delayed job. Never the bare job id:
    a caller-given id can be added again once its dedup window is over, and a retry of a
    running copy can be stored while a newer copy waits; keyed by the id, the second record
    would overwrite the first although both were accepted. The envelope keeps the real id.
    """
    return f"{job_id}:{os.urandom(8).hex()}"


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    """One job to enqueue: its id, field values (FIELD_NAMES order), delay and dedup flag.

    ``member`` keys a delayed job's record (see :func:`delayed_member`); when None,
    :func:`enqueue` draws one. Ready jobs do not use it. ``ctl``, when set, makes the job
    tracked (:mod:`streamq.jobstatus`): its ``ctl`` field's JSON.
    """

    job_id: str
    values: Sequence[str | bytes]
    delay_ms: int = 0
    dedup: bool = False
    member: str | None = None
    ctl: str | None = None


class EnqueueJob(Protocol):
    """What :func:`enqueue` and :func:`enqueue_ready` read of a job: an :class:`EnqueueItem`,
    or a producer's own record of the job with these attributes (no copy per job)."""

    @property
    def job_id(self) -> str: ...

    @property
    def values(self) -> Sequence[str | bytes]: ...

    @property
    def delay_ms(self) -> int: ...

    @property
    def dedup(self) -> bool: ...

    @property
    def member(self) -> str | None: ...

    @property
    def ctl(self) -> str | None: ...


def _added(_reply: Any) -> list[bool]:
    return [True]


def enqueue_ready(shard: ShardKeys, item: EnqueueJob) -> Call:
    """Enqueue one ready job that has no dedup marker: a plain ``XADD`` of the fields, names
    and order exactly as :func:`enqueue`'s script writes them. Reply: ``[True]``.

    One command is as atomic as the script, costs Redis about a fifth of its time and the
    client fewer arguments to send; a single add without ``job_id`` or delay takes it.
    """
    if item.dedup or item.delay_ms > 0 or item.ctl or len(item.values) != len(FIELD_NAMES):
        raise ValueError(
            f"job {item.job_id!r} needs the enqueue script (dedup, delay, tracking or fields)"
        )
    stream = shard.stream
    fields = chain.from_iterable(zip(FIELD_NAMES, item.values, strict=True))
    return Call(script("enqueue"), (stream,), (), _added, command=("XADD", stream, "*", *fields))


_NF = len(FIELD_NAMES)
_READY = ("", 0, 0)
"""member, delay ms and flags of a ready job without a dedup marker or tracking."""

_DEDUP, _TRACKED = 1, 2
"""The enqueue script's per-job flag bits."""


def _member_args(it: EnqueueJob, flags: int) -> tuple[str, int, int]:
    member = "" if it.delay_ms <= 0 else it.member or delayed_member(it.job_id)
    return member, it.delay_ms, flags


def _bools(reply: Any) -> list[bool]:
    return [bool(x) for x in reply]


def enqueue(shard: ShardKeys, items: Sequence[EnqueueJob], *, dedup_window_ms: int) -> Call:
    """Enqueue ``items`` on one shard atomically. Reply: one bool per item (False: duplicate).

    A delayed item is stored under its unique ``member`` (drawn here when it has none), so
    two accepted adds of one job id are two delayed jobs. The call is built once: a re-send
    of the same call (a lost reply) writes the same members again, not new ones.
    """
    keys = [shard.stream, shard.delayed, shard.jobs, shard.tracked]
    args: list[Any] = [dedup_window_ms, _NF, *FIELD_NAMES]
    extend = args.extend
    for it in items:
        values = it.values
        if len(values) != _NF:
            # The script reads a fixed number of values per job: a short list would shift
            # every later job's arguments.
            raise ValueError(f"job {it.job_id!r}: expected {_NF} field values, got {len(values)}")
        ctl = it.ctl
        if it.dedup:
            keys.append(shard.dedup(it.job_id))
            extend(_member_args(it, _DEDUP | (_TRACKED if ctl else 0)))
        elif it.delay_ms > 0 or ctl:
            extend(_member_args(it, _TRACKED if ctl else 0))
        else:
            extend(_READY)  # the common case of a bulk add: ready now, no marker
        extend(values)
        if ctl:
            args.append(ctl)
    return Call(script("enqueue"), keys, args, _bools)


class SettleStatus(IntEnum):
    """What a settle script found for one entry (and did, when ``APPLIED``)."""

    APPLIED = 1
    """This call (or an earlier send of the same token) applied it."""
    OTHER_OWNER = 0
    """The entry is pending under another consumer: our lock was lost; left untouched."""
    GONE = -1
    """Pending for no one: settled by someone else, or deleted."""


SETTLE_MEMO_MS = 600_000
"""How long a settle call's reply is kept under its token, answering a re-send the same."""


def _statuses(reply: Any) -> list[SettleStatus]:
    return [SettleStatus(int(x)) for x in reply or []]


def _status(reply: Any) -> SettleStatus:
    return SettleStatus(int(reply))


def complete(
    shard: ShardKeys, group: str, consumer: str, entry_ids: Sequence[str], *, token: str
) -> Call:
    """Ack + delete the entries this consumer owns, fenced.

    ``token`` names this call: send it again with the same token (the reply was lost) and
    it answers what the first send did. Reply: one :class:`SettleStatus` per id, in order.
    """
    return Call(
        script("complete"),
        [shard.stream, shard.starts, shard.settled(token)],
        [group, consumer, SETTLE_MEMO_MS, *entry_ids],
        _statuses,
    )


def renew(shard: ShardKeys, group: str, consumer: str, entry_ids: Sequence[str]) -> Call:
    """Reset the idle time of owned entries. Reply: the ids this consumer no longer owns
    (pending for another consumer, or for no one)."""
    return Call(script("renew"), [shard.stream], [group, consumer, *entry_ids], _str_list)


def release(
    shard: ShardKeys, group: str, consumer: str, entry_ids: Sequence[str], *, token: str
) -> Call:
    """Re-add owned entries at the tail (attempt unchanged), then ack + delete, fenced.

    An owned entry whose body was deleted is left pending (the reclaimer records it) and
    reported ``GONE``. Under OOM the call fails with nothing changed. Reply: one
    :class:`SettleStatus` per id, in order; a re-send with the same ``token`` answers the same.
    """
    return Call(
        script("release"),
        [shard.stream, shard.starts, shard.settled(token), shard.tracked],
        [group, consumer, SETTLE_MEMO_MS, *entry_ids],
        _statuses,
    )


def retry(
    shard: ShardKeys,
    group: str,
    consumer: str,
    *,
    entry_id: str,
    member: str,
    delay_ms: int,
    values: Sequence[str | bytes],
    token: str,
    extra_fields: Sequence[str | bytes] = (),
) -> Call:
    """Move an owned entry to the delayed set with new fields, fenced.

    ``extra_fields`` are flat name/value pairs kept after the envelope's own (fields a
    newer producer wrote that this version does not know: a retry must not drop them).

    ``member`` keys the delayed record (delayed zset member, jobs hash field): unique per
    retry, so two copies of one job id never overwrite each other. Under OOM the call fails
    with nothing changed. Reply: a :class:`SettleStatus`; a re-send with the same ``token``
    answers the same.
    """
    return Call(
        script("retry"),
        [shard.stream, shard.delayed, shard.jobs, shard.starts, shard.settled(token)],
        [
            group,
            consumer,
            entry_id,
            member,
            max(0, delay_ms),
            SETTLE_MEMO_MS,
            *flat_fields(list(values)),
            *extra_fields,
        ],
        _status,
    )


def fail(
    shard: ShardKeys,
    group: str,
    consumer: str,
    *,
    entry_id: str,
    dead_fields: Sequence[str | bytes],
    dead_cap: int,
    token: str,
) -> Call:
    """Move an owned entry to the dead stream, fenced. ``dead_fields`` is flat name/value pairs.

    Under OOM the call fails with nothing changed. Reply: a :class:`SettleStatus`; a re-send
    with the same ``token`` answers the same.
    """
    return Call(
        script("fail"),
        [shard.stream, shard.dead, shard.starts, shard.settled(token)],
        [group, consumer, entry_id, dead_cap, SETTLE_MEMO_MS, *dead_fields],
        _status,
    )


@dataclass(frozen=True, slots=True)
class PromoteResult:
    moved: int
    next_due_ms: int | None
    now_ms: int


def _promote_result(r: Any) -> PromoteResult:
    nxt = int(r[1])
    return PromoteResult(int(r[0]), None if nxt < 0 else nxt, int(r[2]))


def promote(shard: ShardKeys, *, limit: int = 500) -> Call:
    """Move up to ``limit`` due delayed jobs into the stream."""
    return Call(
        script("promote"),
        [shard.delayed, shard.jobs, shard.stream, shard.tracked],
        [limit],
        _promote_result,
    )


@dataclass(frozen=True, slots=True)
class ReclaimedEntry:
    """A claimed entry to start now; ``starts`` is the start this run is (2 = second run)."""

    entry_id: str
    fields: dict[bytes, bytes]
    starts: int


@dataclass(frozen=True, slots=True)
class TrackedFinal:
    """A tracked job that a script dead-lettered without writing its final record (the key
    was not known in advance): what :func:`track_final` needs."""

    job_id: str
    keep_ms: int
    job_name: str
    attempt: int
    error: str


@dataclass(frozen=True, slots=True)
class ReclaimPage:
    """One reclaim call: the next cursor, entries to start, ids dead-lettered as stalled, and
    ids whose payload was deleted while pending (recorded in the dead stream), and the
    tracked jobs among the stalled ones whose final record is still to write."""

    cursor: str
    entries: list[ReclaimedEntry]
    stalled: list[str]
    lost: list[str]
    finals: list[TrackedFinal] = field(default_factory=list)


def _bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def _reclaim_page(r: Any) -> ReclaimPage:
    run = r[1]
    entries = []
    for i in range(0, len(run), 3):
        flat = run[i + 1]
        fields = {_bytes(flat[j]): _bytes(flat[j + 1]) for j in range(0, len(flat), 2)}
        entries.append(ReclaimedEntry(_str(run[i]), fields, int(run[i + 2])))
    f = r[4] if len(r) > 4 else []
    finals = [
        TrackedFinal(_str(f[i]), int(f[i + 1]), _str(f[i + 2]), int(f[i + 3]), _str(f[i + 4]))
        for i in range(0, len(f), 5)
    ]
    return ReclaimPage(_str(r[0]), entries, _str_list(r[2]), _str_list(r[3]), finals)


def reclaim(
    shard: ShardKeys,
    group: str,
    consumer: str,
    *,
    min_idle_ms: int,
    cursor: str = "0-0",
    count: int,
    max_stalled_count: int,
    dead_cap: int,
) -> Call:
    """Claim up to ``count`` entries idle over ``min_idle_ms`` (one XAUTOCLAIM page).

    ``count`` is the most entries the caller will start now (its free slots): every returned
    entry counts as started. An entry already started more than ``max_stalled_count`` times
    without a settle is dead-lettered as stalled instead. Loop while there are free slots
    and the cursor is not ``0-0``.
    """
    if count < 1:
        # XAUTOCLAIM refuses COUNT 0; a worker with no free slot has nothing to claim.
        raise ValueError(f"reclaim count must be at least 1, got {count}")
    return Call(
        script("reclaim"),
        [shard.stream, shard.dead, shard.starts, shard.tracked],
        [group, consumer, min_idle_ms, cursor, count, max_stalled_count, dead_cap],
        _reclaim_page,
    )


@dataclass(frozen=True, slots=True)
class LimiterGrant:
    granted: int
    window_start_ms: int
    window_left_ms: int


def limiter(
    qkeys: QueueKeys, *, max_jobs: int, window_ms: int, want: int, refund_window: int = 0
) -> Call:
    """Take ``want`` tokens (or give back ``-want`` from ``refund_window``)."""
    return Call(
        script("limiter"),
        [qkeys.limiter],
        [max_jobs, window_ms, want, refund_window],
        lambda r: LimiterGrant(int(r[0]), int(r[1]), int(r[2])),
    )


def drop_consumer(shard: ShardKeys, group: str, consumer: str) -> Call:
    """Delete ``consumer`` from the group only if it has nothing pending. Reply: True if gone."""
    return Call(script("drop_consumer"), [shard.stream], [group, consumer], bool)


def dead_retry(shard: ShardKeys, dead_ids: Sequence[str]) -> Call:
    """Re-enqueue dead letters as fresh jobs (attempt 1, due now), removing them from ``dead``.

    Reply: one int per id: 1 re-enqueued, 0 not found, -1 not a job (a lost payload; kept).
    """
    return Call(
        script("dead_retry"),
        [shard.stream, shard.dead],
        [len(FIELD_NAMES), *FIELD_NAMES, *dead_ids],
        lambda r: [int(x) for x in r],
    )


@dataclass(frozen=True, slots=True)
class TenantFlagReply:
    """What :func:`tenant_flag` did: the flag's expiry now (0: not flagged), the server time,
    and whether the tenant was flagged before the call."""

    expiry_ms: int
    now_ms: int
    was_flagged: bool


def tenant_flag(qkeys: QueueKeys, tenant: str, *, duration_ms: int, reason_json: str) -> Call:
    """Flag ``tenant`` for ``duration_ms`` (0: lift its flag). A flag only lengthens.

    ``qkeys`` are the keys of the queue's primary lane; ``reason_json`` a JSON object stored
    beside the flag (the script adds ``since_ms``).
    """
    return Call(
        script("tenant_flag"),
        [qkeys.tenant_flags, qkeys.tenant_reasons],
        [tenant, max(0, duration_ms), reason_json],
        lambda r: TenantFlagReply(int(r[0]), int(r[1]), bool(int(r[2]))),
    )


@dataclass(frozen=True, slots=True)
class TenantFlagsRead:
    """The tenants flagged now: tenant -> expiry ms, their reasons' JSON (when asked), and
    the server time of the read."""

    now_ms: int
    expiries: dict[str, int]
    reasons: dict[str, str]


def _flags_read(r: Any) -> TenantFlagsRead:
    flat = r[1] or []
    expiries = {_str(flat[i]): int(float(flat[i + 1])) for i in range(0, len(flat), 2)}
    names = list(expiries)
    reasons = {
        names[i]: _str(v) for i, v in enumerate(r[2] or []) if v not in (None, False, 0)
    }
    return TenantFlagsRead(int(r[0]), expiries, reasons)


def tenant_flags(qkeys: QueueKeys, *, with_reasons: bool = False) -> Call:
    """Read the tenants flagged now (read only). Reply: a :class:`TenantFlagsRead`."""
    return Call(
        script("tenant_flags"),
        [qkeys.tenant_flags, qkeys.tenant_reasons],
        [1 if with_reasons else 0],
        _flags_read,
    )


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """A slot request's answer: granted or not, the tenant's slots taken now, and (refused)
    ms until the next of them expires."""

    granted: bool
    taken: int
    retry_in_ms: int


def tenant_slot_acquire(qkeys: QueueKeys, tenant: str, *, cap: int, lease_ms: int,
                        holder: str) -> Call:
    """Take one of ``tenant``'s ``cap`` running slots for ``holder`` as a ``lease_ms`` lease.
    A holder that has its slot already keeps it. Reply: a :class:`SlotGrant`."""
    return Call(
        script("tenant_slot_acquire"),
        [qkeys.tenant_slots(tenant)],
        [cap, lease_ms, holder],
        lambda r: SlotGrant(bool(int(r[0])), int(r[1]), int(r[2])),
    )


def tenant_slot_renew(qkeys: QueueKeys, tenant: str, *, lease_ms: int,
                      holders: Sequence[str]) -> Call:
    """Extend the leases of ``holders``' slots. Reply: the holders whose slot had expired."""
    return Call(
        script("tenant_slot_renew"),
        [qkeys.tenant_slots(tenant)],
        [lease_ms, *holders],
        _str_list,
    )


def tenant_slot_release(qkeys: QueueKeys, tenant: str, holders: Sequence[str]) -> Call:
    """Give back ``holders``' slots: one ``ZREM`` (no script needed: one command is atomic;
    the script is named only for the call's bookkeeping). Reply: slots removed."""
    key = qkeys.tenant_slots(tenant)
    return Call(script("tenant_slot_renew"), (key,), (), int,
                command=("ZREM", key, *holders))


# -- tracked jobs (streamq.jobstatus) ---------------------------------------------------------
def _tracked_settle(reply: Any) -> tuple[SettleStatus, str]:
    return SettleStatus(int(reply[0])), _str(reply[1])


def settle_tracked(
    shard: ShardKeys,
    group: str,
    consumer: str,
    *,
    entry_id: str,
    job_id: str,
    action: str,
    keep_ms: int,
    record: str,
    token: str,
    member: str = "",
    delay_ms: int = 0,
    dead_cap: int = 0,
    fields: Sequence[str | bytes] = (),
) -> Call:
    """Settle one tracked job, fenced: ``action`` is ``complete``, ``cancel``, ``retry`` (to
    ``member`` after ``delay_ms``, ``fields`` the new envelope flat) or ``fail`` (``fields``
    the dead letter flat). ``record`` is the final record's JSON (kept ``keep_ms``).

    A cancel request turns a retry or a fail into a cancel. Reply: ``(status, outcome)``,
    outcome ``c`` completed, ``x`` cancelled, ``r`` retried, ``d`` dead, ``""`` not applied;
    a re-send with the same ``token`` answers the same.
    """
    return Call(
        script("settle_tracked"),
        [shard.stream, shard.starts, shard.settled(token), shard.tracked, shard.delayed,
         shard.jobs, shard.dead, shard.result(job_id)],
        [group, consumer, entry_id, SETTLE_MEMO_MS, job_id, action, keep_ms, record, member,
         max(0, delay_ms), dead_cap, *fields],
        _tracked_settle,
    )


@dataclass(frozen=True, slots=True)
class TrackedDone:
    """One tracked job for :func:`complete_tracked`."""

    entry_id: str
    job_id: str
    cancel: bool
    keep_ms: int
    record: str


def _tracked_done(reply: Any) -> tuple[list[SettleStatus], str]:
    return [SettleStatus(int(x)) for x in reply[0] or []], _str(reply[1])


def complete_tracked(
    shard: ShardKeys, group: str, consumer: str, jobs: Sequence[TrackedDone], *, token: str
) -> Call:
    """Complete (or cancel) many tracked jobs of one shard, fenced; each final record (JSON
    ``record``) kept ``keep_ms``. Reply: ``(statuses, outcomes)``, one status per job and one
    character per job (``c`` completed, ``x`` cancelled, ``-`` not applied); a re-send with the
    same ``token`` answers the same."""
    keys = [shard.stream, shard.starts, shard.settled(token), shard.tracked]
    args: list[Any] = [group, consumer, SETTLE_MEMO_MS]
    for j in jobs:
        keys.append(shard.result(j.job_id))
        args.extend((j.entry_id, j.job_id, "cancel" if j.cancel else "complete", j.keep_ms,
                     j.record))
    return Call(script("complete_tracked"), keys, args, _tracked_done)


def job_status(shard: ShardKeys, group: str, job_id: str) -> Call:
    """Where tracked job ``job_id`` is on ``shard`` (read-only); the raw reply, decoded by
    :func:`streamq.jobstatus.decode_status`."""
    return Call(
        script("job_status"),
        [shard.tracked, shard.result(job_id), shard.stream, shard.delayed, shard.jobs],
        [group, job_id],
    )


def cancel(shard: ShardKeys, group: str, job_id: str) -> Call:
    """Cancel tracked job ``job_id`` on ``shard``. Reply: ``(outcome, detail)``: ``removed``
    (``waiting``/``delayed``), ``requested`` (the consumer running it), ``finished`` (its
    final state) or ``unknown``."""
    return Call(
        script("cancel"),
        [shard.tracked, shard.result(job_id), shard.stream, shard.delayed, shard.jobs],
        [group, job_id],
        lambda r: (_str(r[0]), _str(r[1])),
    )


def progress(shard: ShardKeys, group: str, consumer: str, *, job_id: str, entry_id: str,
             fraction: float, detail: str) -> Call:
    """Record a running tracked job's progress (fenced on its entry and owner). Reply: True
    recorded."""
    return Call(
        script("progress"), [shard.tracked, shard.stream],
        [job_id, entry_id, repr(float(fraction)), detail, group, consumer], bool,
    )


def control(shard: ShardKeys, group: str, consumer: str,
            running: Sequence[tuple[str, str, int]]) -> Call:
    """Mark this consumer's running tracked jobs ``(job id, entry id, start ms)`` as its own
    (those still pending for it); reply: the job ids whose cancellation was requested."""
    args: list[Any] = [consumer, group]
    for job_id, entry_id, start_ms in running:
        args.extend((job_id, entry_id, start_ms))
    return Call(script("control"), [shard.tracked, shard.stream], args, _str_list)


def track_final(shard: ShardKeys, job_id: str, *, keep_ms: int, record: str) -> Call:
    """Write a tracked job's final record (``record`` JSON, kept ``keep_ms``)."""
    return Call(script("track_final"), [shard.result(job_id)], [keep_ms, record], bool)
