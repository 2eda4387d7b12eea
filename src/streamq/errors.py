"""Every exception streamq raises, under one base class.

The tree::

    StreamqError
    ├── ContractError                 a contract declaration is invalid (raised at import)
    │   └── IncompatibleContract      a contract change would break running peers
    ├── ConfigurationError            an option or setting is malformed
    │   ├── ForeignConsumerGroup      a stream has a consumer group other than the worker's
    │   └── LoadError                 a ``module:attribute`` reference cannot be loaded
    ├── PayloadError                  a payload cannot be enqueued or consumed
    │   ├── InvalidPayload            the payload fails its job's schema
    │   ├── UnknownJob                the job name is not declared by the queue
    │   ├── PayloadTooLarge           the encoded payload is over the size limit
    │   └── InvalidResult             a processor's return value fails the job's result model
    ├── RedisUnavailable              Redis could not be reached or the connection broke
    ├── RedisOutOfMemory              Redis refused a write under ``maxmemory`` (noeviction)
    ├── NotReplicated                 a durable add reached too few replicas in time
    ├── RedisRefused                  Redis refused a command for good (NOPERM, WRONGTYPE, ...)
    │   └── PermissionsMissing        the ACL user lacks commands or keys its role needs
    ├── UnsafeRedisConfig             Redis would silently drop queue keys (eviction policy)
    ├── RegistrationError             a processor or queue registration is invalid
    ├── StartupHookFailed             an ``@app.on_startup`` hook raised; no worker started
    ├── LeadershipLost                a singleton runner's fenced write came from a lost lease
    ├── JobOutcomeError               ``Queue.result`` found no result to return
    │   ├── JobNotFound               the job is not tracked, or its record expired
    │   ├── JobFailed                 the job was dead-lettered (``reason``, ``error``)
    │   ├── JobCancelled              the job was cancelled
    │   └── ResultTimeout             the job did not finish within the timeout
    └── JobControl                    raised *by processors* to steer their job
        ├── PermanentError            dead-letter now, no retry
        ├── Retry                     run again after a delay without spending an attempt
        │   └── RateLimited           the downstream is throttling; re-delay, no attempt spent
        └── JobTimeout                the job ran past its timeout (raised by the runtime)

Errors carry context attributes (``queue``, ``job``, ``job_id``, ``shard``) so that a
message and a log line always name where the problem is.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "ConfigurationError",
    "ContractError",
    "ForeignConsumerGroup",
    "IncompatibleContract",
    "InvalidPayload",
    "InvalidResult",
    "JobCancelled",
    "JobControl",
    "JobFailed",
    "JobNotFound",
    "JobOutcomeError",
    "JobTimeout",
    "LeadershipLost",
    "LoadError",
    "NotReplicated",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "PermissionsMissing",
    "RateLimited",
    "RedisOutOfMemory",
    "RedisRefused",
    "RedisUnavailable",
    "RegistrationError",
    "ResultTimeout",
    "Retry",
    "StartupHookFailed",
    "StreamqError",
    "UnknownJob",
    "UnsafeRedisConfig",
]


class StreamqError(Exception):
    """Base class of every error streamq raises."""

    def __init__(
        self,
        message: str,
        *,
        queue: str | None = None,
        job: str | None = None,
        job_id: str | None = None,
        shard: str | None = None,
    ) -> None:
        super().__init__(message)
        self.queue = queue
        self.job = job
        self.job_id = job_id
        self.shard = shard


class ContractError(StreamqError):
    """Raised when a contract declaration is invalid (duplicate or malformed names, shards < 1)."""


class IncompatibleContract(ContractError):
    """Raised when a contract change would break in-flight jobs or a running peer."""

    def __init__(self, message: str, *, changes: list[str]) -> None:
        super().__init__(message)
        self.changes = changes


class ConfigurationError(StreamqError):
    """Raised when an option or environment setting is malformed or unknown."""


class ForeignConsumerGroup(ConfigurationError):
    """Raised when a queue's stream has a consumer group other than the worker's own.

    Completing a job deletes its entry (``XDEL``) for every group of the stream, so a second
    group would silently lose jobs. streamq does not support fan-out; use one group per queue
    (or one queue per consumer group).
    """

    def __init__(self, message: str, *, queue: str | None = None, shard: str | None = None,
                 groups: list[str] | None = None) -> None:
        super().__init__(message, queue=queue, shard=shard)
        self.groups = groups or []


class LoadError(ConfigurationError):
    """Raised when a ``module:attribute`` reference (``WORKER_APP``, ``--contracts``) cannot
    be loaded.

    Attributes:
        ref: the reference as given.
        reason: ``malformed`` (not ``module:attribute``), ``no_module`` (the module does not
            exist), ``no_attribute`` (the module lacks it) or ``raised`` (importing the
            module, or reading the attribute, raised: the user's code failed).
        error: for ``raised``, the exception the user's code raised (also the ``__cause__``).
    """

    def __init__(
        self, message: str, *, ref: str, reason: str, error: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.ref = ref
        self.reason = reason
        self.error = error


class PayloadError(StreamqError):
    """Raised when a payload cannot be enqueued or consumed."""


class InvalidPayload(PayloadError):
    """Raised when a payload fails its job's schema; ``errors`` holds pydantic's details."""

    def __init__(
        self,
        message: str,
        *,
        queue: str | None = None,
        job: str | None = None,
        job_id: str | None = None,
        fields: list[str] | None = None,
    ) -> None:
        super().__init__(message, queue=queue, job=job, job_id=job_id)
        self.fields = fields or []


class UnknownJob(PayloadError):
    """Raised when a job name is not declared by its queue's contract."""


class PayloadTooLarge(PayloadError):
    """Raised when an encoded payload is over the queue's size limit (nothing is sent)."""

    def __init__(
        self,
        message: str,
        *,
        queue: str | None = None,
        job: str | None = None,
        size: int = 0,
        limit: int = 0,
    ) -> None:
        super().__init__(message, queue=queue, job=job)
        self.size = size
        self.limit = limit


class RedisUnavailable(StreamqError):
    """Raised when Redis cannot be reached or the connection broke mid-call."""


class RedisOutOfMemory(StreamqError):
    """Raised when Redis refuses a write because it is at ``maxmemory`` (policy noeviction)."""


class NotReplicated(StreamqError):
    """Raised when a durable add was written on the primary but fewer replicas than asked
    confirmed it before the timeout.

    The job is not rolled back: it may run, or be lost if the primary fails before its
    replicas catch up. ``job_ids`` are the jobs concerned, ``replicas`` how many replicas
    confirmed (the fewest over those jobs) and ``wanted`` how many were asked for. Adding
    again with the same ``job_id`` cannot make a second job within the dedup window.
    """

    def __init__(
        self,
        message: str,
        *,
        queue: str | None = None,
        job_id: str | None = None,
        job_ids: list[str] | None = None,
        replicas: int = 0,
        wanted: int = 0,
    ) -> None:
        super().__init__(message, queue=queue, job_id=job_id)
        self.job_ids = job_ids or ([job_id] if job_id else [])
        self.replicas = replicas
        self.wanted = wanted


class RedisRefused(StreamqError):
    """Raised when Redis refuses a command in a way that retrying cannot fix.

    ``NOPERM`` (the ACL user lacks a command or key), ``WRONGTYPE`` (a queue key holds another
    type), or a script that cannot be loaded. ``reply`` is Redis's error text.
    """

    def __init__(self, message: str, *, queue: str | None = None, reply: str = "") -> None:
        super().__init__(message, queue=queue)
        self.reply = reply


class PermissionsMissing(RedisRefused):
    """Raised at a worker's start when its ACL user lacks permissions its role needs.

    ``missing`` lists each one in ACL syntax (``"+xautoclaim"``, ``"~app:*"``), ``role``
    names the role checked and ``user`` the ACL user; nothing was consumed.
    """

    def __init__(self, message: str, *, role: str, user: str, missing: list[str]) -> None:
        super().__init__(message, reply="NOPERM")
        self.role = role
        self.user = user
        self.missing = missing


class UnsafeRedisConfig(StreamqError):
    """Raised when Redis uses an eviction policy that could silently drop queue keys."""


class RegistrationError(StreamqError):
    """Raised when a processor or queue registration is invalid or duplicated."""


class StartupHookFailed(StreamqError):
    """Raised by ``WorkerManager.start`` when an ``@app.on_startup`` hook raised.

    No worker started and nothing was consumed. ``hook`` names the hook (its qualified
    name); the hook's own exception is the ``__cause__``.
    """

    def __init__(self, message: str, *, hook: str) -> None:
        super().__init__(message)
        self.hook = hook


class LeadershipLost(StreamqError):
    """Raised when a singleton runner's fenced write is refused: its lease expired or another
    replica took it over (a newer fencing token). ``runner`` and the stale ``token`` say whose.
    """

    def __init__(self, message: str, *, runner: str, token: int | None) -> None:
        super().__init__(message)
        self.runner = runner
        self.token = token


class InvalidResult(PayloadError):
    """Raised when a processor's return value fails its job's result model (the attempt
    fails like any error); ``fields`` names the failing fields."""

    def __init__(
        self, message: str, *, fields: list[str] | None = None, **context: str | None
    ) -> None:
        super().__init__(message, **context)
        self.fields = fields or []


class JobOutcomeError(StreamqError):
    """Base of the errors :meth:`Queue.result <streamq.Queue.result>` raises instead of a
    result."""


class JobNotFound(JobOutcomeError):
    """Raised when a job id is not tracked on the queue (never added with tracking, or its
    final record expired)."""


class JobFailed(JobOutcomeError):
    """Raised when the job was dead-lettered; ``reason`` and ``error`` say why."""

    def __init__(self, message: str, *, reason: str | None = None, error: str | None = None,
                 **context: str | None) -> None:
        super().__init__(message, **context)
        self.reason = reason
        self.error = error


class JobCancelled(JobOutcomeError):
    """Raised when the job was cancelled (before it ran, or while it ran)."""


class ResultTimeout(JobOutcomeError):
    """Raised when the job did not finish within ``result()``'s timeout (it may still)."""


class JobControl(Exception):
    """Base of the exceptions a processor raises to steer its job (not errors of streamq)."""


class PermanentError(JobControl):
    """Raised by a processor when retrying cannot help: the job is dead-lettered at once."""


class Retry(JobControl):
    """Raised by a processor to run the job again after ``delay``, without spending an attempt.

    Example::

        if not upstream_ready():
            raise Retry(timedelta(seconds=30))
    """

    def __init__(self, delay: timedelta | float = 0.0, message: str = "") -> None:
        super().__init__(message or "retry requested")
        from streamq.durations import to_ms

        # A negative delay means "now": a processor's arithmetic may overshoot.
        self.delay_ms = max(0, to_ms(delay, "Retry delay", minimum=None))


class RateLimited(Retry):
    """Raised by a processor when a downstream throttles it; re-delayed, no attempt spent."""

    def __init__(self, delay: timedelta | float = 1.0, message: str = "") -> None:
        super().__init__(delay, message or "rate limited")


class JobTimeout(JobControl):
    """Raised (by the runtime) when a job runs past its ``timeout``."""

