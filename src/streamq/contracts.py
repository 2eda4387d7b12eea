"""Contracts: queue names, job names and payload schemas, declared once.

Producer services and workers import the same contracts module; it is the only thing they
share. Declarations are validated when the module is imported.

Example::

    from pydantic import BaseModel
    from streamq import QueueContract, job

    class IngestEvent(BaseModel):
        project_id: str
        event_id: str

    class Ingestion(QueueContract, name="ingestion", shards=4, secondary_shards=1,
                    tenant_field="project_id"):
        ingest_event = job("ingest-event", IngestEvent)

    CONTRACTS = ContractSet(Ingestion)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Generic, TypeVar, get_args

from pydantic import BaseModel

from streamq.backoff import Backoff
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError, ContractError
from streamq.keys import NAME_RE, shard_index, shard_name

__all__ = [
    "ContractSet",
    "JobDefaults",
    "JobSpec",
    "Lane",
    "QueueContract",
    "job",
]

P = TypeVar("P", bound=BaseModel)

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ContractError(
            f"{kind} name {name!r} is invalid: use lowercase letters, digits and single '-' "
            "(e.g. 'ingest-event')"
        )


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """Default options of a queue's jobs (workers may override attempts and backoff).

    Attributes:
        attempts: runs before a failing job is dead-lettered (1 = no retry).
        backoff: delay policy between attempts.
        dedup_window: how long a caller-given job id blocks a second add of the same id (a
            timedelta or seconds; default one hour).
        max_payload_bytes: encoded payload size limit; larger adds raise ``PayloadTooLarge``.
    """

    attempts: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff.exponential(timedelta(seconds=1)))
    dedup_window: Duration = timedelta(hours=1)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ContractError(f"attempts must be >= 1, got {self.attempts}")
        try:
            to_ms(self.dedup_window, "dedup_window", minimum=1)
        except ConfigurationError as exc:
            raise ContractError(str(exc)) from None
        if self.max_payload_bytes < 1:
            raise ContractError(f"max_payload_bytes must be >= 1, got {self.max_payload_bytes}")


    @property
    def dedup_window_ms(self) -> int:
        """The dedup window in milliseconds (what Redis is given)."""
        return to_ms(self.dedup_window, "dedup_window")


DEFAULT_KEEP_RESULT_MS = 3_600_000
"""How long a job with a result model keeps its final record when the contract names no
``keep_result``: one hour."""


def _keep_ms(name: str, keep: Duration | None) -> int | None:
    if keep is None:
        return None
    try:
        ms = to_ms(keep, f"job {name!r}: keep_result", minimum=1)
    except ConfigurationError as exc:
        raise ContractError(str(exc), job=name) from None
    return ms


class JobSpec(Generic[P]):
    """One job of a queue: its name, payload model and tracking options. Made with
    :func:`job`.

    Attributes:
        result_model: the model a processor's return value is validated against, or None.
        keep_result_ms: how long the job's final record (and result) is kept, or None.
        track: whether adds of this job are tracked (status, cancel, progress) by default.
    """

    __slots__ = ("keep_result_ms", "model", "name", "queue", "result_model", "track")

    def __init__(
        self,
        name: str,
        model: type[P],
        *,
        result: type[BaseModel] | None = None,
        keep_result: Duration | None = None,
        track: bool = False,
    ) -> None:
        _check_name("job", name)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ContractError(f"job {name!r}: payload model must be a pydantic BaseModel")
        if result is not None and not (isinstance(result, type) and issubclass(result, BaseModel)):
            raise ContractError(
                f"job {name!r}: result model must be a pydantic BaseModel, got {result!r}",
                job=name,
            )
        keep_ms = _keep_ms(name, keep_result)
        if keep_ms is None and result is not None:
            keep_ms = DEFAULT_KEEP_RESULT_MS
        self.result_model: type[BaseModel] | None = result
        self.keep_result_ms: int | None = keep_ms
        self.track: bool = bool(track) or keep_ms is not None
        forbidding = _models_forbidding_extra(model)
        if forbidding:
            raise ContractError(
                f"job {name!r}: payload model {forbidding[0].__name__} forbids extra fields; a "
                "newer producer's additive fields would then poison older workers. Use the "
                "default extra='ignore'.",
                job=name,
            )
        self.name = name
        self.model: type[P] = model
        self.queue: type[QueueContract] | None = None

    def __repr__(self) -> str:
        q = self.queue.queue_name if self.queue else "?"
        return f"JobSpec({q}/{self.name}, {self.model.__name__})"


def _models_forbidding_extra(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model`` and the models nested in its fields (any depth) that set extra='forbid'."""
    found: list[type[BaseModel]] = []
    seen: set[type[BaseModel]] = set()
    todo: list[Any] = [model]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            if t in seen:
                continue
            seen.add(t)
            if t.model_config.get("extra") == "forbid":
                found.append(t)
            todo.extend(f.annotation for f in t.model_fields.values())
        else:
            todo.extend(get_args(t))
    return found


def job(
    name: str,
    model: type[P],
    *,
    result: type[BaseModel] | None = None,
    keep_result: Duration | None = None,
    track: bool = False,
) -> JobSpec[P]:
    """Declare a job of a queue contract: ``ingest_event = job("ingest-event", IngestEvent)``.

    Args:
        name: the job name (``[a-z0-9-]``).
        model: the payload model.
        result: a model the processor's return value is validated against and stored as
            (see :doc:`job-control`); implies ``keep_result`` of one hour unless given.
        keep_result: how long a finished job's final record (state, result, error) is kept
            (a timedelta or seconds); implies ``track``.
        track: track every add of this job: ``Queue.status``, ``cancel`` and progress work
            for it. Untracked jobs cost nothing extra; an add can ask for tracking itself.

    Example::

        report = job("report", ReportRequest, result=Report, keep_result=timedelta(hours=6))
    """
    return JobSpec(name, model, result=result, keep_result=keep_result, track=track)


@dataclass(frozen=True, slots=True)
class Lane:
    """A logical queue that jobs are written to and consumed from: a contract's primary lane,
    or its secondary (isolation) lane for noisy keys, which has the same jobs."""

    contract: type[QueueContract]
    name: str
    shards: int
    secondary: bool = False

    def shard_names(self) -> list[str]:
        return [shard_name(self.name, i) for i in range(self.shards)]

    def shard_for(self, sharding_key: str) -> int:
        return shard_index(sharding_key, self.shards)


class QueueContract:
    """Base class of a queue declaration; subclass it with class keywords.

    Class keywords:
        name: the queue name (``[a-z0-9-]``).
        shards: shard count (>= 1). Changing it remaps keys to shards.
        secondary_shards: when set, the queue has a secondary lane ``<name>-secondary``.
        defaults: :class:`JobDefaults` for the queue's jobs.
        tenant_field: payload field naming the tenant (span attribute, log context).
        secret_fields: payload fields never shown in logs, spans or dead-letter listings.
    """

    queue_name: ClassVar[str]
    shards: ClassVar[int]
    secondary_shards: ClassVar[int | None]
    defaults: ClassVar[JobDefaults]
    tenant_field: ClassVar[str | None]
    secret_fields: ClassVar[frozenset[str]]
    jobs: ClassVar[Mapping[str, JobSpec[Any]]]
    primary: ClassVar[Lane]
    secondary: ClassVar[Lane | None]

    def __init_subclass__(
        cls,
        *,
        name: str,
        shards: int = 1,
        secondary_shards: int | None = None,
        defaults: JobDefaults | None = None,
        tenant_field: str | None = None,
        secret_fields: frozenset[str] | set[str] | tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        _check_name("queue", name)
        for what, n in (("shards", shards), ("secondary_shards", secondary_shards)):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
                raise ContractError(f"queue {name!r}: {what} must be an integer >= 1, got {n!r}")
        jobs: dict[str, JobSpec[Any]] = {}
        for attr, value in vars(cls).items():
            if isinstance(value, JobSpec):
                if value.name in jobs:
                    raise ContractError(
                        f"queue {name!r}: job name {value.name!r} is declared twice", queue=name
                    )
                if value.queue is not None and value.queue is not cls:
                    raise ContractError(
                        f"queue {name!r}: job {value.name!r} ({attr}) already belongs to queue "
                        f"{value.queue.queue_name!r}",
                        queue=name,
                    )
                jobs[value.name] = value
        if not jobs:
            raise ContractError(f"queue {name!r} declares no jobs", queue=name)
        if defaults is not None and not isinstance(defaults, JobDefaults):
            raise ContractError(f"queue {name!r}: defaults must be a JobDefaults", queue=name)
        cls.queue_name = name
        cls.shards = shards
        cls.secondary_shards = secondary_shards
        cls.defaults = defaults or JobDefaults()
        cls.tenant_field = tenant_field
        cls.secret_fields = frozenset(secret_fields)
        cls.jobs = jobs
        cls.primary = Lane(cls, name, shards)
        cls.secondary = (
            Lane(cls, f"{name}-secondary", secondary_shards, secondary=True)
            if secondary_shards
            else None
        )
        for spec in jobs.values():
            _check_fields(cls, spec)
        # Bind only once every check passed: a refused declaration leaves its specs unowned.
        for spec in jobs.values():
            spec.queue = cls

    @classmethod
    def lanes(cls) -> tuple[Lane, ...]:
        """The primary lane, then the secondary lane when declared."""
        return (cls.primary,) if cls.secondary is None else (cls.primary, cls.secondary)

    @classmethod
    def job_spec(cls, name: str) -> JobSpec[Any] | None:
        return cls.jobs.get(name)

    @classmethod
    def shard_names(cls) -> list[str]:
        return cls.primary.shard_names()


def _check_fields(cls: type[QueueContract], spec: JobSpec[Any]) -> None:
    fields = spec.model.model_fields
    if cls.tenant_field and cls.tenant_field not in fields:
        raise ContractError(
            f"queue {cls.queue_name!r}: tenant_field {cls.tenant_field!r} is not a field of "
            f"job {spec.name!r} ({spec.model.__name__})",
            queue=cls.queue_name,
            job=spec.name,
        )


class ContractSet:
    """All the queue contracts of an application; refuses two queues with one name.

    Example::

        CONTRACTS = ContractSet(Ingestion, Evaluation, Deletion)
    """

    def __init__(self, *contracts: type[QueueContract]) -> None:
        self._by_name: dict[str, type[QueueContract]] = {}
        shard_owner: dict[str, str] = {}
        for c in contracts:
            if not (isinstance(c, type) and issubclass(c, QueueContract)):
                raise ContractError(f"{c!r} is not a QueueContract subclass")
            for lane in c.lanes():
                if lane.name in self._by_name:
                    raise ContractError(
                        f"queue name {lane.name!r} is declared twice", queue=lane.name
                    )
                self._by_name[lane.name] = c
            # Shard names label metrics, logs and admin commands: two shards with one name
            # (shard 1 of 'a' is 'a-1', as is shard 0 of a queue 'a-1') cannot be told apart.
            for lane in c.lanes():
                for shard in lane.shard_names():
                    if shard in shard_owner:
                        raise ContractError(
                            f"shard name {shard!r} of queue {lane.name!r} is also a shard of "
                            f"queue {shard_owner[shard]!r}",
                            queue=lane.name,
                        )
                    shard_owner[shard] = lane.name

    def __iter__(self) -> Iterator[type[QueueContract]]:
        seen: list[type[QueueContract]] = []
        for c in self._by_name.values():
            if c not in seen:
                seen.append(c)
        return iter(seen)

    def __len__(self) -> int:
        return len(list(iter(self)))

    def lanes(self) -> list[Lane]:
        return [lane for c in self for lane in c.lanes()]

    def lane(self, name: str) -> Lane:
        c = self._by_name.get(name)
        if c is None:
            raise ContractError(f"no queue named {name!r}", queue=name)
        return next(lane for lane in c.lanes() if lane.name == name)
