"""``python -m worker --help``: usage, every environment variable it reads, exit codes.

The table here is what ``--help`` prints; ``docs/configuration.md`` lists the same variables
with the same defaults, and a test keeps the two (and what the parser reads) equal.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from worker.settings import QUEUE_OPTIONS

__all__ = ["VARIABLES", "Variable", "usage"]


@dataclass(frozen=True, slots=True)
class Variable:
    """One global variable: its name, value format, default and what it does."""

    name: str
    kind: str
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("WORKER_APP", "package.module:attribute", "required",
             "the streamq.app.App to run, e.g. myapp.worker:app"),
    Variable("REDIS_URL", "URL", "unset: embedded Redis",
             "redis://[[user]:password@]host[:port][/db], rediss://..., "
             "unix:///path/to/redis.sock or, for a primary watched by Sentinel, "
             "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]"
             " (?sentinel_password=... when the sentinels need one)"),
    Variable("REDIS_CLUSTER", "bool", "false",
             "connect as a Redis Cluster client (needs REDIS_URL, database 0)"),
    Variable("REDIS_PREFIX", "string", DEFAULT_PREFIX, "key prefix; must match the producers'"),
    Variable("REDIS_TLS_CA_FILE", "path", "unset: system CAs",
             "PEM file of the CA that signed the server's certificate (rediss:// only)"),
    Variable("REDIS_TLS_CERT_FILE", "path", "unset: none",
             "PEM client certificate, for servers that require one (mutual TLS)"),
    Variable("REDIS_TLS_KEY_FILE", "path", "unset: in the cert file",
             "PEM private key of REDIS_TLS_CERT_FILE when it is a file of its own"),
    Variable("REDIS_TLS_VERIFY", "bool", "true",
             "verify the server's certificate and host name; false only for tests"),
    Variable("WORKER_GROUP", "string", DEFAULT_GROUP,
             "consumer group name; workers of one group share the jobs"),
    Variable("WORKER_PROCESSES", "int 1..1024 | auto", "1",
             "worker processes to run under one supervisor, each with its own consumer "
             "name; one that dies is restarted; auto: one per CPU this process may use"),
    Variable("WORKER_EVENT_LOOP", "auto | asyncio | uvloop", "auto",
             "uvloop when installed (the uvloop extra), else asyncio's loop; uvloop when it "
             "is not installed is an error"),
    Variable("LOG_FORMAT", "json | text | auto", "auto",
             "json lines, readable text, or text at a terminal and json otherwise"),
    Variable("LOG_LEVEL", "DEBUG | INFO | WARNING | ERROR | CRITICAL", "INFO",
             "root log level"),
    Variable("METRICS_PORT", "int 1..65535", "unset: no server",
             "port of /metrics, /healthz and /readyz"),
    Variable("METRICS_HOST", "address", "0.0.0.0", "address that server binds"),
    Variable("LIVENESS_REDIS_TIMEOUT", "seconds > 0", "30",
             "/healthz fails once Redis has been unreachable this long"),
    Variable("LIVENESS_WEDGE_TIMEOUT", "seconds > 0", "60",
             "/healthz fails once a queue had ready jobs but none started for this long"),
    Variable("OTEL_EXPORTER_OTLP_ENDPOINT", "http(s):// URL", "unset: no export",
             "export spans over OTLP/HTTP (with the tracing and otlp extras)"),
    Variable("OTEL_SERVICE_NAME", "string", "streamq-worker", "service.name of exported spans"),
    Variable("OTEL_SDK_DISABLED", "bool", "false", "true turns OTLP export off"),
    Variable("ALLOW_UNSAFE_EVICTION", "bool", "false",
             "start even when Redis's maxmemory-policy is not noeviction"),
    Variable("WORKER_REFUSE_INCOMPATIBLE_CONTRACT", "bool", "true",
             "refuse to start when the contract recorded in Redis is incompatible with the "
             "app's; false logs the breaking changes at ERROR and starts"),
    Variable("SCHEDULER_IS_ENABLED", "bool", "true",
             "run the app's schedules in this process (each where its queue is consumed); "
             "false enqueues none of them here"),
    Variable("DASHBOARD_IS_ENABLED", "bool", "false",
             "serve the web dashboard (the dashboard extra) from this process, on a port of "
             "its own; with WORKER_PROCESSES > 1 the supervisor serves it"),
    Variable("DASHBOARD_HOST", "address", "127.0.0.1", "address the dashboard binds"),
    Variable("DASHBOARD_PORT", "int 1..65535", "8081", "port of the dashboard"),
    Variable("DASHBOARD_TOKEN", "string, 16+ characters", "unset: actions off",
             "the token the dashboard's retry, purge, pause and resume require; without it "
             "they are off"),
    Variable("DASHBOARD_READ_ONLY", "bool", "false",
             "show no action and refuse every state-changing request, token or not"),
    Variable("STREAMQ_DATA_DIR", "path", ".streamq",
             "data directory of the embedded Redis (only without REDIS_URL)"),
    Variable("STREAMQ_EMBEDDED_PORT", "int 1..65535", "6390",
             "port of the embedded Redis (only without REDIS_URL)"),
)
"""Every global variable, in the order of ``docs/configuration.md``."""

_HEAD = """\
usage: python -m worker [-h | --help]

Runs the consumers of a streamq app. It takes no arguments: it is configured by the
environment variables below, all checked before anything connects (a bad one exits 2,
naming it). SIGTERM or SIGINT shuts down gracefully; a second signal stops at once.
With WORKER_PROCESSES > 1 a supervisor runs that many worker processes and serves
/metrics, /healthz and /readyz for all of them.
Every variable is described in docs/configuration.md.
"""

_QUEUES = """\
Per queue lane (<QUEUE>: the lane name upper-cased, '-' as '_'; only lanes with a
processor in the app are known, and any other QUEUE_* variable is an error):
  QUEUE_CONSUMER_<QUEUE>_IS_ENABLED  bool [false]
      consume this lane; at least one must be true, unless a runner or schedule is
      enabled
  QUEUE_<QUEUE>_<OPTION>  [the processor's option]
      override one worker option of the lane; <OPTION> is one of:
"""

_FLAGS = """\
Per schedule and per runner (<NAME>: the name upper-cased, '-' as '_'; only the app's
schedules and runners are known, and any other SCHEDULE_*_IS_ENABLED or
RUNNER_*_IS_ENABLED variable is an error):
  SCHEDULE_<NAME>_IS_ENABLED  bool [true]
      enqueue this schedule from this process (SCHEDULER_IS_ENABLED=false stops them all)
  RUNNER_<NAME>_IS_ENABLED  bool [true]
      run this runner in this process
A process with no queue enabled starts when a runner or a schedule is enabled.
"""

_EXIT = """\
Exit codes:
  0  stopped by SIGTERM/SIGINT after a graceful shutdown (or --help)
  1  Redis unreachable at start, a startup hook failed, the worker failed, or a second
     signal forced the stop
     (several processes: also a process that had to be killed at shutdown)
  2  bad configuration: a variable, an argument, the app, or what Redis refused at start
"""

_INDENT = " " * 6


def usage() -> str:
    """The ``--help`` text."""
    out = [_HEAD, "\nEnvironment variables [default]:\n"]
    for v in VARIABLES:
        out.append(f"  {v.name}  {v.kind} [{v.default}]\n")
        out.append(textwrap.fill(v.meaning, 88, initial_indent=_INDENT,
                                 subsequent_indent=_INDENT) + "\n")
    out.append("\n" + _QUEUES)
    for name, opt in QUEUE_OPTIONS.items():
        out.append(f"{_INDENT}  {name:<20} {opt.doc}\n")
    out.append("\n" + _FLAGS)
    out.append("\n" + _EXIT)
    return "".join(out)
