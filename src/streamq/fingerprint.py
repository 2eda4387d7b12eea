"""The contract fingerprint in a queue's meta hash: record it, and check a contract against it.

Producers and workers of one queue are deployed at different times, so Redis keeps a record
of the contract that last wrote to a lane, in the lane's meta hash (``QueueKeys.meta``,
``<prefix>:{<queue>}:meta``):

=========================  ===================================================
field                      value
=========================  ===================================================
``contract_fingerprint``   :func:`fingerprint` of the contract (16 hex digits)
``contract``               its :func:`streamq.compat.snapshot`, as JSON
=========================  ===================================================

Producers record it on their first successful send to a lane. A worker compares its own
contract with the stored one before it starts (:func:`check_contract`), and records its own.

Example::

    problems = await check_contract(client, QueueKeys(prefix, "ingestion", 4), Ingestion)
    if problems:
        raise SystemExit("\\n".join(problems))
    await record_contract(client, QueueKeys(prefix, "ingestion", 4), Ingestion)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn
from weakref import WeakKeyDictionary

from streamq._redis import map_error
from streamq.compat import Change, check_compatible, snapshot
from streamq.contracts import QueueContract
from streamq.errors import ContractError
from streamq.keys import QueueKeys

if TYPE_CHECKING:
    from streamq._redis import AsyncClient, SyncClient

__all__ = [
    "FINGERPRINT_FIELD",
    "SNAPSHOT_FIELD",
    "breaking_changes",
    "check_contract",
    "fingerprint",
    "record_contract",
    "record_contract_sync",
]

FINGERPRINT_FIELD = "contract_fingerprint"
"""The meta hash field holding the contract's fingerprint."""
SNAPSHOT_FIELD = "contract"
"""The meta hash field holding the contract's snapshot JSON."""


_RECORDS: WeakKeyDictionary[type[QueueContract], tuple[str, str]] = WeakKeyDictionary()


def _record(contract: type[QueueContract]) -> tuple[str, str]:
    """The contract's fingerprint and snapshot JSON, computed once per contract: a snapshot
    builds every payload's JSON schema."""
    rec = _RECORDS.get(contract)
    if rec is None:
        snap = snapshot(contract)
        rec = (
            str(snap["fingerprint"])[:16],
            json.dumps(snap, sort_keys=True, separators=(",", ":")),
        )
        _RECORDS[contract] = rec
    return rec


def fingerprint(contract: type[QueueContract]) -> str:
    """A stable hash of ``contract``: the first 16 hex digits of the sha256 of its canonical
    snapshot. The same in every process and version as long as the snapshot is the same."""
    return _record(contract)[0]


def _items(contract: type[QueueContract]) -> list[str]:
    fp, snap = _record(contract)
    return [FINGERPRINT_FIELD, fp, SNAPSHOT_FIELD, snap]


async def record_contract(
    client: AsyncClient, qkeys: QueueKeys, contract: type[QueueContract]
) -> None:
    """Store ``contract``'s fingerprint and snapshot in the lane's meta hash (one ``HSET``).

    Raises:
        RedisUnavailable, RedisOutOfMemory, RedisRefused: the record was not written.
    """
    try:
        await client.hset(qkeys.meta, items=_items(contract))
    except Exception as exc:
        _reraise(exc, qkeys)


def record_contract_sync(
    client: SyncClient, qkeys: QueueKeys, contract: type[QueueContract]
) -> None:
    """The synchronous twin of :func:`record_contract`."""
    try:
        client.hset(qkeys.meta, items=_items(contract))
    except Exception as exc:
        _reraise(exc, qkeys)


async def check_contract(
    client: AsyncClient, qkeys: QueueKeys, contract: type[QueueContract]
) -> list[str]:
    """The breaking changes between the contract stored for the lane and ``contract``.

    One ``HMGET`` of the meta hash. Empty when nothing is stored, when the stored fingerprint
    is ``contract``'s, or when the two are compatible (see :func:`breaking_changes`).

    Raises:
        RedisUnavailable, RedisRefused: the meta hash could not be read.
    """
    try:
        fp, raw = await client.hmget(qkeys.meta, [FINGERPRINT_FIELD, SNAPSHOT_FIELD])
    except Exception as exc:
        _reraise(exc, qkeys)
    if raw is None or _text(fp) == fingerprint(contract):
        return []
    try:
        stored = json.loads(raw)
    except ValueError as exc:
        return [f"{qkeys.queue}: the stored contract snapshot is not valid JSON ({exc})"]
    return breaking_changes(stored, contract)


def breaking_changes(stored: Any, contract: type[QueueContract]) -> list[str]:
    """The changes between snapshot ``stored`` and ``contract`` that break a rolling deploy.

    Both must hold while either version may still run:

    * a worker built from ``contract`` consumes every job written under ``stored``: every
      breaking change of ``check_compatible(stored, snapshot(contract))`` except
      ``field_removed`` (a worker ignores payload fields it does not know);
    * a worker built from ``stored`` consumes every job written under ``contract``: a field
      that ``stored`` requires and ``contract`` lacks (``check_compatible`` in the other
      direction reports it as ``field_added_required``).

    ``field_removed`` is left to the second rule because it is only breaking when the old
    side requires the field: an optional field added by one side is not a break either way.
    Additions in ``contract`` that older workers cannot use yet (a new job, a widened type)
    are not reported: as in :mod:`streamq.compat`, deploy the workers before the producers.

    Each string names the queue, job, field and what breaks. A ``stored`` snapshot this
    version cannot read (another format) is reported as one string.
    """
    current = snapshot(contract)
    try:
        forward = check_compatible(stored, current)
        backward = check_compatible(current, stored)
    except ContractError as exc:
        return [f"{contract.queue_name}: the stored contract cannot be compared: {exc}"]
    out = [str(c) for c in _breaking(forward) if c.kind != "field_removed"]
    out.extend(
        f"BREAKING field_required_by_stored: {_where(c)}: workers on the stored contract "
        "require this field and jobs from this contract do not carry it"
        for c in _breaking(backward)
        if c.kind == "field_added_required"
    )
    return list(dict.fromkeys(out))


def _breaking(changes: list[Change]) -> Iterator[Change]:
    return (c for c in changes if c.breaking)


def _where(c: Change) -> str:
    where = "/".join(p for p in (c.queue, c.job) if p)
    return f"{where} field {c.field!r}" if c.field else where


def _text(v: Any) -> str | None:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _reraise(exc: Exception, qkeys: QueueKeys) -> NoReturn:
    mapped = map_error(exc, queue=qkeys.queue)
    if mapped is None or mapped is exc:
        raise exc
    raise mapped from exc
