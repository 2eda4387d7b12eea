"""The ``streamq`` command: queue depth, dead letters, pause and resume, consumers, workers.

Usage::

    streamq depth                                   # every queue, one row per shard
    streamq depth ingestion --watch --interval 2s   # redraws until Ctrl-C
    streamq dead list ingestion --limit 20 --reason error
    streamq dead retry ingestion ingestion-2/1700000000000-0
    streamq dead purge ingestion --older-than 7d    # asks first; --yes does not
    streamq pause ingestion
    streamq tenant flag ingestion project-7 --for 10m --reason "upstream 429s"
    streamq job 5f2c... --queue ingestion --json    # a tracked job's status (--cancel)
    streamq worker                                  # the same as python -m worker
    streamq dashboard --port 8081                   # the web dashboard (its own options)

Global options go before or after the subcommand (``streamq depth --redis-url ...``), and
every one has an environment variable, the same the worker reads (this entry point reads the
environment; the library never does):

- ``--redis-url`` / ``REDIS_URL``; with neither, the embedded Redis of ``STREAMQ_DATA_DIR``
  (default ``.streamq``, port ``STREAMQ_EMBEDDED_PORT``) that ``python -m worker`` and
  producers use when it is running;
- ``--contracts MODULE:ATTR`` / ``STREAMQ_CONTRACTS``, else the app of ``WORKER_APP`` (a
  ``ContractSet``, an ``App``, one contract or a list of them);
- ``--cluster`` / ``REDIS_CLUSTER``, ``--prefix`` / ``REDIS_PREFIX``, ``--group`` /
  ``WORKER_GROUP``;
- ``--json``: JSON on stdout for every command; ``--yes``: no confirmation for destructive
  actions (without it, they ask, and refuse when stdin is not a terminal).

Exit status: 0 done (or a confirmation declined); 1 Redis unreachable or failing; 2 bad
arguments, unknown queue, contracts that cannot be loaded, or a destructive action refused
for want of confirmation; 3 (``job``) the job is not tracked or was forgotten.
``streamq worker`` exits as ``python -m worker`` does.

Subcommands are registered by one function per group (:data:`COMMAND_GROUPS`): each adds
its parsers and sets ``handler`` (taking a :class:`CommandContext`) on them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import redis

import streamq
from streamq._cli_commands import add_dead_commands, add_depth_commands, add_queue_commands
from streamq._cli_jobs import add_job_commands
from streamq._cli_schedules import add_schedule_commands
from streamq._cli_support import CommandContext, UsageError, lane_of, masked
from streamq._cli_tenants import add_tenant_commands
from streamq.app import App
from streamq.contracts import ContractSet, QueueContract
from streamq.errors import (
    ConfigurationError,
    ContractError,
    LoadError,
    RedisUnavailable,
    StreamqError,
)
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from streamq.loader import load_object
from streamq.sentinel import SentinelURL
from streamq.tls import TLSConfig, connect_sync

__all__ = ["COMMAND_GROUPS", "CommandContext", "build_parser", "load_contracts", "main"]

EXIT_OK, EXIT_REDIS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

CommandGroup = Callable[[Any, argparse.ArgumentParser], None]
"""Adds the parsers of one group of subcommands: ``(subparsers, common)``; each parser is
made with ``parents=[common]`` and ``set_defaults(handler=fn)``."""


def add_worker_command(cmds: Any, common: argparse.ArgumentParser) -> None:
    """``streamq worker``: handled before parsing (see :func:`main`); listed for ``--help``."""
    cmds.add_parser(
        "worker",
        help="run the workers of WORKER_APP, exactly as python -m worker (environment only)",
        add_help=False,
    )


def add_tool_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    """``streamq compat`` and ``streamq redis``: handled before parsing (see :func:`main`),
    each the whole of its module's own command; listed for ``--help``."""
    cmds.add_parser(
        "compat", add_help=False,
        help="contract snapshots and rolling-deploy checks (as python -m streamq.compat: "
             "snapshot MODULE:ATTR, check OLD NEW)",
    )
    cmds.add_parser(
        "redis", add_help=False,
        help="the embedded Redis (as python -m streamq.embedded: start, status, stop)",
    )


def add_dashboard_command(cmds: Any, common: argparse.ArgumentParser) -> None:
    """``streamq dashboard``: handled before parsing (see :func:`main`); listed for ``--help``."""
    cmds.add_parser(
        "dashboard",
        help="serve the web dashboard (streamq dashboard --help lists its options)",
        add_help=False,
    )


COMMAND_GROUPS: list[CommandGroup] = [
    add_depth_commands,
    add_dead_commands,
    add_queue_commands,
    add_tenant_commands,
    add_job_commands,
    add_schedule_commands,
    add_worker_command,
    add_tool_commands,
    add_dashboard_command,
]
"""Every group of subcommands, in ``--help`` order."""


def _common_options() -> argparse.ArgumentParser:
    # SUPPRESS: an option given after the subcommand must not be reset by the subparser's
    # default when it was given before it; defaults are filled in by _settings.
    c = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    g = c.add_argument_group("global options (before or after the subcommand)")
    g.add_argument("--redis-url", help="Redis URL (default: $REDIS_URL, else the embedded Redis)")
    g.add_argument("--cluster", action="store_true", help="Redis Cluster ($REDIS_CLUSTER)")
    g.add_argument("--tls-ca-file", metavar="PEM",
                   help="CA of the server's certificate, rediss:// (default: "
                        "$REDIS_TLS_CA_FILE, else the system's CAs)")
    g.add_argument("--tls-cert-file", metavar="PEM",
                   help="client certificate for mutual TLS (default: $REDIS_TLS_CERT_FILE)")
    g.add_argument("--tls-key-file", metavar="PEM",
                   help="its private key, if a file of its own (default: $REDIS_TLS_KEY_FILE)")
    g.add_argument("--tls-no-verify", action="store_true",
                   help="do not verify the server's certificate (tests only; default: "
                        "$REDIS_TLS_VERIFY=false)")
    g.add_argument("--prefix", help=f"key prefix (default: $REDIS_PREFIX or {DEFAULT_PREFIX})")
    g.add_argument(
        "--group", help=f"consumer group (default: $WORKER_GROUP or {DEFAULT_GROUP})"
    )
    g.add_argument(
        "--contracts",
        metavar="MODULE:ATTR",
        help="the application's contracts (default: $STREAMQ_CONTRACTS, else $WORKER_APP)",
    )
    g.add_argument("--json", action="store_true", help="print JSON on stdout")
    g.add_argument("-y", "--yes", action="store_true", help="no confirmation prompts")
    return c


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: global options and every group of :data:`COMMAND_GROUPS`."""
    common = _common_options()
    p = argparse.ArgumentParser(
        prog="streamq",
        description="Inspect and administer streamq queues: depth, dead letters, pause, "
        "tenant flags, job status; run workers.",
        parents=[common],
    )
    p.add_argument("--version", action="version", version=f"streamq {streamq.__version__}")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMAND_GROUPS:
        add(cmds, common)
    return p


# -- configuration ---------------------------------------------------------------------------


def load_contracts(spec: str, *, source: str = "--contracts") -> ContractSet:
    """Load ``module:attr`` (see :func:`streamq.loader.load_object`) as a ContractSet.

    Raises:
        UsageError: it cannot be loaded, or is not a ContractSet, an App, a QueueContract
            or a list of them; the message names ``source``.
    """
    return _contracts_of(_load(spec, source), spec, source)


def _load(spec: str, source: str) -> Any:
    try:
        return load_object(spec)
    except LoadError as exc:
        raise UsageError(f"{source}: {exc}") from exc


def _contracts_of(obj: Any, spec: str, source: str) -> ContractSet:
    if isinstance(obj, ContractSet):
        return obj
    if isinstance(obj, App):
        return obj.contracts
    if isinstance(obj, type) and issubclass(obj, QueueContract):
        return ContractSet(obj)
    try:
        return ContractSet(*obj)
    except (TypeError, ContractError) as exc:
        raise UsageError(
            f"{source}: {spec} is not a ContractSet, an App, a QueueContract or a list of "
            f"them: {exc}"
        ) from exc


def _contracts_and_app(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[ContractSet, App[Any] | None]:
    for source, spec in (
        ("--contracts", getattr(args, "contracts", None)),
        ("STREAMQ_CONTRACTS", env.get("STREAMQ_CONTRACTS")),
        ("WORKER_APP", env.get("WORKER_APP")),
    ):
        if spec and spec.strip():
            obj = _load(spec.strip(), source)
            return _contracts_of(obj, spec.strip(), source), obj if isinstance(obj, App) else None
    raise UsageError(
        "no contracts: pass --contracts MODULE:ATTR, or set STREAMQ_CONTRACTS (or WORKER_APP, "
        "the worker's app)"
    )


def _flag(env: Mapping[str, str], name: str) -> bool:
    from worker.settings import parse_bool

    raw = env.get(name)
    if raw is None or not raw.strip():
        return False
    try:
        return parse_bool(raw)
    except ValueError as exc:
        raise UsageError(f"{name}: {exc}") from None


def _redis_url(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """``--redis-url``, ``REDIS_URL``, else the embedded Redis when it runs (never started
    here: an admin command has nothing to show on a Redis it just started)."""
    given = getattr(args, "redis_url", None) or env.get("REDIS_URL", "").strip()
    if given:
        return str(given)
    from streamq.embedded import DEFAULT_PORT, running

    data_dir = Path(env.get("STREAMQ_DATA_DIR", "").strip() or ".streamq")
    raw_port = env.get("STREAMQ_EMBEDDED_PORT", "").strip()
    try:
        port = int(raw_port) if raw_port else DEFAULT_PORT
    except ValueError:
        raise UsageError(
            f"STREAMQ_EMBEDDED_PORT: expected a port number, got {raw_port!r}"
        ) from None
    found = running(data_dir, port=port, timeout_s=5.0) if data_dir.is_dir() else None
    if found is None:
        raise UsageError(
            "no Redis URL: pass --redis-url or set REDIS_URL; no embedded Redis is running "
            f"for {data_dir} either (python -m worker starts one when REDIS_URL is unset; "
            "STREAMQ_DATA_DIR, STREAMQ_EMBEDDED_PORT)"
        )
    print(f"streamq: REDIS_URL is not set: using the embedded Redis at {found.url} "
          f"(data in {found.data_dir})", file=sys.stderr)
    return found.url


def tls_of(args: argparse.Namespace, env: Mapping[str, str]) -> TLSConfig | None:
    """The TLS settings of the options, else of ``REDIS_TLS_*``; None when none is given."""
    ca = getattr(args, "tls_ca_file", None) or env.get("REDIS_TLS_CA_FILE")
    cert = getattr(args, "tls_cert_file", None) or env.get("REDIS_TLS_CERT_FILE")
    key = getattr(args, "tls_key_file", None) or env.get("REDIS_TLS_KEY_FILE")
    no_verify = bool(getattr(args, "tls_no_verify", False))
    verify = not no_verify
    raw_verify = env.get("REDIS_TLS_VERIFY")
    if raw_verify is not None and not no_verify:
        low = raw_verify.strip().lower()
        if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise UsageError(f"REDIS_TLS_VERIFY must be true or false, got {raw_verify!r}")
        verify = low in ("true", "1", "yes", "on")
    if ca is None and cert is None and key is None and verify:
        return None
    for name, path in (("--tls-ca-file", ca), ("--tls-cert-file", cert),
                       ("--tls-key-file", key)):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{name}: no such file: {path!r}")
    return TLSConfig(ca_file=ca, cert_file=cert, key_file=key, verify=verify)


def connect(url: str, *, cluster: bool, tls: TLSConfig | None = None) -> Any:
    """A connected sync client.

    Raises:
        UsageError: the URL is malformed.
        ConfigurationError: the TLS settings are refused.
        RedisUnavailable: Redis cannot be reached.
    """
    kw: dict[str, Any] = {"socket_connect_timeout": 3, "socket_timeout": 10}
    try:
        if SentinelURL.matches(url):
            if cluster:
                raise UsageError("--cluster cannot use a redis+sentinel:// URL")
            if tls is not None:
                raise UsageError("TLS options cannot be used with a redis+sentinel:// URL")
            try:
                client: Any = SentinelURL.parse(url).sync_client(**kw)
            except ConfigurationError as exc:
                raise UsageError(f"invalid Redis URL: {exc}") from exc
        else:
            client = connect_sync(url, tls=tls, cluster=cluster, **kw)
        client.ping()
    except (ConfigurationError, UsageError):
        raise
    except ValueError as exc:
        raise UsageError(f"invalid Redis URL {masked(url)!r}: {exc}") from exc
    except Exception as exc:
        raise RedisUnavailable(f"cannot reach Redis at {masked(url)}: {exc}") from exc
    return client


# -- running ---------------------------------------------------------------------------------


def _fail(code: int, message: str) -> int:
    print(f"streamq: error: {message}", file=sys.stderr)
    return code


def _is_worker_command(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] == "worker"


def run_worker(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """``streamq worker``: ``python -m worker``'s own ``main``, its variables, its exit codes."""
    from worker.__main__ import Shutdown, exit_process
    from worker.__main__ import main as worker_main

    last = Shutdown()
    exit_process(worker_main(env, argv=list(argv), shutdown=last), last)
    raise AssertionError("exit_process returned")  # pragma: no cover


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the ``streamq`` command; returns the exit status.

    ``env`` (default ``os.environ``) is where ``REDIS_URL``, ``STREAMQ_CONTRACTS`` and the
    other variables are read.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    if _is_worker_command(argv):
        run_worker(argv[1:], env)
    if argv and argv[0] == "compat":
        from streamq.compat import main as compat_main

        return compat_main(argv[1:])
    if argv and argv[0] == "redis":
        from streamq.embedded import main as embedded_main

        return embedded_main(argv[1:])
    if argv[:1] == ["dashboard"]:
        from streamq.dashboard.cli import main as dashboard_main

        return dashboard_main(argv[1:], env)
    args = build_parser().parse_args(argv)
    if args.command == "worker":  # options before it: the worker has none to take
        return _fail(EXIT_USAGE, "streamq worker takes no options: it is configured by "
                     "environment variables, as python -m worker (streamq worker --help)")
    url = ""
    try:
        contracts, app = _contracts_and_app(args, env)
        queue = getattr(args, "queue", None)
        if queue:
            lane_of(contracts, queue)  # an unknown queue is a usage error, Redis or not
        cluster = bool(getattr(args, "cluster", False)) or _flag(env, "REDIS_CLUSTER")
        url = _redis_url(args, env)
        client = connect(url, cluster=cluster, tls=tls_of(args, env))
        ctx = CommandContext(
            args=args,
            client=client,
            contracts=contracts,
            redis_url=url,
            cluster=cluster,
            prefix=getattr(args, "prefix", None) or env.get("REDIS_PREFIX", "").strip()
            or DEFAULT_PREFIX,
            group=getattr(args, "group", None) or env.get("WORKER_GROUP", "").strip()
            or DEFAULT_GROUP,
            json=bool(getattr(args, "json", False)),
            yes=bool(getattr(args, "yes", False)),
            app=app,
        )
        try:
            code: int = args.handler(ctx)
            return code
        finally:
            client.close()
    except (UsageError, ConfigurationError) as exc:
        return _fail(EXIT_USAGE, str(exc))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except RedisUnavailable as exc:
        msg = str(exc)
        return _fail(EXIT_REDIS, msg if masked(url) in msg else f"{msg} ({masked(url)})")
    except (StreamqError, redis.RedisError) as exc:
        return _fail(EXIT_REDIS, f"Redis at {masked(url)} failed: {exc}")


def run() -> NoReturn:
    """``python -m streamq``."""
    sys.exit(main())
