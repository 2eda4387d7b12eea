"""``streamq dashboard``: serve the web dashboard until interrupted.

Usage::

    streamq dashboard --contracts myapp.contracts:CONTRACTS --redis-url redis://localhost:6379/0
    streamq dashboard --contracts myapp.worker:app --port 8081 --token-file /run/secrets/dash
    streamq dashboard --contracts myapp.worker:app --read-only --host 0.0.0.0

``--contracts`` names a ``ContractSet``, one contract, a list of them or the ``App`` (then
schedules and runners are shown too). ``--redis-url`` defaults to ``$REDIS_URL`` and the token
to ``$STREAMQ_DASHBOARD_TOKEN``: a token given with ``--token`` is visible to every user of the
machine in the process list, so prefer the variable or ``--token-file``.

Exit status: 0 stopped by Ctrl-C or SIGTERM; 1 Redis unreachable; 2 bad arguments, contracts
that cannot be loaded, a port that cannot be bound or the ``dashboard`` extra missing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from streamq.errors import ConfigurationError, RedisUnavailable

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_REDIS, EXIT_USAGE = 0, 1, 2
TOKEN_VARIABLE = "STREAMQ_DASHBOARD_TOKEN"


def _port(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0..65535, got {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamq dashboard",
        description="Serve the streamq web dashboard: queues, consumers, dead letters, "
        "schedules and runners.",
    )
    p.add_argument("--contracts", metavar="MODULE:ATTR",
                   help="the application's contracts or app, e.g. myapp.worker:app (default: "
                        "$STREAMQ_CONTRACTS, else $WORKER_APP)")
    p.add_argument("--redis-url", help="Redis URL (default: $REDIS_URL)")
    p.add_argument("--cluster", action="store_true", help="connect to a Redis Cluster")
    p.add_argument("--tls-ca-file", metavar="PEM",
                   help="CA bundle for rediss:// (default: $REDIS_TLS_CA_FILE)")
    p.add_argument("--tls-cert-file", metavar="PEM",
                   help="client certificate for mutual TLS (default: $REDIS_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", metavar="PEM",
                   help="its private key (default: $REDIS_TLS_KEY_FILE)")
    p.add_argument("--tls-no-verify", action="store_true",
                   help="do not verify the server's certificate (default: $REDIS_TLS_VERIFY)")
    p.add_argument("--prefix", default="streamq", help="key prefix (default: streamq)")
    p.add_argument("--group", default="streamq", help="consumer group (default: streamq)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8081, help="port (default: 8081; 0: any)")
    p.add_argument("--token", help=f"token that actions require (default: ${TOKEN_VARIABLE}); "
                                   "without one, retry, purge, pause and resume are off")
    p.add_argument("--token-file", type=Path, help="read the token from this file")
    p.add_argument("--read-only", action="store_true",
                   help="show no action and refuse every state-changing request")
    p.add_argument("--refresh", type=float, default=5.0, metavar="SECONDS",
                   help="how often pages refresh their figures (default: 5; 0: never)")
    return p


def _token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.token_file is not None:
        try:
            return str(args.token_file.read_text()).strip() or None
        except OSError as exc:
            raise ConfigurationError(f"--token-file: cannot read {args.token_file}: {exc}") from exc
    return args.token or env.get(TOKEN_VARIABLE) or None


def _load(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """The App when ``--contracts`` (else ``STREAMQ_CONTRACTS``, else ``WORKER_APP``) names one
    (schedules and runners need it), else the contracts as the ``streamq`` command loads them."""
    from streamq._cli_support import UsageError
    from streamq.app import App
    from streamq.cli import load_contracts
    from streamq.errors import LoadError
    from streamq.loader import load_object

    for source, spec in (("--contracts", args.contracts),
                         ("STREAMQ_CONTRACTS", env.get("STREAMQ_CONTRACTS")),
                         ("WORKER_APP", env.get("WORKER_APP"))):
        if not spec or not spec.strip():
            continue
        try:
            obj = load_object(spec.strip())
        except LoadError as exc:
            raise ConfigurationError(f"{source}: {exc}") from exc
        if isinstance(obj, App):
            return obj
        try:
            return load_contracts(spec.strip(), source=source)
        except UsageError as exc:
            raise ConfigurationError(str(exc)) from exc
    raise ConfigurationError("no contracts: pass --contracts MODULE:ATTR, or set "
                             "STREAMQ_CONTRACTS (or WORKER_APP, the worker's app)")


async def serve(
    args: argparse.Namespace, url: str, token: str | None, env: Mapping[str, str]
) -> None:
    """Connect, then serve until SIGINT or SIGTERM."""
    import uvicorn

    from streamq._cli_support import UsageError, masked
    from streamq.cli import tls_of
    from streamq.dashboard import create_app
    from streamq.tls import connect

    contracts = _load(args, env)
    try:
        client: Any = connect(url, tls=tls_of(args, env), cluster=args.cluster)
    except UsageError as exc:
        raise ConfigurationError(str(exc)) from exc
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {masked(url)!r}: {exc}") from exc
    try:
        try:
            await client.ping()
        except Exception as exc:
            raise RedisUnavailable(f"cannot reach Redis at {masked(url)}: {exc}") from exc
        app = create_app(contracts, client, token=token, read_only=args.read_only,
                         prefix=args.prefix, group=args.group, refresh_s=args.refresh)
        sock = _bind(args.host, args.port)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        mode = ("read-only" if args.read_only
                else "actions need the token" if token else "actions off (no token)")
        port = sock.getsockname()[1]
        print(f"streamq dashboard on http://{args.host}:{port}/ ({mode}); Ctrl-C stops it",
              file=sys.stderr, flush=True)
        try:
            await server.serve(sockets=[sock])  # uvicorn handles SIGINT and SIGTERM here
        finally:
            sock.close()
    finally:
        await client.aclose()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is a clear error before anything is served."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot serve on {host}:{port}: {exc} (--host, --port)") from exc
    return sock


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run ``streamq dashboard``; returns the exit status. ``env`` (default ``os.environ``)
    is where ``REDIS_URL``, ``STREAMQ_CONTRACTS`` and the token variable are read."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    url = args.redis_url or env.get("REDIS_URL")
    try:
        if not url:
            raise ConfigurationError("no Redis URL: pass --redis-url or set REDIS_URL")
        token = _token(args, env)
        try:
            import uvicorn  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(
                "the dashboard needs the 'dashboard' extra: pip install 'streamq[dashboard]'"
            ) from exc
        asyncio.run(serve(args, url, token, env))
    except ConfigurationError as exc:
        print(f"streamq dashboard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RedisUnavailable as exc:
        print(f"streamq dashboard: error: {exc}", file=sys.stderr)
        return EXIT_REDIS
    except KeyboardInterrupt:
        pass
    return EXIT_OK

