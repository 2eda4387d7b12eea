"""Producers: a typed, sharded ``Queue`` (asyncio) and its synchronous twin ``SyncQueue``.

Both share :class:`_Planner`, which validates, encodes and shards jobs and builds the script
calls; the two classes only differ in how they send a batch to Redis.

Example::

    queue = Queue(Ingestion, redis.asyncio.Redis.from_url(url))
    job_id = await queue.for_key(f"{project_id}-{event_id}").add(
        Ingestion.ingest_event, IngestEvent(project_id=project_id, event_id=event_id)
    )
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, overload

import redis as redis_sync
import redis.asyncio as redis_async
from pydantic import BaseModel, ValidationError

from streamq import ops
from streamq._redis import Call, map_error, run_calls, run_calls_sync
from streamq.contracts import JobSpec, Lane, QueueContract
from streamq.durability import Durability, run_durable, run_durable_sync
from streamq.durations import Duration, to_ms
from streamq.envelope import (
    FIELD_NAMES,
    encode_fields,
    validation_fields,
    validation_problems,
)
from streamq.errors import (
    ConfigurationError,
    InvalidPayload,
    PayloadTooLarge,
    RedisOutOfMemory,
    RedisUnavailable,
    UnknownJob,
)
from streamq.fingerprint import record_contract, record_contract_sync
from streamq.hooks import Hooks
from streamq.jobstatus import CancelResult, JobStatus, Lookup, ctl_value
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX, QueueKeys, ShardKeys
from streamq.tenants import DEFAULT_FLAG_STALENESS_S, FlagView, shared_view

__all__ = ["JobRequest", "Queue", "SyncQueue"]

P = TypeVar("P", bound=BaseModel)
C = TypeVar("C", bound=QueueContract)
R = TypeVar("R")

_log = logging.getLogger("streamq.producer")

BULK_BATCH = 500
"""The most jobs :meth:`Queue.add_bulk` sends in one pipelined round trip."""
BULK_BATCH_BYTES = 8 * 1024 * 1024
"""...and the most payload bytes: a batch of big payloads must not build one huge request."""

SecondaryRule = Callable[[JobSpec[Any], BaseModel], bool]
_ID_AT = FIELD_NAMES.index("id")
_PAYLOAD_AT = FIELD_NAMES.index("payload")


def new_job_id() -> str:
    """A random job id: a version-4 UUID's 32 hex digits, as ``uuid.uuid4().hex`` gives.

    Built straight from ``os.urandom``: ``uuid4()`` makes a UUID object only for ``.hex`` to
    format it again, a third of an add's own CPU time.
    """
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()


def delay_to_ms(delay: Duration | None) -> int:
    """``delay`` (a timedelta or seconds) as whole ms; None is no delay."""
    return 0 if delay is None else to_ms(delay, "delay")


@dataclass(frozen=True, slots=True)
class JobRequest(Generic[P]):
    """One job for :meth:`Queue.add_bulk`."""

    job: JobSpec[P] | str
    payload: P | Mapping[str, Any]
    job_id: str | None = None
    delay: timedelta | int | None = None
    sharding_key: str | None = None
    track: bool | None = None
    keep_result: Duration | None = None


class _AnyJobRequest(Protocol):
    """What :meth:`Queue.add_bulk` takes: a :class:`JobRequest` of any job.

    Its members are ``object`` on purpose: typed ``JobRequest[Any]``, the parameter would make
    mypy infer ``P = Any`` for ``add_bulk([JobRequest(Spec.a, WrongModel())])`` and accept it.
    """

    @property
    def job(self) -> object: ...

    @property
    def payload(self) -> object: ...


_BASE_DUMP = BaseModel.model_dump_json
_BASE_LOAD: object = getattr(BaseModel.model_validate_json, "__func__", None)


class _Codec:
    """One job of the contract: its spec, and its payload to and from the JSON a worker reads."""

    __slots__ = ("model", "name", "plain", "spec")

    def __init__(self, spec: JobSpec[Any]) -> None:
        self.spec = spec
        self.name = spec.name
        self.model: type[BaseModel] = spec.model
        # model_dump_json and model_validate_json only hand their keywords on to the model's
        # core serializer and validator; calling those directly halves the cost of each (a
        # third of a bulk add's own time). A model overriding either method keeps its own.
        self.plain = (
            self.model.model_dump_json is _BASE_DUMP
            and getattr(self.model.model_validate_json, "__func__", None) is _BASE_LOAD
        )

    def dump(self, model: BaseModel) -> bytes:
        """``model`` as the JSON bytes (by alias) a worker validates."""
        if self.plain and type(model) is self.model:
            data: bytes = self.model.__pydantic_serializer__.to_json(model, by_alias=True)
            return data
        return model.model_dump_json(by_alias=True).encode("utf-8")

    def load(self, data: bytes) -> None:
        """Validate ``data`` as a worker will; raises ``ValidationError``."""
        if self.plain:
            self.model.__pydantic_validator__.validate_json(data)
        else:
            self.model.model_validate_json(data)


class _Stamp:
    """What the jobs prepared together share: the enqueue time (one clock read per batch, not
    per job) and, per job name, their envelope's field values but for the id and payload."""

    __slots__ = ("_templates", "ms")

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)
        self._templates: dict[str, list[str | bytes]] = {}

    def values(self, name: str, job_id: str, data: bytes) -> list[str | bytes]:
        """The field values of one job (``FIELD_NAMES`` order)."""
        template = self._templates.get(name)
        if template is None:
            template = encode_fields(job_id="", name=name, timestamp_ms=self.ms, payload_json=b"")
            self._templates[name] = template
        values = template.copy()
        values[_ID_AT] = job_id
        values[_PAYLOAD_AT] = data
        return values


@dataclass(slots=True)
class _Prepared:
    """One validated, encoded job and its shard: an item of :func:`ops.enqueue` as it is."""

    lane: Lane
    shard: ShardKeys
    name: str
    job_id: str
    values: list[str | bytes]
    delay_ms: int = 0
    dedup: bool = False
    member: str | None = None
    ctl: str | None = None


class _Planner:
    """Validation, encoding, sharding and script calls shared by both producers."""

    def __init__(
        self,
        contract: type[QueueContract],
        *,
        prefix: str,
        secondary_when: SecondaryRule | None,
        use_secondary: bool | None,
        hooks: Hooks | None,
        max_payload_bytes: int | None,
        flags_staleness: Duration | None = None,
    ) -> None:
        if not (isinstance(contract, type) and issubclass(contract, QueueContract)):
            raise ConfigurationError(f"{contract!r} is not a QueueContract subclass")
        if (use_secondary or secondary_when) and contract.secondary is None:
            raise ConfigurationError(
                f"queue {contract.queue_name!r} declares no secondary lane "
                "(set secondary_shards= on the contract)",
                queue=contract.queue_name,
            )
        self.contract = contract
        self.prefix = prefix
        self.secondary_when = secondary_when
        lane = contract.secondary if use_secondary else contract.primary
        assert lane is not None
        self.default_lane: Lane = lane
        self.hooks = hooks or Hooks()
        hooks_type = type(self.hooks)
        # Without an adapter that carries trace context, an add skips entering a no-op context;
        # without one that counts adds, a bulk add skips a no-op call per job.
        self._traced = hooks_type.enqueue_context is not Hooks.enqueue_context
        self._counted = (
            hooks_type.enqueued is not Hooks.enqueued
            or hooks_type.enqueue_duplicate is not Hooks.enqueue_duplicate
        )
        if max_payload_bytes is not None and (
            not isinstance(max_payload_bytes, int) or max_payload_bytes < 1
        ):
            raise ConfigurationError(
                f"max_payload_bytes must be an integer >= 1, got {max_payload_bytes!r}",
                queue=contract.queue_name,
            )
        self.max_payload_bytes = max_payload_bytes or contract.defaults.max_payload_bytes
        self._keys = {
            lane.name: QueueKeys(prefix, lane.name, lane.shards) for lane in contract.lanes()
        }
        # The lanes this producer writes: its default one, and the secondary a rule may pick.
        for written in {lane, (contract.secondary or lane) if secondary_when else lane}:
            self.hooks.producer_started(written.name, written.shard_names(), list(contract.jobs))
        # Start the round-robin at a random shard: many short-lived producers (one Queue per
        # request or per process) would otherwise all write their first job to shard 0.
        self._spread = itertools.count(random.randrange(1 << 30))
        # Lanes whose meta hash this producer (with the for_key() views sharing this planner)
        # has recorded the contract in: once per lane, on the first successful send there.
        self._recorded: set[str] = set()
        self.codecs: dict[object, _Codec] = {}
        # Tenant flags route a flagged tenant's jobs to the secondary lane, unless the caller
        # chose the lane (secondary=True/False) or the contract has nowhere to route.
        # The view itself is the client's (shared_view), set once the client is checked.
        self.flags: FlagView | None = None
        self.flags_staleness_s: float | None = None
        if (flags_staleness is not None and use_secondary is None
                and contract.secondary is not None and contract.tenant_field):
            staleness_ms = to_ms(flags_staleness, "tenant_flags_staleness", minimum=10)
            self.flags_staleness_s = staleness_ms / 1000

    def keys(self, lane: Lane) -> QueueKeys:
        return self._keys[lane.name]

    def to_record(self, prepared: Sequence[_Prepared]) -> list[QueueKeys]:
        """The lanes of ``prepared`` whose contract record is still to write, marked as
        written at once so that concurrent sends do not write it again."""
        if len(self._recorded) == len(self._keys):
            return []
        todo = {p.lane.name for p in prepared} - self._recorded
        self._recorded |= todo
        return [self._keys[name] for name in todo]

    def record_failed(self, qkeys: QueueKeys, exc: Exception) -> None:
        """The contract record of a lane could not be written. The jobs were enqueued, so the
        add must not fail for it: an unreachable Redis is tried again on a later send, any
        other refusal (an ACL without HSET on the meta key) is logged once and given up, so
        it never costs every add an extra call."""
        if isinstance(exc, RedisUnavailable):
            self._recorded.discard(qkeys.queue)
            return
        _log.warning(
            "queue %r: could not record the contract fingerprint in %s: %s",
            qkeys.queue,
            qkeys.meta,
            exc,
        )

    def spec(self, job: JobSpec[Any] | str) -> JobSpec[Any]:
        name = job if isinstance(job, str) else job.name
        spec = self.contract.jobs.get(name)
        if spec is None or (not isinstance(job, str) and spec is not job):
            self.hooks.enqueue_rejected(self.contract.queue_name, name, "unknown_job")
            raise UnknownJob(
                f"queue {self.contract.queue_name!r} has no job {name!r}; declared jobs: "
                f"{', '.join(sorted(self.contract.jobs))}",
                queue=self.contract.queue_name,
                job=name,
            )
        return spec

    def codec(self, job: JobSpec[Any] | str) -> _Codec:
        """The codec of ``job`` (a spec of this contract, or a job name); raises UnknownJob."""
        codec = self.codecs.get(job)
        if codec is None:
            # Cached by the spec object itself (JobSpec hashes by identity) or the name: a
            # look-alike spec of another contract is never found here, and spec() refuses it.
            codec = self.codecs[job] = _Codec(self.spec(job))
        return codec

    def _invalid(self, spec: JobSpec[Any], exc: ValidationError, what: str) -> InvalidPayload:
        queue = self.contract.queue_name
        self.hooks.enqueue_rejected(queue, spec.name, "invalid")
        fields = validation_fields(exc)
        return InvalidPayload(
            f"queue {queue!r} job {spec.name!r}: {what}, field(s) {validation_problems(exc)}",
            queue=queue,
            job=spec.name,
            fields=fields,
        )

    def _wrong_model(self, spec: JobSpec[Any], payload: BaseModel) -> InvalidPayload:
        queue = self.contract.queue_name
        self.hooks.enqueue_rejected(queue, spec.name, "invalid")
        # Name the fields the other model lacks or gets wrong, to point at the mix-up.
        try:
            spec.model.model_validate(payload.model_dump(by_alias=True))
            fields: list[str] = []
        except ValidationError as exc:
            fields = validation_fields(exc)
        detail = f" (fields that do not fit: {', '.join(fields)})" if fields else ""
        return InvalidPayload(
            f"queue {queue!r} job {spec.name!r}: expected a {spec.model.__name__} payload, "
            f"got {type(payload).__name__}{detail}",
            queue=queue,
            job=spec.name,
            fields=fields,
        )

    def _model(self, codec: _Codec, payload: Any) -> BaseModel:
        """``payload`` as the job's model: an instance of it (or of a subclass) as it is, a
        mapping validated; an instance of another model is refused."""
        if isinstance(payload, codec.model):
            return payload
        if isinstance(payload, BaseModel):
            raise self._wrong_model(codec.spec, payload)
        try:
            return codec.model.model_validate(payload)
        except ValidationError as exc:
            raise self._invalid(codec.spec, exc, "invalid payload") from exc

    def prepare(
        self,
        codec: _Codec,
        payload: Any,
        job_id: str | None,
        delay: timedelta | int | None,
        sharding_key: str | None,
        stamp: _Stamp,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> _Prepared:
        """Validate, encode and place one job (positional: this runs once per job of a bulk)."""
        model = payload if type(payload) is codec.model else self._model(codec, payload)
        data = codec.dump(model)
        try:
            codec.load(data)
        except ValidationError as exc:
            raise self._invalid(
                codec.spec, exc, "payload does not survive its JSON encoding"
            ) from exc
        lane = self.default_lane
        if self.secondary_when is not None and self.secondary_when(codec.spec, model):
            lane = self.contract.secondary or lane
        elif self.flags is not None and self.flags.expiries:
            lane = self._tenant_lane(lane, codec, model)
        if len(data) > self.max_payload_bytes:
            raise self._too_large(lane, codec, len(data))
        delay_ms = 0 if delay is None else delay_to_ms(delay)
        if job_id is None:
            jid = new_job_id()
        elif not job_id or len(job_id) > 200:
            raise ConfigurationError(f"job_id must be 1..200 characters, got {job_id!r}")
        else:
            jid = job_id
        qkeys = self._keys[lane.name]
        if sharding_key is not None:
            shard = qkeys.for_key(sharding_key)
        elif job_id is not None:
            # Dedup markers live on the shard: the same id must always map to the same shard.
            shard = qkeys.for_key(jid)
        else:
            shard = qkeys.shards[next(self._spread) % lane.shards]
        if self._traced:
            values = self._traced_values(lane, codec, jid, model, data, stamp)
        else:
            values = stamp.values(codec.name, jid, data)
        # A delayed job is stored under a fresh member, never its id: a re-add of the id after
        # its dedup window must not overwrite a copy that is still waiting.
        member = ops.delayed_member(jid) if delay_ms > 0 else None
        spec = codec.spec
        ctl = (
            ctl_value(spec, track, keep_result)
            if spec.track or track or keep_result is not None else None
        )
        return _Prepared(
            lane, shard, codec.name, jid, values, delay_ms, job_id is not None, member, ctl
        )

    def _tenant_lane(self, lane: Lane, codec: _Codec, model: BaseModel) -> Lane:
        """The secondary lane when the job's tenant is flagged, else ``lane``."""
        assert self.flags is not None
        assert self.contract.tenant_field
        tenant = getattr(model, self.contract.tenant_field, None)
        if tenant is None or not self.flags.flagged(str(tenant)):
            return lane
        self.hooks.tenant_routed(self.contract.queue_name, codec.name)
        return self.contract.secondary or lane

    def _too_large(self, lane: Lane, codec: _Codec, size: int) -> PayloadTooLarge:
        self.hooks.enqueue_rejected(lane.name, codec.name, "too_large")
        return PayloadTooLarge(
            f"queue {lane.name!r} job {codec.name!r}: payload is {size} bytes, over the "
            f"{self.max_payload_bytes}-byte limit",
            queue=lane.name,
            job=codec.name,
            size=size,
            limit=self.max_payload_bytes,
        )

    def _traced_values(
        self, lane: Lane, codec: _Codec, job_id: str, model: BaseModel, data: bytes, stamp: _Stamp
    ) -> list[str | bytes]:
        tenant = None
        if self.contract.tenant_field:
            tenant = str(getattr(model, self.contract.tenant_field, "") or "") or None
        with self.hooks.enqueue_context(lane.name, codec.name, job_id, tenant) as carrier:
            return encode_fields(
                job_id=job_id,
                name=codec.name,
                timestamp_ms=stamp.ms,
                payload_json=data,
                trace_context=carrier,
            )

    def calls(self, prepared: Sequence[_Prepared]) -> tuple[list[Call], list[list[_Prepared]]]:
        """One enqueue call per shard (in first-seen order) and the jobs each carries."""
        window = self.contract.defaults.dedup_window_ms
        if len(prepared) == 1:
            p = prepared[0]
            if not p.dedup and p.delay_ms <= 0 and p.ctl is None:
                return [ops.enqueue_ready(p.shard, p)], [[p]]
            return [ops.enqueue(p.shard, [p], dedup_window_ms=window)], [[p]]
        # Keyed by the ShardKeys object (one per shard and lane, held by this planner): its
        # identity is as good as its fields and far cheaper to hash.
        groups: dict[int, list[_Prepared]] = {}
        for p in prepared:
            group = groups.get(id(p.shard))
            if group is None:
                groups[id(p.shard)] = [p]
            else:
                group.append(p)
        jobs = list(groups.values())
        return [ops.enqueue(g[0].shard, g, dedup_window_ms=window) for g in jobs], jobs

    def finish(self, groups: list[list[_Prepared]], replies: list[Any]) -> None:
        """Report each job's outcome (added, or a duplicate of a dedup marker) to the hooks."""
        if not self._counted:
            return
        hooks = self.hooks
        for group, reply in zip(groups, replies, strict=True):
            for p, added in zip(group, reply, strict=True):
                if added:
                    hooks.enqueued(p.lane.name, p.shard.name, p.name, delayed=p.delay_ms > 0)
                else:
                    hooks.enqueue_duplicate(p.lane.name, p.shard.name, p.name)

    def failed(self, prepared: Sequence[_Prepared], exc: Exception) -> None:
        if isinstance(exc, RedisUnavailable | RedisOutOfMemory):
            for p in prepared:
                self.hooks.enqueue_rejected(p.lane.name, p.name, "redis_error")


def _timeout_s(timeout: timedelta | float) -> float:
    t = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not t > 0:
        raise ConfigurationError(f"result timeout must be positive, got {timeout!r}")
    return t


def _log_cancel(result: CancelResult) -> None:
    if result.outcome in ("removed", "requested"):
        _log.info(
            "job cancelled" if result.outcome == "removed" else "job cancellation requested",
            extra={"queue": result.queue, "job_id": result.job_id, "cancel": result.outcome,
                   "detail": result.detail},
        )


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


class _BaseQueue(Generic[C, R]):
    """Shared configuration and the parts of the API that do not touch Redis.

    ``R`` is the client type a subclass takes; ``_clients`` checks it at run time.
    """

    _clients: ClassVar[tuple[type, ...]]
    _clients_doc: ClassVar[str]
    _twin: ClassVar[tuple[tuple[type, ...], str]]

    def __init__(
        self,
        contract: type[C],
        redis: R,
        *,
        prefix: str = DEFAULT_PREFIX,
        secondary_when: SecondaryRule | None = None,
        secondary: bool | None = None,
        hooks: Hooks | None = None,
        max_payload_bytes: int | None = None,
        tenant_flags_staleness: Duration | None = DEFAULT_FLAG_STALENESS_S,
        group: str = DEFAULT_GROUP,
        durable: Durability | None = None,
        _sharding_key: str | None = None,
    ) -> None:
        self.contract = contract
        self._lookup = Lookup(contract, prefix, group)
        if durable is not None and not isinstance(durable, Durability):
            raise ConfigurationError(
                f"durable must be a Durability or None, got {type(durable).__name__}",
                queue=contract.queue_name,
            )
        self.durable = durable
        self._planner = _Planner(
            contract,
            prefix=prefix,
            secondary_when=secondary_when,
            use_secondary=secondary,
            hooks=hooks,
            max_payload_bytes=max_payload_bytes,
            flags_staleness=tenant_flags_staleness,
        )
        # A client of the other kind fails late and badly: an async client in a SyncQueue
        # returns un-awaited coroutines (nothing written, an id returned), a sync client in a
        # Queue writes the job and then raises (a retrying caller enqueues it twice).
        if not isinstance(redis, self._clients):
            twin_clients, twin = self._twin
            hint = f"; use {twin} for this client" if isinstance(redis, twin_clients) else ""
            raise ConfigurationError(
                f"{type(self).__name__} needs a {self._clients_doc} client, got "
                f"{_type_name(type(redis))}{hint}",
                queue=contract.queue_name,
            )
        self.redis: R = redis
        self._bound_key = _sharding_key
        staleness = self._planner.flags_staleness_s
        if staleness is not None:
            self._planner.flags = shared_view(redis, contract, prefix=prefix,
                                              staleness_s=staleness)

    def _view(self, sharding_key: str) -> Self:
        """A copy bound to ``sharding_key``'s shard, sharing this queue's planner (and so its
        settings and its record of which lanes hold the contract fingerprint)."""
        view = copy.copy(self)
        view._bound_key = sharding_key
        return view

    @property
    def name(self) -> str:
        """The name of the lane this queue writes to by default."""
        return self._planner.default_lane.name

    def shard_names(self) -> list[str]:
        """Shard names of the default lane: ``[<queue>, <queue>-1, ...]``."""
        return self._planner.default_lane.shard_names()

    def shard_for(self, sharding_key: str) -> str:
        """The shard name ``sharding_key`` maps to (stable across processes and versions)."""
        lane = self._planner.default_lane
        return lane.shard_names()[lane.shard_for(sharding_key)]

    def _prepare(
        self,
        job: JobSpec[Any] | str,
        payload: Any,
        job_id: str | None,
        delay: timedelta | int | None,
        sharding_key: str | None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> _Prepared:
        planner = self._planner
        return planner.prepare(
            planner.codec(job),
            payload,
            job_id,
            delay,
            sharding_key if sharding_key is not None else self._bound_key,
            _Stamp(),
            track,
            keep_result,
        )

    def _targets(self) -> list[tuple[str, ShardKeys]]:
        return self._lookup.targets(self._bound_key)

    def _prepare_many(self, requests: Iterable[_AnyJobRequest]) -> list[list[_Prepared]]:
        """Every request validated and encoded, cut into batches of at most
        :data:`BULK_BATCH` jobs and about :data:`BULK_BATCH_BYTES` payload bytes."""
        planner = self._planner
        codecs, prepare, bound = planner.codecs, planner.prepare, self._bound_key
        batches: list[list[_Prepared]] = []
        batch: list[_Prepared] = []
        size = 0
        stamp = _Stamp()
        for r in requests:
            if type(r) is not JobRequest and not isinstance(r, JobRequest):
                raise ConfigurationError(
                    f"add_bulk takes JobRequest items, got {type(r).__name__}",
                    queue=self.name,
                )
            codec = codecs.get(r.job) or planner.codec(r.job)
            key = r.sharding_key
            track = getattr(r, "track", None)
            keep = getattr(r, "keep_result", None)
            p = prepare(codec, r.payload, r.job_id, r.delay, bound if key is None else key, stamp,
                        track, keep)
            n = len(p.values[_PAYLOAD_AT])
            if batch and (len(batch) >= BULK_BATCH or size + n > BULK_BATCH_BYTES):
                batches.append(batch)
                batch, size = [], 0
                stamp = _Stamp()
            batch.append(p)
            size += n
        if batch:
            batches.append(batch)
        return batches


class Queue(_BaseQueue[C, redis_async.Redis | redis_async.RedisCluster]):
    """An asyncio producer typed by its contract.

    Args:
        contract: the ``QueueContract`` subclass.
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client (streamq never builds one);
            a synchronous client raises ``ConfigurationError`` (use :class:`SyncQueue`).
        prefix: key prefix shared with the workers.
        secondary_when: a rule ``(job_spec, payload) -> bool`` sending matching jobs to the
            contract's secondary lane (noisy tenants).
        secondary: ``True`` writes every job to the secondary lane, ``False`` every job to
            the primary lane (both ignore tenant flags); ``None`` (default) writes to the
            primary lane but routes the jobs of flagged tenants (and those ``secondary_when``
            matches) to the secondary lane.
        hooks: instrumentation (metrics, tracing).
        max_payload_bytes: override the contract's payload size limit.
        tenant_flags_staleness: how stale this producer's view of the flagged tenants may
            be (timedelta or seconds; default 1 s): a flag set or lifted is followed by
            every add from that long after on, while Redis answers. The view is read at most
            every half of it, never once per add. ``None`` ignores tenant flags. Only used
            when the contract has a ``tenant_field`` and a secondary lane.
        durable: wait after each add until this many replicas confirmed it (``WAIT`` on
            the connection that wrote it); too few in time raises
            :class:`~streamq.errors.NotReplicated`. See :mod:`streamq.durability`.

    The first successful send to each lane also records the contract's fingerprint in the
    lane's meta hash (one extra call, once per ``Queue`` and its ``for_key`` views); see
    :mod:`streamq.fingerprint`.
    """

    _clients = (redis_async.Redis, redis_async.RedisCluster)
    _clients_doc = "redis.asyncio.Redis or redis.asyncio.RedisCluster"
    _twin = ((redis_sync.Redis, redis_sync.RedisCluster), "SyncQueue")

    def for_key(self, sharding_key: str) -> Queue[C]:
        """A view of this queue whose adds all go to ``sharding_key``'s shard."""
        return self._view(sharding_key)

    @overload
    async def add(
        self,
        job: JobSpec[P],
        payload: P | Mapping[str, Any],
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str: ...

    @overload
    async def add(
        self,
        job: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str: ...

    async def add(
        self,
        job: JobSpec[Any] | str,
        payload: Any,
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str:
        """Validate and enqueue one job; returns its id.

        With ``job_id``, a second add of the same id within the dedup window adds nothing
        and returns the same id. ``delay`` is a timedelta or seconds; the due time is computed
        on the Redis server clock.

        The dedup window (the contract's ``dedup_window_ms``) counts from the add, not from
        the due time. With a window shorter than the delay, a re-add of the id after the
        window is accepted as a second job, and both run, even while the first still waits.
        To make one id one run, give delayed jobs a window of at least the delay plus the
        expected run time (retries included).

        ``track=True`` tracks this add (:meth:`status`, :meth:`cancel`, progress) even when
        the contract does not; ``keep_result`` (a timedelta or seconds) also keeps the job's final
        record and result that long (:meth:`result`). ``track=False`` turns the contract's
        tracking off for this add. See :doc:`job-control`.

        Raises:
            UnknownJob, InvalidPayload, PayloadTooLarge: before anything is sent.
            RedisUnavailable, RedisOutOfMemory: the job was not enqueued (or, for a
                connection lost mid-reply, may have been: add with ``job_id`` to retry).
            NotReplicated: with ``durable=``, the job is on the primary but too few
                replicas confirmed it in time.
        """
        flags = self._planner.flags
        if flags is not None:
            await flags.refresh(self.redis)
        prepared = [
            self._prepare(job, payload, job_id, delay, sharding_key, track, keep_result)
        ]
        return (await self._send(prepared))[0]

    async def add_bulk(self, requests: Iterable[_AnyJobRequest]) -> list[str]:
        """Validate every job first, then enqueue them in one pipelined round trip per batch
        (500 jobs or 8 MiB of payload), one script call per shard in the batch.

        Returns the job ids, in request order. Each shard's part of a batch is atomic; the
        whole call is not: if Redis fails midway, earlier batches (or other shards of the
        failing batch) may be enqueued. Give ``job_id`` to make a retry of the call safe.

        Example::

            ids = await queue.add_bulk(
                JobRequest(Ingestion.ingest_event, e, job_id=e.event_id) for e in events
            )
        """
        flags = self._planner.flags
        if flags is not None:
            await flags.refresh(self.redis)
        out: list[str] = []
        for batch in self._prepare_many(requests):
            out.extend(await self._send(batch))
        return out

    async def status(self, job_id: str) -> JobStatus:
        """Where tracked job ``job_id`` is: one script call per shard, in one pipelined
        round trip, without scanning a stream.

        Without a bound key every shard of the contract's lanes is asked; on a view from
        :meth:`for_key` only that key's shard (in each lane): look up a job added with a
        ``sharding_key`` through ``queue.for_key(key).status(job_id)`` or through the
        unbound queue. A job that is not tracked (or whose final record expired) is
        ``unknown``.

        Example::

            st = await queue.status(job_id)
            if st.state == "active":
                print(st.consumer, st.progress)
        """
        targets = self._targets()
        replies = await run_calls(
            self.redis, self._lookup.status_calls(job_id, targets), queue=self.name
        )
        return self._lookup.pick(job_id, targets, replies)[0]

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel tracked job ``job_id``: a waiting or delayed job is removed at once (it
        never runs); a running one is asked to stop (its worker sees the request at its next
        lock renewal, cancels an async processor and sets ``job.cancel_requested``) and ends
        ``cancelled`` unless it completes first. Shards are looked up as in :meth:`status`.
        """
        targets = self._targets()
        replies = await run_calls(
            self.redis, self._lookup.cancel_calls(job_id, targets), queue=self.name
        )
        result = self._lookup.cancel_result(job_id, targets, replies)
        _log_cancel(result)
        return result

    # The timeout is Redis's: one blocking BLMOVE waits, not an asyncio timer.
    async def result(self, job_id: str, *, timeout: timedelta | float) -> Any:  # noqa: ASYNC109
        """Wait up to ``timeout`` (timedelta or seconds) for tracked job ``job_id`` to finish;
        return its result: an instance of the job's result model, the decoded JSON when it
        has none, or None when the processor returned nothing.

        One blocking ``BLMOVE`` on the job's final record waits, no polling. The client's
        ``socket_timeout`` (if any) must be longer than ``timeout``.

        Raises:
            JobNotFound: the job is not tracked, or its final record expired.
            JobFailed: it was dead-lettered (``reason``, ``error``).
            JobCancelled: it was cancelled.
            ResultTimeout: it did not finish in time.
            ConfigurationError: the job keeps no final record (no ``keep_result``).
        """
        timeout_s = _timeout_s(timeout)
        targets = self._targets()
        replies = await run_calls(
            self.redis, self._lookup.status_calls(job_id, targets), queue=self.name
        )
        st, sk = self._lookup.pick(job_id, targets, replies)
        key = self._lookup.wait_key(st, sk)
        try:
            raw = await self.redis.execute_command("BLMOVE", key, key, "LEFT", "LEFT", timeout_s)
        except Exception as exc:
            raise map_error(exc, queue=self.name) or exc from exc
        return self._lookup.waited(job_id, st, sk, raw, timeout_s)

    async def _send(self, prepared: list[_Prepared]) -> list[str]:
        calls, groups = self._planner.calls(prepared)
        try:
            if self.durable is None:
                replies = await run_calls(self.redis, calls, queue=self.name)
            else:
                replies = await run_durable(self.redis, calls, self.durable, queue=self.name,
                                            job_ids=[[p.job_id for p in g] for g in groups])
        except Exception as exc:
            self._planner.failed(prepared, exc)
            raise
        self._planner.finish(groups, replies)
        ids = [p.job_id for p in prepared]
        for qkeys in self._planner.to_record(prepared):
            try:
                await record_contract(self.redis, qkeys, self.contract)
            except Exception as exc:
                self._planner.record_failed(qkeys, exc)
        return ids


class SyncQueue(_BaseQueue[C, redis_sync.Redis | redis_sync.RedisCluster]):
    """The synchronous twin of :class:`Queue` for sync web apps (Django, Flask).

    Takes a ``redis.Redis`` or ``redis.RedisCluster`` client (an asyncio client raises
    ``ConfigurationError``: use :class:`Queue`); same arguments otherwise.
    """

    _clients = (redis_sync.Redis, redis_sync.RedisCluster)
    _clients_doc = "redis.Redis or redis.RedisCluster"
    _twin = ((redis_async.Redis, redis_async.RedisCluster), "Queue")

    def for_key(self, sharding_key: str) -> SyncQueue[C]:
        """A view of this queue whose adds all go to ``sharding_key``'s shard."""
        return self._view(sharding_key)

    @overload
    def add(
        self,
        job: JobSpec[P],
        payload: P | Mapping[str, Any],
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str: ...

    @overload
    def add(
        self,
        job: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str: ...

    def add(
        self,
        job: JobSpec[Any] | str,
        payload: Any,
        *,
        job_id: str | None = None,
        delay: timedelta | int | None = None,
        sharding_key: str | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
    ) -> str:
        """Validate and enqueue one job; see :meth:`Queue.add`."""
        flags = self._planner.flags
        if flags is not None:
            flags.refresh_sync(self.redis)
        prepared = [
            self._prepare(job, payload, job_id, delay, sharding_key, track, keep_result)
        ]
        return self._send(prepared)[0]

    def add_bulk(self, requests: Iterable[_AnyJobRequest]) -> list[str]:
        """Validate every job, then enqueue them pipelined; see :meth:`Queue.add_bulk`."""
        flags = self._planner.flags
        if flags is not None:
            flags.refresh_sync(self.redis)
        out: list[str] = []
        for batch in self._prepare_many(requests):
            out.extend(self._send(batch))
        return out

    def status(self, job_id: str) -> JobStatus:
        """Where tracked job ``job_id`` is; see :meth:`Queue.status`."""
        targets = self._targets()
        replies = run_calls_sync(
            self.redis, self._lookup.status_calls(job_id, targets), queue=self.name
        )
        return self._lookup.pick(job_id, targets, replies)[0]

    def cancel(self, job_id: str) -> CancelResult:
        """Cancel tracked job ``job_id``; see :meth:`Queue.cancel`."""
        targets = self._targets()
        replies = run_calls_sync(
            self.redis, self._lookup.cancel_calls(job_id, targets), queue=self.name
        )
        result = self._lookup.cancel_result(job_id, targets, replies)
        _log_cancel(result)
        return result

    def result(self, job_id: str, *, timeout: timedelta | float) -> Any:
        """Wait for tracked job ``job_id``'s result; see :meth:`Queue.result`."""
        timeout_s = _timeout_s(timeout)
        targets = self._targets()
        replies = run_calls_sync(
            self.redis, self._lookup.status_calls(job_id, targets), queue=self.name
        )
        st, sk = self._lookup.pick(job_id, targets, replies)
        key = self._lookup.wait_key(st, sk)
        try:
            raw = self.redis.execute_command(  # type: ignore[no-untyped-call]
                "BLMOVE", key, key, "LEFT", "LEFT", timeout_s
            )
        except Exception as exc:
            raise map_error(exc, queue=self.name) or exc from exc
        return self._lookup.waited(job_id, st, sk, raw, timeout_s)

    def _send(self, prepared: list[_Prepared]) -> list[str]:
        calls, groups = self._planner.calls(prepared)
        try:
            if self.durable is None:
                replies = run_calls_sync(self.redis, calls, queue=self.name)
            else:
                replies = run_durable_sync(self.redis, calls, self.durable, queue=self.name,
                                           job_ids=[[p.job_id for p in g] for g in groups])
        except Exception as exc:
            self._planner.failed(prepared, exc)
            raise
        self._planner.finish(groups, replies)
        ids = [p.job_id for p in prepared]
        for qkeys in self._planner.to_record(prepared):
            try:
                record_contract_sync(self.redis, qkeys, self.contract)
            except Exception as exc:
                self._planner.record_failed(qkeys, exc)
        return ids
