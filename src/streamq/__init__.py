"""streamq: a typed job queue and worker runtime on Redis Streams consumer groups."""

from streamq.admin import ConsumerInfo, QueueAdmin, QueueDepth, ShardDepth, SyncQueueAdmin
from streamq.app import App
from streamq.backoff import Backoff
from streamq.compat import Change, assert_compatible, check_compatible, snapshot
from streamq.contracts import ContractSet, JobDefaults, JobSpec, Lane, QueueContract, job
from streamq.dashboard import create_app as create_dashboard_app
from streamq.deadletters import DeadLetter, DeadLetters, SyncDeadLetters
from streamq.durability import Durability
from streamq.durations import Duration
from streamq.errors import (
    ConfigurationError,
    ContractError,
    ForeignConsumerGroup,
    IncompatibleContract,
    InvalidPayload,
    InvalidResult,
    JobCancelled,
    JobControl,
    JobFailed,
    JobNotFound,
    JobOutcomeError,
    JobTimeout,
    LeadershipLost,
    LoadError,
    NotReplicated,
    PayloadError,
    PayloadTooLarge,
    PermanentError,
    PermissionsMissing,
    RateLimited,
    RedisOutOfMemory,
    RedisRefused,
    RedisUnavailable,
    RegistrationError,
    ResultTimeout,
    Retry,
    StartupHookFailed,
    StreamqError,
    UnknownJob,
    UnsafeRedisConfig,
)
from streamq.hooks import CompositeHooks, Hooks, JobInfo
from streamq.job import Job
from streamq.jobstatus import CancelResult, JobStatus
from streamq.options import Batch, Limiter, ProcessorOptions, WorkerOptions
from streamq.producer import JobRequest, Queue, SyncQueue
from streamq.runners import RunnerConfig, RunnerContext
from streamq.runtime import WorkerManager
from streamq.schedules import (
    Schedule,
    ScheduleInfo,
    Scheduler,
    SchedulerConfig,
    Schedules,
    SyncSchedules,
)
from streamq.sentinel import SentinelURL
from streamq.tenants import TenantFlag
from streamq.tls import TLSConfig, connect, connect_sync

__version__ = "0.1.0"

__all__ = [
    "App",
    "Backoff",
    "Batch",
    "CancelResult",
    "Change",
    "CompositeHooks",
    "ConfigurationError",
    "ConsumerInfo",
    "ContractError",
    "ContractSet",
    "DeadLetter",
    "DeadLetters",
    "Durability",
    "Duration",
    "ForeignConsumerGroup",
    "Hooks",
    "IncompatibleContract",
    "InvalidPayload",
    "InvalidResult",
    "Job",
    "JobCancelled",
    "JobControl",
    "JobDefaults",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobOutcomeError",
    "JobRequest",
    "JobSpec",
    "JobStatus",
    "JobTimeout",
    "Lane",
    "LeadershipLost",
    "Limiter",
    "LoadError",
    "NotReplicated",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "PermissionsMissing",
    "ProcessorOptions",
    "Queue",
    "QueueAdmin",
    "QueueContract",
    "QueueDepth",
    "RateLimited",
    "RedisOutOfMemory",
    "RedisRefused",
    "RedisUnavailable",
    "RegistrationError",
    "ResultTimeout",
    "Retry",
    "RunnerConfig",
    "RunnerContext",
    "Schedule",
    "ScheduleInfo",
    "Scheduler",
    "SchedulerConfig",
    "Schedules",
    "SentinelURL",
    "ShardDepth",
    "StartupHookFailed",
    "StreamqError",
    "SyncDeadLetters",
    "SyncQueue",
    "SyncQueueAdmin",
    "SyncSchedules",
    "TLSConfig",
    "TenantFlag",
    "UnknownJob",
    "UnsafeRedisConfig",
    "WorkerManager",
    "WorkerOptions",
    "__version__",
    "assert_compatible",
    "check_compatible",
    "connect",
    "connect_sync",
    "create_dashboard_app",
    "job",
    "snapshot",
]
