"""What every ``streamq`` subcommand shares: the context it runs in, durations, tables,
JSON output and confirmation of destructive actions."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

from streamq.contracts import ContractSet, Lane
from streamq.errors import ConfigurationError, ContractError
from streamq.sentinel import SentinelURL

__all__ = [
    "CommandContext",
    "UsageError",
    "ago",
    "confirm",
    "format_duration",
    "lane_of",
    "masked",
    "parse_duration",
    "positive_int",
    "print_json",
    "table",
    "when",
]

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(Exception):
    """A mistake in the command line: reported with exit status 2."""


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a subcommand's handler gets: its parsed arguments, a connected (sync) Redis
    client, the application's contracts and the global options.

    Attributes:
        args: the parsed command line.
        client: a ``redis.Redis`` (or ``RedisCluster`` with ``--cluster``), connected.
        contracts: the application's contracts.
        redis_url: where ``client`` is connected (for a handler that opens its own clients).
        cluster: ``--cluster``.
        prefix: the key prefix (``--prefix``, ``REDIS_PREFIX``).
        group: the consumer group (``--group``, ``WORKER_GROUP``).
        json: ``--json``: print JSON, nothing else, on stdout.
        yes: ``--yes``: destructive actions go ahead without asking.
        app: the ``App`` the contracts came from, when they came from one.
    """

    args: argparse.Namespace
    client: Any
    contracts: ContractSet
    redis_url: str
    cluster: bool
    prefix: str
    group: str
    json: bool
    yes: bool
    app: Any = None
    """The application's ``App`` when the contracts were given as one (schedules need it)."""

    def lane(self, name: str) -> Lane:
        """The lane called ``name``.

        Raises:
            UsageError: no queue of the contracts has that name (the message lists them).
        """
        return lane_of(self.contracts, name)


def lane_of(contracts: ContractSet, name: str) -> Lane:
    """The lane of ``contracts`` called ``name``.

    Raises:
        UsageError: there is none (the message lists the queues there are).
    """
    try:
        return contracts.lane(name)
    except ContractError:
        known = ", ".join(lane.name for lane in contracts.lanes())
        raise UsageError(f"unknown queue {name!r}; queues: {known}") from None


def parse_duration(value: str) -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``500ms`` or plain seconds."""
    m = _DURATION_RE.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid duration {value!r}: use a number with ms, s, m, h, d or w (e.g. 7d)"
        )
    return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2) or "s"])


def positive_duration(value: str) -> timedelta:
    """A :func:`parse_duration` of at least 100 ms (a refresh interval)."""
    d = parse_duration(value)
    if d < timedelta(milliseconds=100):
        raise argparse.ArgumentTypeError(f"expected a duration of at least 100ms, got {value!r}")
    return d


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return n


def format_duration(ms: float) -> str:
    """A short human duration: ``850ms``, ``42s``, ``3m12s``, ``2h``, ``1d4h``, ``3w``.

    Two units at most, the smaller one left out when it is zero; under a second in ms.
    """
    if ms < 0:
        ms = 0
    if ms < 1000:
        return f"{int(ms)}ms"
    seconds = int(ms // 1000)
    units = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    parts: list[str] = []
    for i, (name, size) in enumerate(units):
        if seconds >= size:
            big, rest = divmod(seconds, size)
            parts.append(f"{big}{name}")
            if i + 1 < len(units) and rest:
                small_name, small_size = units[i + 1]
                if rest // small_size:
                    parts.append(f"{rest // small_size}{small_name}")
            break
    return "".join(parts)


def when(ms: int) -> str:
    """``ms`` since the epoch as ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` the moment ``ms`` was: ``3m12s ago``."""
    return f"{format_duration(now_ms - ms)} ago"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int]) -> str:
    """Aligned columns; the columns in ``numeric`` right-aligned."""
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


def print_json(data: Any, *, indent: int | None = 2) -> None:
    print(json.dumps(data, indent=indent), flush=True)


def masked(url: str) -> str:
    """``url`` with its password hidden."""
    if SentinelURL.matches(url):
        try:
            return SentinelURL.parse(url).where()
        except ConfigurationError:
            return "redis+sentinel://..."
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


def confirm(ctx: CommandContext, action: str, *, stdin: TextIO | None = None) -> bool:
    """Ask whether to ``action`` (``"delete 3 dead letter(s) of adm"``) on the terminal;
    True when the answer is yes, or ``--yes`` was given.

    Raises:
        UsageError: stdin is not a terminal and ``--yes`` was not given: nobody can answer,
            and a destructive action must not go ahead unanswered.
    """
    if ctx.yes:
        return True
    stream = stdin or sys.stdin
    if not stream.isatty():
        raise UsageError(
            f"refusing to {action} without confirmation: stdin is not a terminal; "
            "pass --yes to go ahead"
        )
    print(f"{action[:1].upper()}{action[1:]}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stream.readline().strip().lower()
    return answer in ("y", "yes")
