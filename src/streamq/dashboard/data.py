"""What the dashboard shows, read from Redis, and what its actions do; no web framework here.

Every figure comes from the modules that own it, so the dashboard can never disagree with the
``streamq`` command or with ``/metrics``:

* depth (ready, in flight, delayed, dead and the oldest ready job's age per shard) and the
  paused flag from :class:`~streamq.admin.QueueAdmin`; consumers from
  :meth:`QueueAdmin.consumers`;
* dead letters from :class:`~streamq.deadletters.DeadLetters`, payloads already redacted of
  the contract's ``secret_fields``;
* schedules from :class:`~streamq.schedules.Schedules`; runner leases from their lease hash
  (:mod:`streamq.lease`).

Job lookup is :func:`find_job`: a tracked job's status, and the dead letters of any job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from streamq.admin import ConsumerInfo, QueueAdmin, QueueDepth
from streamq.app import App
from streamq.contracts import ContractSet, Lane, QueueContract
from streamq.deadletters import DeadLetter, DeadLetters, decode_dead
from streamq.driver import Cmds, Steps, cmd, drive, text
from streamq.errors import ConfigurationError, ContractError
from streamq.jobstatus import JobStatus
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX, QueueKeys, RunnerKeys
from streamq.schedules import ScheduleInfo, Schedules

__all__ = [
    "JobLookup",
    "LaneView",
    "RunnerView",
    "Source",
    "check_job_id",
    "find_job",
    "read_consumers",
    "read_dead_letter",
    "read_lane",
    "read_runners",
    "read_schedules",
]

MAX_JOB_ID_CHARS = 256
_JOB_ID_RE = re.compile(r"^[\x21-\x7e]+$")


@dataclass(frozen=True)
class Source:
    """Where the dashboard reads: a Redis client, the application's contracts (and its app,
    for schedules and runners), the key prefix and the consumer group.

    Build it with :meth:`of`, which accepts what ``create_app`` does.
    """

    client: Any
    contracts: ContractSet
    app: App[Any] | None = None
    prefix: str = DEFAULT_PREFIX
    group: str = DEFAULT_GROUP

    @classmethod
    def of(
        cls,
        contracts: ContractSet | App[Any] | type[QueueContract] | Iterable[type[QueueContract]],
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        group: str = DEFAULT_GROUP,
    ) -> Source:
        """A source from a ``ContractSet``, an ``App``, one contract or a list of them.

        Raises:
            ConfigurationError: ``contracts`` is none of those.
        """
        app = contracts if isinstance(contracts, App) else None
        if isinstance(contracts, App):
            found = contracts.contracts
        elif isinstance(contracts, ContractSet):
            found = contracts
        elif isinstance(contracts, type) and issubclass(contracts, QueueContract):
            found = ContractSet(contracts)
        else:
            try:
                found = ContractSet(*contracts)
            except (TypeError, ContractError) as exc:
                raise ConfigurationError(
                    f"the dashboard needs a ContractSet, an App, a QueueContract or a list of "
                    f"them, got {contracts!r}: {exc}"
                ) from exc
        if not found.lanes():
            raise ConfigurationError("the dashboard was given no queue contracts")
        QueueKeys(prefix, "check", 1)  # refuses a malformed prefix now, not on the first page
        return cls(client, found, app, prefix, group)

    def lanes(self) -> list[Lane]:
        return self.contracts.lanes()

    def lane(self, name: str) -> Lane:
        """The lane called ``name``.

        Raises:
            ConfigurationError: no contract declares it (the message lists the queues).
        """
        try:
            return self.contracts.lane(name)
        except ContractError:
            known = ", ".join(lane.name for lane in self.lanes())
            raise ConfigurationError(
                f"unknown queue {name!r}; queues: {known}", queue=name
            ) from None

    def admin(self, lane: Lane) -> QueueAdmin:
        return QueueAdmin(self.client, lane, prefix=self.prefix, group=self.group)

    def dead(self, lane: Lane) -> DeadLetters:
        return DeadLetters(self.client, lane, prefix=self.prefix)


# -- queues ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneView:
    """One queue lane as the dashboard shows it: its depth as :meth:`QueueAdmin.depth` reads
    it (per shard, the totals, the oldest ready job's age and the paused flag)."""

    name: str
    queue: str
    secondary: bool
    depth: QueueDepth

    def __getattr__(self, name: str) -> Any:
        # The totals and the paused flag are the depth's own (ready, in_flight, delayed, dead,
        # oldest_ready_age_s, consumers, shards, paused): the templates read them on the view.
        if name == "depth":  # not set yet (a copy being built): never recurse
            raise AttributeError(name)
        return getattr(self.depth, name)

    def to_dict(self) -> dict[str, Any]:
        d = self.depth
        return {
            "queue": self.name,
            "contract": self.queue,
            "secondary": self.secondary,
            "paused": d.paused,
            "ready": d.ready,
            "in_flight": d.in_flight,
            "delayed": d.delayed,
            "dead": d.dead,
            "oldest_ready_age_s": round(d.oldest_ready_age_s, 3),
            "shards": [
                {
                    "shard": s.shard,
                    "ready": s.ready,
                    "in_flight": s.in_flight,
                    "delayed": s.delayed,
                    "dead": s.dead,
                    "oldest_ready_age_s": round(s.oldest_ready_age_s, 3),
                }
                for s in d.shards
            ],
        }


async def read_lane(src: Source, lane: Lane) -> LaneView:
    """Depth (with each shard's oldest ready age, on the Redis clock) and paused flag of
    ``lane``, read in one snapshot by :meth:`QueueAdmin.depth`."""
    depth = await src.admin(lane).depth()
    return LaneView(lane.name, lane.contract.queue_name, lane.secondary, depth)


async def read_consumers(src: Source, lane: Lane) -> list[ConsumerInfo]:
    """The lane's consumers (see :meth:`QueueAdmin.consumers`)."""
    return await src.admin(lane).consumers()


# -- dead letters ----------------------------------------------------------------------------


async def read_dead_letter(src: Source, lane: Lane, ref: str) -> DeadLetter | None:
    """The dead letter ``<shard>/<id>`` of ``lane`` (payload redacted), None when absent.

    Raises:
        ConfigurationError: ``ref`` is malformed or names a shard the lane does not have.
    """
    targets = src.dead(lane).resolve([ref])
    ((shard, ids),) = targets.items()
    secret = lane.contract.secret_fields

    def steps() -> Steps[DeadLetter | None]:
        (entries,) = yield Cmds([cmd("xrange", shard.dead, min=ids[0], max=ids[0], count=1)])
        if not entries:
            return None
        eid, fields = entries[0]
        return decode_dead(shard, eid, fields, secret)

    return await drive(src.client, lane.name, steps())


# -- job lookup ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobLookup:
    """What is known about one job id.

    Attributes:
        job_id: the id looked up.
        state: the tracked job's state (``waiting``, ``delayed``, ``active``, ``retrying``,
            ``completed``, ``cancelled``, ``dead``); for an untracked job ``dead`` when dead
            letters hold it, else ``not_found``.
        status: the tracked job's status (None when the job is not tracked, or forgotten).
        dead_letters: its dead letters, newest first, payloads redacted.
        searched: what was searched, said to the reader.
    """

    job_id: str
    state: str
    status: JobStatus | None = None
    dead_letters: tuple[DeadLetter, ...] = field(default=())
    searched: str = ""

    @property
    def found(self) -> bool:
        return self.state != "not_found"


def check_job_id(job_id: str) -> str:
    """``job_id`` stripped, or ``ConfigurationError`` naming the field when it cannot be one."""
    job_id = job_id.strip()
    if not job_id or len(job_id) > MAX_JOB_ID_CHARS or not _JOB_ID_RE.match(job_id):
        raise ConfigurationError(
            f"job id {job_id[:80]!r} is not a job id: give 1 to {MAX_JOB_ID_CHARS} printable "
            "characters without spaces (field 'id')",
            job_id=job_id[:80] or None,
        )
    return job_id


async def find_job(src: Source, job_id: str) -> JobLookup:
    """Look a job up by id: its status when it is tracked (``QueueAdmin.status``, one
    pipelined round trip per queue), and its dead letters, which also name untracked jobs
    (and carry the retry and purge links).

    Raises:
        ConfigurationError: ``job_id`` is empty, too long or has spaces (names the field).
    """
    job_id = check_job_id(job_id)
    status: JobStatus | None = None
    found: list[DeadLetter] = []
    for lane in src.lanes():
        if status is None:
            got = await src.admin(lane).status(job_id)
            if got.state != "unknown":
                status = got
        dead = src.dead(lane)
        secret = lane.contract.secret_fields

        def steps(dead: DeadLetters = dead, secret: frozenset[str] = secret) -> Steps[None]:
            for shard in dead.keys.shards:
                entries = yield from dead.scan_steps(shard)
                for eid, fields in entries:
                    if text(fields.get(b"id", fields.get("id"))) == job_id:
                        found.append(decode_dead(shard, eid, fields, secret))

        await drive(src.client, lane.name, steps())
    found.sort(key=lambda d: d.failed_at_ms, reverse=True)
    state = status.state if status is not None else "dead" if found else "not_found"
    searched = (f"the tracked jobs and the dead letters of {len(src.lanes())} queue(s)")
    return JobLookup(job_id, state, status, tuple(found), searched)


# -- schedules and runners ---------------------------------------------------------------------


async def read_schedules(src: Source) -> list[ScheduleInfo]:
    """The app's schedules (none without an app, or when it declares none)."""
    if src.app is None or not src.app.schedules:
        return []
    return await Schedules(src.client, src.app, prefix=src.prefix).list()


@dataclass(frozen=True, slots=True)
class RunnerView:
    """One declared runner and, for a singleton, who holds its lease.

    Attributes:
        name: the runner.
        singleton: one process of the fleet runs it at a time (the lease holder).
        every_s: its period, when periodic.
        holder: the lease holder (``<consumer>:<random>``), None when nobody holds it (or it
            is not a singleton: every process runs it).
        token: the holder's fencing token.
        lease_ttl_ms: how long the lease lasts unless renewed.
    """

    name: str
    singleton: bool
    every_s: float | None
    holder: str | None = None
    token: int | None = None
    lease_ttl_ms: int | None = None


async def read_runners(src: Source) -> list[RunnerView]:
    """The app's runners with their lease holders (none without an app)."""
    if src.app is None or not src.app.runners:
        return []
    specs = sorted(src.app.runners.values(), key=lambda s: s.name)
    singles = [s for s in specs if s.singleton]
    replies: list[Any] = []
    if singles:
        # One slot per runner: a cluster pipeline splits these by node.
        pipe = src.client.pipeline(transaction=False)
        for s in singles:
            key = RunnerKeys(src.prefix, s.name).lease
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = await pipe.execute()
    leases = {
        s.name: (replies[2 * i], replies[2 * i + 1]) for i, s in enumerate(singles)
    }
    out = []
    for s in specs:
        every = None if s.every_ms is None else s.every_ms / 1000
        if s.name not in leases:
            out.append(RunnerView(s.name, s.singleton, every))
            continue
        raw, ttl = leases[s.name]
        fields = {text(k): text(v) for k, v in (raw or {}).items()}
        holder = fields.get("holder") or None
        token = int(fields["token"]) if fields.get("token", "").isdigit() else None
        out.append(
            RunnerView(
                s.name, True, every, holder, token,
                int(ttl) if holder and int(ttl) >= 0 else None,
            )
        )
    return out
