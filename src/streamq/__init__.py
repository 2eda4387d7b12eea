"""streamq: a typed job queue and worker runtime on Redis Streams consumer groups."""

from streamq.admin import QueueAdmin, SyncQueueAdmin
from streamq.app import App, Registration
from streamq.backoff import Backoff
from streamq.compat import Change, assert_compatible, check_compatible, snapshot
from streamq.contracts import ContractSet, JobDefaults, JobSpec, Lane, QueueContract, job
from streamq.deadletters import DeadLetter, DeadLetters, SyncDeadLetters
from streamq.envelope import Envelope
from streamq.errors import (
    ConfigurationError,
    ContractError,
    ForeignConsumerGroup,
    IncompatibleContract,
    InvalidPayload,
    JobControl,
    JobTimeout,
    LeadershipLost,
    PayloadError,
    PayloadTooLarge,
    PermanentError,
    RateLimited,
    RedisOutOfMemory,
    RedisRefused,
    RedisUnavailable,
    RegistrationError,
    Retry,
    StartupHookFailed,
    StreamqError,
    UnknownJob,
    UnsafeRedisConfig,
)
from streamq.hooks import CompositeHooks, Hooks, JobInfo
from streamq.job import Job
from streamq.options import Batch, Limiter, WorkerOptions
from streamq.producer import JobRequest, Queue, SyncQueue
from streamq.runners import RunnerConfig, RunnerContext
from streamq.runtime import Worker, WorkerManager
from streamq.schedules import (
    Schedule,
    ScheduleInfo,
    Scheduler,
    SchedulerConfig,
    Schedules,
    SyncSchedules,
)

__version__ = "0.1.0"

__all__ = [
    "App",
    "Backoff",
    "Batch",
    "Change",
    "CompositeHooks",
    "ConfigurationError",
    "ContractError",
    "ContractSet",
    "DeadLetter",
    "DeadLetters",
    "Envelope",
    "ForeignConsumerGroup",
    "Hooks",
    "IncompatibleContract",
    "InvalidPayload",
    "Job",
    "JobControl",
    "JobDefaults",
    "JobInfo",
    "JobRequest",
    "JobSpec",
    "JobTimeout",
    "Lane",
    "LeadershipLost",
    "Limiter",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "Queue",
    "QueueAdmin",
    "QueueContract",
    "RateLimited",
    "RedisOutOfMemory",
    "RedisRefused",
    "RedisUnavailable",
    "Registration",
    "RegistrationError",
    "Retry",
    "RunnerConfig",
    "RunnerContext",
    "Schedule",
    "ScheduleInfo",
    "Scheduler",
    "SchedulerConfig",
    "Schedules",
    "StartupHookFailed",
    "StreamqError",
    "SyncDeadLetters",
    "SyncQueue",
    "SyncQueueAdmin",
    "SyncSchedules",
    "UnknownJob",
    "UnsafeRedisConfig",
    "Worker",
    "WorkerManager",
    "WorkerOptions",
    "__version__",
    "assert_compatible",
    "check_compatible",
    "job",
    "snapshot",
]
