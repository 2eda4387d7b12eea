"""Every Redis key streamq uses, built in one pure module.

Each key of one queue shard carries the hash tag ``{<queue>:<shard>}``, so every atomic script
touches a single cluster slot and a shard can live on any Redis Cluster node. Queue-wide keys
(meta, limiter) carry ``{<queue>}``.

===========================================  ======  =================================
key                                          type    holds
===========================================  ======  =================================
``<prefix>:{<queue>:<shard>}:stream``        stream  jobs ready or in flight
``<prefix>:{<queue>:<shard>}:delayed``       zset    record key -> due time (ms)
``<prefix>:{<queue>:<shard>}:jobs``          hash    record key -> encoded delayed/retrying job
``<prefix>:{<queue>:<shard>}:dedup:<id>``    string  dedup marker for a caller-given id (TTL)
``<prefix>:{<queue>:<shard>}:dead``          stream  dead letters (capped)
``<prefix>:{<queue>:<shard>}:starts``        hash    entry id -> runs started, never settled
``<prefix>:{<queue>:<shard>}:settled:<t>``   string  a settle call's reply, for re-sends (TTL)
``<prefix>:{<queue>:<shard>}:tracked``       hash    job id -> where a tracked job is (JSON)
``<prefix>:{<queue>:<shard>}:result:<id>``   list    a tracked job's final record (TTL)
``<prefix>:{<queue>}:meta``                  hash    paused flag, contract fingerprint
``<prefix>:{<queue>}:limiter``               hash    global rate-limit window (TTL)
``<prefix>:{<queue>}:workers``               hash    consumer name -> last heartbeat (ms)
``<prefix>:{<queue>}:schedules``             hash    ``<name>:paused``, ``<name>:last_run`` (ms)
``<prefix>:{<queue>}:schedule-ticks``        zset    schedule name -> last tick handled (ms)
``<prefix>:{<queue>}:tenant-flags``          zset    flagged tenant -> flag expiry (ms)
``<prefix>:{<queue>}:tenant-reasons``        hash    flagged tenant -> JSON reason, since (ms)
``<prefix>:{<queue>}:tenant-slots:<t>``      zset    running job of tenant t -> lease expiry
``<prefix>:{runner:<name>}:lease``           hash    a singleton runner's holder and token (TTL)
``<prefix>:{runner:<name>}:fence``           string  the last fencing token given (a counter)
``<prefix>:{runner:<name>}:data:<key>``      any     a runner's fenced data (``fenced_set``)
===========================================  ======  =================================

A delayed record's key is ``<job id>:<random>`` (an add) or ``<job id>:<entry id>`` (a
retry), never the bare job id: two accepted copies of one id never overwrite each other.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

from streamq.errors import ConfigurationError

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_PREFIX",
    "QueueKeys",
    "RunnerKeys",
    "ShardKeys",
    "check_prefix",
    "shard_index",
    "shard_name",
]

DEFAULT_PREFIX = "streamq"
"""The key prefix producers and workers use unless told otherwise."""
DEFAULT_GROUP = "streamq"
"""The consumer group workers read in unless told otherwise."""

NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def check_prefix(prefix: str) -> None:
    """Refuse a prefix that would break the layout.

    Braces would take over the hash tag (Redis hashes the first ``{...}``), putting every
    shard of every queue in one cluster slot.
    """
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"key prefix {prefix!r} is invalid: it must be non-empty and contain no braces"
        )


def shard_index(key: str, shards: int) -> int:
    """The shard of ``key``: ``int(sha256(key).hexdigest()[:8], 16) % shards``.

    Stable across processes, versions and languages.
    """
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % shards


def shard_name(queue: str, index: int) -> str:
    """Shard 0 is named after the queue, shard ``i`` is ``<queue>-<i>``."""
    return queue if index == 0 else f"{queue}-{index}"


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one queue shard; all share the hash tag ``{<queue>:<index>}``."""

    prefix: str
    queue: str
    index: int

    @property
    def name(self) -> str:
        return shard_name(self.queue, self.index)

    @property
    def tag(self) -> str:
        return f"{{{self.queue}:{self.index}}}"

    @property
    def stream(self) -> str:
        return f"{self.prefix}:{self.tag}:stream"

    @property
    def delayed(self) -> str:
        return f"{self.prefix}:{self.tag}:delayed"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:{self.tag}:jobs"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:{self.tag}:dead"

    @property
    def starts(self) -> str:
        """Hash entry id -> runs started without a settle (the stall budget, DESIGN §4)."""
        return f"{self.prefix}:{self.tag}:starts"

    @property
    def tracked(self) -> str:
        """Hash job id -> JSON record of where a tracked job is (:mod:`streamq.jobstatus`)."""
        return f"{self.prefix}:{self.tag}:tracked"

    def dedup(self, job_id: str) -> str:
        return f"{self.prefix}:{self.tag}:dedup:{job_id}"

    def result(self, job_id: str) -> str:
        """A tracked job's final record (completed, cancelled or dead, with its result): a
        one-element list, so a waiter blocks on it (``BLMOVE``); expires after ``keep``."""
        return f"{self.prefix}:{self.tag}:result:{job_id}"

    def settled(self, token: str) -> str:
        """A settle call's memo: its reply, kept briefly so a re-sent call answers the same."""
        return f"{self.prefix}:{self.tag}:settled:{token}"

    def all_static(self) -> tuple[str, ...]:
        """Every key of the shard except dedup markers, settle memos and final records (one
        per job/call)."""
        return (self.stream, self.delayed, self.jobs, self.dead, self.starts, self.tracked)


class QueueKeys:
    """The keys of one logical queue: queue-wide keys and one ``ShardKeys`` per shard."""

    __slots__ = ("__dict__", "prefix", "queue", "shard_count")

    def __init__(self, prefix: str, queue: str, shard_count: int) -> None:
        check_prefix(prefix)
        self.prefix = prefix
        self.queue = queue
        self.shard_count = shard_count

    @cached_property
    def shards(self) -> tuple[ShardKeys, ...]:
        return tuple(ShardKeys(self.prefix, self.queue, i) for i in range(self.shard_count))

    @property
    def tag(self) -> str:
        return f"{{{self.queue}}}"

    @property
    def meta(self) -> str:
        return f"{self.prefix}:{self.tag}:meta"

    @property
    def limiter(self) -> str:
        return f"{self.prefix}:{self.tag}:limiter"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:{self.tag}:workers"

    @property
    def schedules(self) -> str:
        """Hash of the queue's schedules (:mod:`streamq.schedules`): ``<name>:paused`` and
        ``<name>:last_run`` (the last tick enqueued, ms)."""
        return f"{self.prefix}:{self.tag}:schedules"

    @property
    def schedule_ticks(self) -> str:
        """Zset schedule name -> the last tick the fleet handled (ms), only ever raised."""
        return f"{self.prefix}:{self.tag}:schedule-ticks"

    @property
    def tenant_flags(self) -> str:
        """Zset flagged tenant -> when its flag expires (ms, Redis clock); kept on the
        queue's primary lane and read by producers (:mod:`streamq.tenants`)."""
        return f"{self.prefix}:{self.tag}:tenant-flags"

    @property
    def tenant_reasons(self) -> str:
        """Hash flagged tenant -> JSON ``{"reason", "since_ms"}`` of its flag."""
        return f"{self.prefix}:{self.tag}:tenant-reasons"

    def tenant_slots(self, tenant: str) -> str:
        """Zset of the running jobs of ``tenant`` (slot holder -> lease expiry ms), the
        per-tenant concurrency cap; kept on the queue's primary lane."""
        return f"{self.prefix}:{self.tag}:tenant-slots:{tenant}"

    def for_key(self, sharding_key: str) -> ShardKeys:
        return self.shards[shard_index(sharding_key, self.shard_count)]


@dataclass(frozen=True, slots=True)
class RunnerKeys:
    """The keys of one runner (:mod:`streamq.runners`); all share the hash tag
    ``{runner:<name>}``, so a lease script touches one cluster slot."""

    prefix: str
    name: str

    @property
    def tag(self) -> str:
        return f"{{runner:{self.name}}}"

    @property
    def lease(self) -> str:
        """Hash ``holder``, ``token``: who leads a singleton runner; expires with the lease."""
        return f"{self.prefix}:{self.tag}:lease"

    @property
    def fence(self) -> str:
        """The last fencing token given (INCR on each acquisition); never expires, so tokens
        only grow."""
        return f"{self.prefix}:{self.tag}:fence"

    def data(self, key: str) -> str:
        """A key of the runner's own slot, for fenced writes on a Redis Cluster."""
        return f"{self.prefix}:{self.tag}:data:{key}"
