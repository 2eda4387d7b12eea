"""Dead letters: list, count, retry and purge the jobs a queue gave up on.

Each shard keeps its dead letters in its own capped stream (``<prefix>:{<queue>:<i>}:dead``).
A record holds the job's original envelope fields plus why and where it died (``reason``,
``error_type``, ``error``, ``traceback``, ``attempts``, ``worker``, ``queue``, ``failed_at``).
A *lost payload* record (an entry deleted while it was pending) holds only ``reason``,
``entry``, ``error`` and ``failed_at``: there is no job to retry.

:class:`DeadLetters` (asyncio) and :class:`SyncDeadLetters` share every step: each operation is
written once as a generator of Redis requests, and the two classes only differ in how they send
a request. Listings are **newest first** across all shards, and payloads come with the
contract's ``secret_fields`` redacted.

A dead letter is named by its *ref*, ``<shard>/<dead entry id>`` (``ingestion-2/1700000000000-0``):
entry ids are per stream, so two shards can hold the same id. A bare id is accepted on a
single-shard queue.

Example::

    dead = DeadLetters(redis_client, Ingestion)
    for letter in await dead.list(limit=20, reason="error"):
        print(letter.ref, letter.job_name, letter.error)
    await dead.retry([letter.ref for letter in failed_by_outage])
    await dead.purge(older_than=timedelta(days=7))
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeAlias, overload

from streamq import ops
from streamq.contracts import Lane, QueueContract
from streamq.driver import Cmds, Scripts, Steps, cmd, drive, drive_sync, text
from streamq.durations import to_ms
from streamq.envelope import FIELD_NAMES
from streamq.errors import ConfigurationError
from streamq.keys import DEFAULT_PREFIX, QueueKeys, ShardKeys
from streamq.redact import redact

__all__ = ["DeadLetter", "DeadLetters", "SyncDeadLetters"]

SCAN_PAGE = 500
"""Dead letters read per shard per round trip when scanning (count by reason, retry all)."""
RETRY_BATCH = 500
"""Dead letters re-enqueued per script call."""

_ID_RE = re.compile(r"^\d+-\d+$")


# -- decoding ------------------------------------------------------------------------------


def _int_or_none(v: str) -> int | None:
    try:
        return int(v)
    except ValueError:
        return None


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def resolve_lane(lane_or_contract: Lane | type[QueueContract]) -> Lane:
    """A lane, or a contract's primary lane."""
    if isinstance(lane_or_contract, Lane):
        return lane_or_contract
    if isinstance(lane_or_contract, type) and issubclass(lane_or_contract, QueueContract):
        return lane_or_contract.primary
    raise ConfigurationError(
        f"expected a Lane or a QueueContract subclass, got {lane_or_contract!r}"
    )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter, decoded, with the contract's secret payload fields redacted.

    Attributes:
        id: the dead-letter entry id (in its shard's dead stream).
        shard: the shard name (``ingestion-2``).
        queue: the queue (lane) name.
        job_id: the stable job id (None for a lost payload).
        job_name: the job name (None for a lost payload).
        reason: ``error``, ``permanent``, ``timeout``, ``invalid_payload``, ``unknown_job``,
            ``stalled`` or ``lost_payload``.
        error_type: the exception class name ('' when none).
        error: the error message.
        traceback: the last lines of the traceback ('' when none).
        attempts: attempts made (None when unknown).
        worker: the consumer that dead-lettered it ('' when the reclaimer did).
        failed_at_ms: when it was dead-lettered, ms since the epoch (Redis clock).
        payload: the payload, secrets replaced by ``***`` (None for a lost payload).
        entry_id: the stream entry id it had when it died, where recorded.
        retryable: True when the record holds the whole job envelope.
    """

    id: str
    shard: str
    queue: str
    job_id: str | None
    job_name: str | None
    reason: str
    error_type: str
    error: str
    traceback: str
    attempts: int | None
    worker: str
    failed_at_ms: int
    payload: dict[str, Any] | None = field(repr=False)
    entry_id: str | None = None
    retryable: bool = False

    @property
    def ref(self) -> str:
        """``<shard>/<id>``: names this dead letter across all shards of its queue."""
        return f"{self.shard}/{self.id}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``--json`` listing of the CLI)."""
        out = asdict(self)
        out["ref"] = self.ref
        return out


def decode_dead(
    shard: ShardKeys, entry_id: Any, raw: Mapping[Any, Any], secret_fields: Iterable[str]
) -> DeadLetter:
    """Decode one dead-stream entry (field names and values as bytes or str)."""
    eid = text(entry_id)
    f: dict[str, Any] = {}
    for k, v in raw.items():
        f.setdefault(text(k), v)
    s = {k: text(v) for k, v in f.items() if k != "payload"}
    payload = f.get("payload")
    attempts = _int_or_none(s.get("attempts", ""))
    if attempts is None and "attempts" not in s:
        # A stalled record has no 'attempts': the attempt that stalled is the last one made.
        attempts = _int_or_none(s.get("attempt", ""))
    failed_at = _int_or_none(s.get("failed_at", "")) or _id_key(eid)[0]
    return DeadLetter(
        id=eid,
        shard=shard.name,
        queue=s.get("queue") or shard.queue,
        job_id=s.get("id") or None,
        job_name=s.get("name") or None,
        reason=s.get("reason", ""),
        error_type=s.get("error_type", ""),
        error=s.get("error", ""),
        traceback=s.get("traceback", ""),
        attempts=attempts,
        worker=s.get("worker", ""),
        failed_at_ms=failed_at,
        payload=None if payload is None else redact(payload, secret_fields),
        entry_id=s.get("entry") or None,
        retryable=all(n in f for n in FIELD_NAMES),
    )


def _pairs(entries: Any) -> list[tuple[Any, Mapping[Any, Any]]]:
    out = []
    for e in entries or []:
        eid, fields = e[0], e[1]
        if not isinstance(fields, Mapping):
            fields = {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}
        out.append((eid, fields))
    return out


# -- the operations, written once ----------------------------------------------------------

DeadLetterList: TypeAlias = "list[DeadLetter]"
Ref: TypeAlias = "str | DeadLetter"
Record: TypeAlias = tuple[str, Mapping[Any, Any]]


class _Core:
    """State and step generators shared by :class:`DeadLetters` and :class:`SyncDeadLetters`."""

    def __init__(
        self, client: Any, lane_or_contract: Lane | type[QueueContract], *, prefix: str
    ) -> None:
        self.client = client
        self.lane = resolve_lane(lane_or_contract)
        self.keys = QueueKeys(prefix, self.lane.name, self.lane.shards)
        self._secret = self.lane.contract.secret_fields
        self._by_name = {s.name: s for s in self.keys.shards}

    # -- argument checks -------------------------------------------------------------------
    def shards_of(self, shard: str | int | None) -> tuple[ShardKeys, ...]:
        if shard is None:
            return self.keys.shards
        if isinstance(shard, int) and not isinstance(shard, bool):
            if 0 <= shard < len(self.keys.shards):
                return (self.keys.shards[shard],)
        elif isinstance(shard, str) and shard in self._by_name:
            return (self._by_name[shard],)
        raise ConfigurationError(
            f"queue {self.lane.name!r} has no shard {shard!r}; shards: {', '.join(self._by_name)}",
            queue=self.lane.name,
        )

    def resolve(self, refs: Iterable[Ref]) -> dict[ShardKeys, list[str]]:
        """Group refs by shard; raises ``ConfigurationError`` on a malformed or foreign ref."""
        if isinstance(refs, str | DeadLetter):
            refs = [refs]
        out: dict[ShardKeys, list[str]] = {}
        for ref in refs:
            if isinstance(ref, DeadLetter):
                shard_name, eid = ref.shard, ref.id
            elif isinstance(ref, str) and "/" in ref:
                shard_name, _, eid = ref.rpartition("/")
            elif isinstance(ref, str) and len(self.keys.shards) == 1:
                shard_name, eid = self.keys.shards[0].name, ref
            else:
                raise ConfigurationError(
                    f"dead letter {ref!r}: queue {self.lane.name!r} has "
                    f"{len(self.keys.shards)} shards; name it as <shard>/<id> "
                    f"(e.g. {self.keys.shards[-1].name}/1700000000000-0)",
                    queue=self.lane.name,
                )
            shard = self._by_name.get(shard_name)
            if shard is None or not _ID_RE.match(eid):
                raise ConfigurationError(
                    f"{ref!r} is not a dead letter of queue {self.lane.name!r}: expected "
                    f"<shard>/<ms>-<seq> with a shard among {', '.join(self._by_name)}",
                    queue=self.lane.name,
                )
            ids = out.setdefault(shard, [])
            if eid not in ids:
                ids.append(eid)
        return out

    @staticmethod
    def _one_of(what: str, **given: bool) -> None:
        chosen = [k for k, v in given.items() if v]
        if len(chosen) != 1:
            raise ConfigurationError(
                f"{what}: give exactly one of {', '.join(given)} (got "
                f"{', '.join(chosen) or 'none'})"
            )

    # -- list and count --------------------------------------------------------------------
    def list_steps(
        self, limit: int, shard: str | int | None, reason: str | None
    ) -> Steps[DeadLetterList]:
        if not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"limit must be an integer >= 1, got {limit!r}")
        shards = self.shards_of(shard)
        page = limit if reason is None else max(limit, SCAN_PAGE)
        found: dict[ShardKeys, list[DeadLetter]] = {s: [] for s in shards}
        upper = dict.fromkeys(shards, "+")
        todo = list(shards)
        while todo:
            reply = yield Cmds(
                [cmd("xrevrange", s.dead, max=upper[s], min="-", count=page) for s in todo]
            )
            more = []
            for s, entries in zip(todo, reply, strict=True):
                pairs = _pairs(entries)
                for eid, fields in pairs:
                    if (
                        reason is not None
                        and text(fields.get(b"reason", fields.get("reason"))) != reason
                    ):
                        continue
                    found[s].append(decode_dead(s, eid, fields, self._secret))
                if len(pairs) == page and len(found[s]) < limit:
                    upper[s] = "(" + text(pairs[-1][0])
                    more.append(s)
            todo = more
        merged = [d for s in shards for d in found[s][:limit]]
        # Newest first by when each was dead-lettered (the script's TIME), then by entry id:
        # two shards' entry ids can order two letters a millisecond apart the other way.
        merged.sort(key=lambda d: (d.failed_at_ms, _id_key(d.id), -self._by_name[d.shard].index),
                    reverse=True)
        return merged[:limit]

    def count_steps(self, shard: str | int | None) -> Steps[int]:
        shards = self.shards_of(shard)
        reply = yield Cmds([cmd("xlen", s.dead) for s in shards])
        return sum(int(n) for n in reply)

    def scan_steps(self, shard: ShardKeys, upper: str = "+") -> Steps[list[Record]]:
        """Every entry of ``shard``'s dead stream up to ``upper``, oldest first."""
        out: list[Record] = []
        lower = "-"
        while True:
            (entries,) = yield Cmds(
                [cmd("xrange", shard.dead, min=lower, max=upper, count=SCAN_PAGE)]
            )
            pairs = [(text(e), f) for e, f in _pairs(entries)]
            out.extend(pairs)
            if len(pairs) < SCAN_PAGE:
                return out
            lower = "(" + pairs[-1][0]

    def count_by_reason_steps(self, shard: str | int | None) -> Steps[dict[str, int]]:
        counts: Counter[str] = Counter()
        for s in self.shards_of(shard):
            entries = yield from self.scan_steps(s)
            counts.update(text(f.get(b"reason", f.get("reason"))) for _, f in entries)
        return dict(counts.most_common())

    # -- retry -----------------------------------------------------------------------------
    def retry_steps(self, ids: Iterable[Ref] | None, all_: bool) -> Steps[int]:
        self._one_of("retry", ids=ids is not None, all=all_)
        if ids is not None:
            targets = self.resolve(ids)
        else:
            targets = yield from self._all_retryable()
        calls = [
            ops.dead_retry(s, eids[i : i + RETRY_BATCH])
            for s, eids in targets.items()
            for i in range(0, len(eids), RETRY_BATCH)
        ]
        if not calls:
            return 0
        replies = yield Scripts(calls)
        return sum(1 for r in replies for x in r if x == 1)

    def _all_retryable(self) -> Steps[dict[ShardKeys, list[str]]]:
        # Fix each shard's upper bound first: a retried job that fails again at once is
        # dead-lettered after it, and must not be retried again by this same call.
        shards = self.keys.shards
        newest = yield Cmds([cmd("xrevrange", s.dead, max="+", min="-", count=1) for s in shards])
        targets: dict[ShardKeys, list[str]] = {}
        for s, top in zip(shards, newest, strict=True):
            pairs = _pairs(top)
            if not pairs:
                continue
            entries = yield from self.scan_steps(s, text(pairs[0][0]))
            ids = [eid for eid, f in entries if all(_has(f, n) for n in FIELD_NAMES)]
            if ids:
                targets[s] = ids
        return targets

    # -- purge -----------------------------------------------------------------------------
    def purge_steps(
        self, ids: Iterable[Ref] | None, all_: bool, older_than: timedelta | float | None
    ) -> Steps[int]:
        self._one_of("purge", ids=ids is not None, all=all_, older_than=older_than is not None)
        shards = self.keys.shards
        if ids is not None:
            targets = self.resolve(ids)
            if not targets:
                return 0
            reply = yield Cmds([cmd("xdel", s.dead, *eids) for s, eids in targets.items()])
        elif all_:
            reply = yield Cmds([cmd("xtrim", s.dead, maxlen=0, approximate=False) for s in shards])
        else:
            assert older_than is not None
            age_ms = to_ms(older_than, "older_than")
            (now,) = yield Cmds([cmd("time")])
            cutoff = int(now[0]) * 1000 + int(now[1]) // 1000 - age_ms
            # Entry ids carry the Redis clock at dead-lettering: MINID drops every older one.
            reply = yield Cmds(
                [
                    cmd("xtrim", s.dead, minid=f"{max(cutoff, 0)}-0", approximate=False)
                    for s in shards
                ]
            )
        return sum(int(n) for n in reply)


def _has(fields: Mapping[Any, Any], name: str) -> bool:
    return name.encode() in fields or name in fields



# -- the two front ends --------------------------------------------------------------------


class DeadLetters(_Core):
    """The dead letters of one queue lane (asyncio client).

    Args:
        client: a ``redis.asyncio.Redis`` (or ``RedisCluster``).
        lane_or_contract: a queue contract (its primary lane) or a :class:`Lane`
            (``Ingestion.secondary`` for the secondary lane).
        prefix: the key prefix shared with producers and workers.

    Example::

        dead = DeadLetters(client, Ingestion)
        print(await dead.count(by_reason=True))       # {'error': 12, 'permanent': 3}
        await dead.retry(all=True)
    """

    def __init__(
        self,
        client: Any,
        lane_or_contract: Lane | type[QueueContract],
        *,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        super().__init__(client, lane_or_contract, prefix=prefix)

    async def list(
        self, limit: int = 100, *, shard: str | int | None = None, reason: str | None = None
    ) -> DeadLetterList:
        """The newest ``limit`` dead letters across all shards (or ``shard``), newest first.

        ``reason`` keeps only dead letters of that reason (``error``, ``permanent``, ...).
        """
        return await drive(self.client, self.lane.name, self.list_steps(limit, shard, reason))

    @overload
    async def count(
        self, *, shard: str | int | None = ..., by_reason: Literal[False] = ...
    ) -> int: ...
    @overload
    async def count(
        self, *, shard: str | int | None = ..., by_reason: Literal[True]
    ) -> dict[str, int]: ...
    async def count(
        self, *, shard: str | int | None = None, by_reason: bool = False
    ) -> int | dict[str, int]:
        """How many dead letters there are; with ``by_reason``, ``{reason: count}``.

        The total is one ``XLEN`` per shard; counting by reason reads every record.
        """
        if by_reason:
            return await drive(self.client, self.lane.name, self.count_by_reason_steps(shard))
        return await drive(self.client, self.lane.name, self.count_steps(shard))

    async def retry(self, ids: Iterable[Ref] | None = None, *, all: bool = False) -> int:
        """Put dead letters back on their shard as fresh jobs: same job id, attempt 1, due now.

        Give the dead letters (``DeadLetter`` objects or refs ``<shard>/<id>``), or
        ``all=True``. Each one is re-added and removed from the dead stream in one atomic
        call: retrying the same dead letter twice, even from two clients at once, re-adds it
        once. Lost-payload records hold no job and stay where they are.

        Returns:
            How many jobs were re-enqueued.
        """
        return await drive(self.client, self.lane.name, self.retry_steps(ids, all))

    async def purge(
        self,
        ids: Iterable[Ref] | None = None,
        *,
        all: bool = False,
        older_than: timedelta | float | None = None,
    ) -> int:
        """Delete dead letters: these ``ids``, ``all`` of them, or those dead-lettered more
        than ``older_than`` (a timedelta or seconds) ago by the Redis clock.

        Returns:
            How many were deleted.
        """
        return await drive(self.client, self.lane.name, self.purge_steps(ids, all, older_than))


class SyncDeadLetters(_Core):
    """The synchronous twin of :class:`DeadLetters` (a ``redis.Redis`` client)."""

    def __init__(
        self,
        client: Any,
        lane_or_contract: Lane | type[QueueContract],
        *,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        super().__init__(client, lane_or_contract, prefix=prefix)

    def list(
        self, limit: int = 100, *, shard: str | int | None = None, reason: str | None = None
    ) -> DeadLetterList:
        """See :meth:`DeadLetters.list`."""
        return drive_sync(self.client, self.lane.name, self.list_steps(limit, shard, reason))

    @overload
    def count(self, *, shard: str | int | None = ..., by_reason: Literal[False] = ...) -> int: ...
    @overload
    def count(
        self, *, shard: str | int | None = ..., by_reason: Literal[True]
    ) -> dict[str, int]: ...
    def count(
        self, *, shard: str | int | None = None, by_reason: bool = False
    ) -> int | dict[str, int]:
        """See :meth:`DeadLetters.count`."""
        if by_reason:
            return drive_sync(self.client, self.lane.name, self.count_by_reason_steps(shard))
        return drive_sync(self.client, self.lane.name, self.count_steps(shard))

    def retry(self, ids: Iterable[Ref] | None = None, *, all: bool = False) -> int:
        """See :meth:`DeadLetters.retry`."""
        return drive_sync(self.client, self.lane.name, self.retry_steps(ids, all))

    def purge(
        self,
        ids: Iterable[Ref] | None = None,
        *,
        all: bool = False,
        older_than: timedelta | float | None = None,
    ) -> int:
        """See :meth:`DeadLetters.purge`."""
        return drive_sync(self.client, self.lane.name, self.purge_steps(ids, all, older_than))
