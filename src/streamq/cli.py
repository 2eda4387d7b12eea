"""The ``streamq`` admin command: queue depth, dead letters, pause and resume.

Usage::

    streamq --redis-url redis://localhost:6379/0 --contracts myapp.contracts:CONTRACTS depth
    streamq ... dead list ingestion --limit 20 --reason error
    streamq ... dead retry ingestion ingestion-2/1700000000000-0
    streamq ... dead purge ingestion --older-than 7d
    streamq ... pause ingestion
    streamq ... tenant flag ingestion project-7 --for 10m --reason "upstream 429s"
    streamq ... tenant list ingestion
    streamq ... tenant unflag ingestion project-7
    streamq ... job 5f2c... --queue ingestion --json
    streamq ... job 5f2c... --queue ingestion --cancel

``--redis-url`` defaults to ``$REDIS_URL`` (this entry point reads the environment; the
library never does). ``--contracts`` names the application's contracts as ``module:attribute``
(a ``ContractSet``, an ``App``, one contract or a list of them); the current directory is on
the import path.

Exit status: 0 done; 1 Redis unreachable or failing; 2 bad arguments, unknown queue or
contracts that cannot be loaded; 3 (``job``) the job is not tracked or was forgotten.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import redis

from streamq.admin import QueueDepth, SyncQueueAdmin
from streamq.contracts import ContractSet, Lane, QueueContract
from streamq.deadletters import DeadLetter, SyncDeadLetters
from streamq.errors import ConfigurationError, ContractError, RedisUnavailable, StreamqError
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from streamq.tls import TLSConfig, connect_sync

__all__ = ["main"]

EXIT_OK, EXIT_REDIS, EXIT_USAGE = 0, 1, 2
EXIT_NOT_FOUND = 3
"""``streamq job``: the job is not tracked (or its final record expired)."""

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(Exception):
    """A mistake in the command line: reported with exit status 2."""


def parse_duration(value: str) -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``500ms`` or plain seconds."""
    m = _DURATION_RE.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid duration {value!r}: use a number with ms, s, m, h, d or w (e.g. 7d)"
        )
    return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2) or "s"])


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamq",
        description="Inspect and administer streamq queues: depth, dead letters, pause, "
        "tenant flags.",
    )
    p.add_argument("--redis-url", help="Redis URL (default: $REDIS_URL)")
    p.add_argument("--cluster", action="store_true", help="connect to a Redis Cluster")
    p.add_argument("--tls-ca-file", metavar="PEM",
                   help="CA of the server's certificate, rediss:// (default: "
                        "$REDIS_TLS_CA_FILE, else the system's CAs)")
    p.add_argument("--tls-cert-file", metavar="PEM",
                   help="client certificate for mutual TLS (default: $REDIS_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", metavar="PEM",
                   help="its private key, if a file of its own (default: $REDIS_TLS_KEY_FILE)")
    p.add_argument("--tls-no-verify", action="store_true",
                   help="do not verify the server's certificate (tests only; default: "
                        "$REDIS_TLS_VERIFY=false)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX,
                   help=f"key prefix (default: {DEFAULT_PREFIX})")
    p.add_argument("--group", default=DEFAULT_GROUP,
                   help=f"consumer group (default: {DEFAULT_GROUP})")
    p.add_argument(
        "--contracts",
        required=True,
        metavar="MODULE:ATTR",
        help="the application's contracts, e.g. myapp.contracts:CONTRACTS",
    )
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    depth = cmds.add_parser("depth", help="ready, in-flight, delayed and dead jobs per shard")
    depth.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    depth.add_argument("--json", action="store_true", help="print JSON")

    dead = cmds.add_parser("dead", help="list, count, retry or purge dead letters")
    dcmds = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dl = dcmds.add_parser("list", help="newest dead letters first")
    dl.add_argument("queue")
    dl.add_argument("--limit", type=_positive_int, default=20, help="default: 20")
    dl.add_argument("--reason", help="only this reason (error, permanent, stalled, ...)")
    dl.add_argument("--shard", help="only this shard")
    dl.add_argument("--json", action="store_true", help="print JSON (with payloads)")
    dc = dcmds.add_parser("count", help="how many dead letters")
    dc.add_argument("queue")
    dc.add_argument("--by-reason", action="store_true")
    dc.add_argument("--json", action="store_true", help="print JSON")
    dr = dcmds.add_parser("retry", help="re-enqueue dead letters (attempt 1, due now)")
    dr.add_argument("queue")
    dr.add_argument("ids", nargs="*", metavar="ID", help="dead letters as <shard>/<id>")
    dr.add_argument("--all", action="store_true", help="every dead letter of the queue")
    dp = dcmds.add_parser("purge", help="delete dead letters")
    dp.add_argument("queue")
    dp.add_argument("ids", nargs="*", metavar="ID", help="dead letters as <shard>/<id>")
    dp.add_argument("--all", action="store_true", help="every dead letter of the queue")
    dp.add_argument(
        "--older-than", type=parse_duration, metavar="AGE", help="dead-lettered before (7d)"
    )

    for name, what in (("pause", "stop starting new jobs"), ("resume", "start jobs again")):
        c = cmds.add_parser(name, help=what)
        c.add_argument("queue")
    jb = cmds.add_parser("job", help="a tracked job's status (or cancel it)")
    jb.add_argument("id", help="the job id")
    jb.add_argument("--queue", required=True, help="the queue (lane) the job was added to")
    jb.add_argument("--key", help="the sharding key it was added with (asks one shard)")
    jb.add_argument("--cancel", action="store_true", help="cancel the job")
    jb.add_argument("--json", action="store_true", help="print JSON")
    cons = cmds.add_parser("consumers", help="the workers consuming a queue")
    cons.add_argument("queue")
    cons.add_argument("--json", action="store_true", help="print JSON")

    tenant = cmds.add_parser("tenant", help="flag, unflag or list tenants routed to the "
                             "secondary lane")
    tcmds = tenant.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    tf = tcmds.add_parser("flag", help="route a tenant's new jobs to the secondary lane")
    tf.add_argument("queue")
    tf.add_argument("tenant")
    tf.add_argument("--for", dest="duration", type=parse_duration, required=True,
                    metavar="DURATION", help="how long (10m, 2h, 1d)")
    tf.add_argument("--reason", default="", help="why (shown by tenant list)")
    tu = tcmds.add_parser("unflag", help="lift a tenant's flag now")
    tu.add_argument("queue")
    tu.add_argument("tenant")
    tl = tcmds.add_parser("list", help="the tenants flagged now")
    tl.add_argument("queue")
    tl.add_argument("--json", action="store_true", help="print JSON")
    return p


# -- loading -------------------------------------------------------------------------------


def load_contracts(spec: str) -> ContractSet:
    """Import ``module:attr`` and make a ContractSet of it."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--contracts must be MODULE:ATTR, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import contracts module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, ContractSet):
        return obj
    if isinstance(getattr(obj, "contracts", None), ContractSet):
        return obj.contracts  # type: ignore[no-any-return]
    if isinstance(obj, type) and issubclass(obj, QueueContract):
        return ContractSet(obj)
    try:
        return ContractSet(*obj)
    except (TypeError, ContractError) as exc:
        raise UsageError(
            f"{spec} is not a ContractSet, an App, a QueueContract or a list of them: {exc}"
        ) from exc


def lane_of(contracts: ContractSet, name: str) -> Lane:
    try:
        return contracts.lane(name)
    except ContractError:
        known = ", ".join(lane.name for lane in contracts.lanes())
        raise UsageError(f"unknown queue {name!r}; queues: {known}") from None


def masked(url: str) -> str:
    """``url`` with its password hidden."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return url


def tls_of(args: argparse.Namespace) -> TLSConfig | None:
    """The TLS settings of the options, else of ``REDIS_TLS_*``; None when none is given."""
    env = os.environ
    ca = args.tls_ca_file or env.get("REDIS_TLS_CA_FILE")
    cert = args.tls_cert_file or env.get("REDIS_TLS_CERT_FILE")
    key = args.tls_key_file or env.get("REDIS_TLS_KEY_FILE")
    raw_verify = env.get("REDIS_TLS_VERIFY")
    verify = not args.tls_no_verify
    if raw_verify is not None and not args.tls_no_verify:
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
    kw: dict[str, Any] = {"socket_connect_timeout": 3, "socket_timeout": 10}
    try:
        client = connect_sync(url, tls=tls, cluster=cluster, **kw)
        client.ping()
    except ConfigurationError:
        raise
    except ValueError as exc:
        raise UsageError(f"invalid Redis URL {masked(url)!r}: {exc}") from exc
    except Exception as exc:
        raise RedisUnavailable(f"cannot reach Redis at {masked(url)}: {exc}") from exc
    return client


# -- output --------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int]) -> str:
    cells = [list(header)] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(s: str, n: int = 72) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def depth_rows(d: QueueDepth) -> list[list[Any]]:
    rows: list[list[Any]] = [
        [d.queue, s.shard, s.ready, s.in_flight, s.delayed, s.dead] for s in d.shards
    ]
    if len(d.shards) > 1:
        rows.append([d.queue, "total", d.ready, d.in_flight, d.delayed, d.dead])
    return rows


def dead_rows(letters: Sequence[DeadLetter]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for d in letters:
        error = f"{d.error_type}: {d.error}" if d.error_type else d.error
        rows.append(
            [
                d.ref,
                _when(d.failed_at_ms),
                d.job_name or "-",
                d.job_id or "-",
                d.reason,
                "-" if d.attempts is None else d.attempts,
                _short(error),
            ]
        )
    return rows


# -- commands ------------------------------------------------------------------------------


def cmd_depth(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    lanes = [lane_of(contracts, args.queue)] if args.queue else contracts.lanes()
    admins = [SyncQueueAdmin(client, lane, prefix=args.prefix, group=args.group) for lane in lanes]
    depths = [a.depth() for a in admins]
    paused = [a.lane.name for a in admins if a.is_paused()]
    if args.json:
        out = [
            {
                "queue": d.queue,
                "paused": d.queue in paused,
                "ready": d.ready,
                "in_flight": d.in_flight,
                "delayed": d.delayed,
                "dead": d.dead,
                "shards": [
                    {
                        "shard": s.shard,
                        "ready": s.ready,
                        "in_flight": s.in_flight,
                        "delayed": s.delayed,
                        "dead": s.dead,
                    }
                    for s in d.shards
                ],
            }
            for d in depths
        ]
        print(json.dumps(out, indent=2))
        return EXIT_OK
    rows = [row for d in depths for row in depth_rows(d)]
    print(table(["QUEUE", "SHARD", "READY", "IN-FLIGHT", "DELAYED", "DEAD"], rows, {2, 3, 4, 5}))
    for name in paused:
        print(f"{name} is paused")
    return EXIT_OK


def cmd_dead(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    lane = lane_of(contracts, args.queue)
    dead = SyncDeadLetters(client, lane, prefix=args.prefix)
    return DEAD_ACTIONS[args.dead_command](args, dead)


def dead_list(args: argparse.Namespace, dead: SyncDeadLetters) -> int:
    letters = dead.list(args.limit, shard=args.shard, reason=args.reason)
    if args.json:
        print(json.dumps([d.to_dict() for d in letters], indent=2))
    elif not letters:
        print(f"no dead letters in {dead.lane.name}")
    else:
        header = ["REF", "FAILED AT (UTC)", "JOB", "JOB ID", "REASON", "ATTEMPTS", "ERROR"]
        print(table(header, dead_rows(letters), {5}))
    return EXIT_OK


def dead_count(args: argparse.Namespace, dead: SyncDeadLetters) -> int:
    if args.by_reason:
        counts: int | dict[str, int] = dead.count(by_reason=True)
    else:
        counts = dead.count()
    if args.json:
        print(json.dumps(counts))
    elif isinstance(counts, dict):
        print(table(["REASON", "COUNT"], sorted(counts.items()), {1}) if counts else "0")
    else:
        print(counts)
    return EXIT_OK


def dead_retry(args: argparse.Namespace, dead: SyncDeadLetters) -> int:
    if args.all == bool(args.ids):
        raise UsageError("dead retry: give --all or dead letter ids (one of them)")
    n = dead.retry(all=True) if args.all else dead.retry(args.ids)
    print(f"re-enqueued {n} job(s) from the dead letters of {dead.lane.name}")
    missing = len(set(args.ids)) - n
    if args.ids and missing > 0:
        print(
            f"{missing} of the given dead letters were not found or hold no job (lost payload)",
            file=sys.stderr,
        )
    return EXIT_OK


def dead_purge(args: argparse.Namespace, dead: SyncDeadLetters) -> int:
    if sum([bool(args.ids), args.all, args.older_than is not None]) != 1:
        raise UsageError("dead purge: give exactly one of --all, --older-than or ids")
    if args.all:
        n = dead.purge(all=True)
    elif args.older_than is not None:
        n = dead.purge(older_than=args.older_than)
    else:
        n = dead.purge(args.ids)
    print(f"deleted {n} dead letter(s) of {dead.lane.name}")
    return EXIT_OK


DEAD_ACTIONS: dict[str, Callable[[argparse.Namespace, SyncDeadLetters], int]] = {
    "list": dead_list,
    "count": dead_count,
    "retry": dead_retry,
    "purge": dead_purge,
}


def cmd_pause(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    admin = SyncQueueAdmin(client, lane_of(contracts, args.queue), prefix=args.prefix)
    if args.command == "pause":
        admin.pause()
        print(f"paused {admin.lane.name}: workers start no new jobs; running jobs finish")
    else:
        admin.resume()
        print(f"resumed {admin.lane.name}")
    return EXIT_OK


def cmd_consumers(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    lane = lane_of(contracts, args.queue)
    admin = SyncQueueAdmin(client, lane, prefix=args.prefix, group=args.group)
    found = admin.consumers()
    if args.json:
        print(json.dumps([asdict(c) for c in found], indent=2))
        return EXIT_OK
    if not found:
        print(f"no consumers of {lane.name}")
        return EXIT_OK
    rows = [
        [
            c.name,
            c.pending,
            "-" if c.idle_ms is None else c.idle_ms,
            "-" if c.last_heartbeat_ms is None else _when(c.last_heartbeat_ms),
        ]
        for c in found
    ]
    print(table(["CONSUMER", "PENDING", "IDLE MS", "HEARTBEAT (UTC)"], rows, {1, 2}))
    return EXIT_OK


def cmd_tenant(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    admin = SyncQueueAdmin(client, lane_of(contracts, args.queue), prefix=args.prefix)
    queue = admin.lane.contract.queue_name
    if args.tenant_command == "flag":
        flag = admin.flag_tenant(args.tenant, args.duration, reason=args.reason, by="cli")
        print(f"flagged tenant {flag.tenant!r} of {queue} until {_when(flag.expires_at_ms)} "
              "UTC: its new jobs go to the secondary lane")
        return EXIT_OK
    if args.tenant_command == "unflag":
        if admin.unflag_tenant(args.tenant, by="cli"):
            print(f"unflagged tenant {args.tenant!r} of {queue}")
        else:
            print(f"tenant {args.tenant!r} of {queue} was not flagged")
        return EXIT_OK
    flags = admin.flagged_tenants()
    if args.json:
        print(json.dumps([asdict(f) for f in flags], indent=2))
    elif not flags:
        print(f"no flagged tenants in {queue}")
    else:
        rows = [[f.tenant, _when(f.expires_at_ms), "-" if f.since_ms is None else
                 _when(f.since_ms), f.by or "-", _short(f.reason or "-")] for f in flags]
        print(table(["TENANT", "UNTIL (UTC)", "SINCE (UTC)", "BY", "REASON"], rows, set()))
    return EXIT_OK


def cmd_job(args: argparse.Namespace, client: Any, contracts: ContractSet) -> int:
    lane = lane_of(contracts, args.queue)
    admin = SyncQueueAdmin(client, lane, prefix=args.prefix, group=args.group)
    if args.cancel:
        done = admin.cancel(args.id, sharding_key=args.key)
        if args.json:
            print(json.dumps(asdict(done), indent=2))
        else:
            print(f"{done.outcome}{f' ({done.detail})' if done.detail else ''}: {args.id}")
        return EXIT_OK if done.outcome != "unknown" else EXIT_NOT_FOUND
    st = admin.status(args.id, sharding_key=args.key)
    if args.json:
        print(json.dumps(st.to_dict(), indent=2))
    else:
        rows = [[k, _job_value(k, v)] for k, v in st.to_dict().items()
                if v not in (None, False) and k != "job_id"]
        print(f"job {args.id}")
        print(table(["FIELD", "VALUE"], rows, set()))
    return EXIT_OK if st.state != "unknown" else EXIT_NOT_FOUND


def _job_value(name: str, value: Any) -> str:
    if name.endswith("_ms") and name != "keep_ms" and isinstance(value, int):
        return _when(value)
    if isinstance(value, dict | list):
        return _short(json.dumps(value))
    return _short(str(value))


COMMANDS: dict[str, Callable[[argparse.Namespace, Any, ContractSet], int]] = {
    "job": cmd_job,
    "depth": cmd_depth,
    "dead": cmd_dead,
    "pause": cmd_pause,
    "resume": cmd_pause,
    "consumers": cmd_consumers,
    "tenant": cmd_tenant,
}


def _fail(code: int, message: str) -> int:
    print(f"streamq: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``streamq`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    url = args.redis_url or os.environ.get("REDIS_URL")
    try:
        if not url:
            raise UsageError("no Redis URL: pass --redis-url or set REDIS_URL")
        contracts = load_contracts(args.contracts)
        if getattr(args, "queue", None):
            lane_of(contracts, args.queue)
        client = connect(url, cluster=args.cluster, tls=tls_of(args))
        try:
            return COMMANDS[args.command](args, client, contracts)
        finally:
            client.close()
    except (UsageError, ConfigurationError) as exc:
        return _fail(EXIT_USAGE, str(exc))
    except RedisUnavailable as exc:
        msg = str(exc)
        return _fail(
            EXIT_REDIS, msg if masked(url or "") in msg else f"{msg} ({masked(url or '')})"
        )
    except (StreamqError, redis.RedisError) as exc:
        return _fail(EXIT_REDIS, f"Redis at {masked(url or '')} failed: {exc}")


def run() -> NoReturn:
    """``python -m streamq``."""
    sys.exit(main())
