"""streamq: a typed job queue and worker runtime on Redis Streams consumer groups."""

from streamq.backoff import Backoff
from streamq.contracts import ContractSet, JobDefaults, JobSpec, Lane, QueueContract, job
from streamq.envelope import Envelope
from streamq.errors import (
    ConfigurationError,
    ContractError,
    IncompatibleContract,
    InvalidPayload,
    JobControl,
    JobTimeout,
    PayloadError,
    PayloadTooLarge,
    PermanentError,
    RateLimited,
    RedisOutOfMemory,
    RedisUnavailable,
    RegistrationError,
    Retry,
    StreamqError,
    UnknownJob,
    UnsafeRedisConfig,
)
from streamq.hooks import CompositeHooks, Hooks, JobInfo
from streamq.producer import JobRequest, Queue, SyncQueue

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "CompositeHooks",
    "ConfigurationError",
    "ContractError",
    "ContractSet",
    "Envelope",
    "Hooks",
    "IncompatibleContract",
    "InvalidPayload",
    "JobControl",
    "JobDefaults",
    "JobInfo",
    "JobRequest",
    "JobSpec",
    "JobTimeout",
    "Lane",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "Queue",
    "QueueContract",
    "RateLimited",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "RegistrationError",
    "Retry",
    "StreamqError",
    "SyncQueue",
    "UnknownJob",
    "UnsafeRedisConfig",
    "__version__",
    "job",
]
