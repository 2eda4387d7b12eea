"""The ``streamq`` subcommands over Redis: depth, dead letters, pause/resume, consumers.

One ``add_*_commands(subparsers, common)`` function per group registers its parsers (each
with ``parents=[common]``, so the global options work after the subcommand too) and the
handler each runs with a :class:`~streamq._cli_support.CommandContext`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from streamq._cli_support import (
    CommandContext,
    UsageError,
    ago,
    confirm,
    format_duration,
    parse_duration,
    positive_duration,
    positive_int,
    print_json,
    table,
    when,
)
from streamq.admin import QueueDepth, SyncQueueAdmin
from streamq.deadletters import DeadLetter, SyncDeadLetters

__all__ = ["add_dead_commands", "add_depth_commands", "add_queue_commands"]

EXIT_OK = 0
_CLEAR = "\x1b[H\x1b[2J"


def _server_ms(ctx: CommandContext) -> int:
    """Now on the Redis clock, which dead letters and heartbeats are stamped with."""
    sec, usec = ctx.client.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- depth -----------------------------------------------------------------------------------


def add_depth_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    depth = cmds.add_parser(
        "depth", parents=[common], help="ready, in-flight, delayed and dead jobs per shard"
    )
    depth.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    depth.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    depth.add_argument(
        "--interval", type=positive_duration, default=timedelta(seconds=2), metavar="DURATION",
        help="time between redraws with --watch (default: 2s)",
    )
    depth.set_defaults(handler=cmd_depth)


def depth_json(depths: list[QueueDepth]) -> list[dict[str, Any]]:
    return [
        {
            "queue": d.queue,
            "paused": d.paused,
            "ready": d.ready,
            "in_flight": d.in_flight,
            "delayed": d.delayed,
            "dead": d.dead,
            "oldest_ready_age_s": d.oldest_ready_age_s,
            "consumers": d.consumers,
            "shards": [asdict(s) for s in d.shards],
        }
        for d in depths
    ]


def _age(seconds: float) -> str:
    return format_duration(seconds * 1000) if seconds > 0 else "-"


def depth_text(depths: list[QueueDepth]) -> str:
    rows: list[list[Any]] = []
    for d in depths:
        rows += [
            [d.queue, s.shard, s.ready, s.in_flight, s.delayed, s.dead, _age(s.oldest_ready_age_s)]
            for s in d.shards
        ]
        if len(d.shards) > 1:
            rows.append([d.queue, "total", d.ready, d.in_flight, d.delayed, d.dead,
                         _age(d.oldest_ready_age_s)])
    header = ["QUEUE", "SHARD", "READY", "IN-FLIGHT", "DELAYED", "DEAD", "OLDEST READY"]
    out = table(header, rows, {2, 3, 4, 5, 6})
    return "\n".join([out, *(f"{d.queue} is paused" for d in depths if d.paused)])


def cmd_depth(ctx: CommandContext) -> int:
    lanes = [ctx.lane(ctx.args.queue)] if ctx.args.queue else ctx.contracts.lanes()
    admins = [SyncQueueAdmin(ctx.client, ln, prefix=ctx.prefix, group=ctx.group) for ln in lanes]

    def read() -> list[QueueDepth]:
        return [a.depth() for a in admins]

    if not ctx.args.watch:
        depths = read()
        if ctx.json:
            print_json(depth_json(depths))
        else:
            print(depth_text(depths))
        return EXIT_OK
    return _watch(ctx, read)


def _watch(ctx: CommandContext, read: Callable[[], list[QueueDepth]]) -> int:
    """Print a reading every interval until Ctrl-C: a redrawn screen on a terminal, one
    block (or one JSON line) per reading otherwise, so a log or a pipe keeps every one."""
    interval_s = ctx.args.interval.total_seconds()
    redraw = sys.stdout.isatty() and not ctx.json
    try:
        while True:
            started = time.monotonic()
            depths = read()
            now_ms = _server_ms(ctx)
            if ctx.json:
                print_json({"at": when(now_ms), "at_ms": now_ms,
                            "queues": depth_json(depths)}, indent=None)
            else:
                head = (f"{when(now_ms)} UTC, every {format_duration(interval_s * 1000)} "
                        "(Ctrl-C to stop)")
                print(f"{_CLEAR if redraw else ''}{head}\n{depth_text(depths)}\n", flush=True)
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return EXIT_OK


# -- dead letters ----------------------------------------------------------------------------


def add_dead_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    dead = cmds.add_parser(
        "dead", parents=[common], help="list, count, retry or purge dead letters"
    )
    actions = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dl = actions.add_parser("list", parents=[common], help="newest dead letters first")
    dl.add_argument("queue")
    dl.add_argument("--limit", type=positive_int, default=20, help="default: 20")
    dl.add_argument("--reason", help="only this reason (error, permanent, stalled, ...)")
    dl.add_argument("--shard", help="only this shard")
    dl.set_defaults(handler=dead_list)
    dc = actions.add_parser("count", parents=[common], help="how many dead letters")
    dc.add_argument("queue")
    dc.add_argument("--by-reason", action="store_true")
    dc.set_defaults(handler=dead_count)
    dr = actions.add_parser(
        "retry", parents=[common], help="re-enqueue dead letters (attempt 1, due now)"
    )
    dr.add_argument("queue")
    dr.add_argument("ids", nargs="*", metavar="ID", help="dead letters as <shard>/<id>")
    dr.add_argument("--all", action="store_true", help="every dead letter (asks first)")
    dr.set_defaults(handler=dead_retry)
    dp = actions.add_parser("purge", parents=[common], help="delete dead letters (asks first)")
    dp.add_argument("queue")
    dp.add_argument("ids", nargs="*", metavar="ID", help="dead letters as <shard>/<id>")
    dp.add_argument("--all", action="store_true", help="every dead letter of the queue")
    dp.add_argument(
        "--older-than", type=parse_duration, metavar="AGE", help="dead-lettered before (7d)"
    )
    dp.set_defaults(handler=dead_purge)


def _dead(ctx: CommandContext) -> SyncDeadLetters:
    return SyncDeadLetters(ctx.client, ctx.lane(ctx.args.queue), prefix=ctx.prefix)


def _short(s: str, n: int = 72) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def dead_rows(letters: list[DeadLetter], now_ms: int) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for d in letters:
        error = f"{d.error_type}: {d.error}" if d.error_type else d.error
        rows.append([
            d.ref,
            ago(d.failed_at_ms, now_ms),
            d.job_name or "-",
            d.job_id or "-",
            d.reason,
            "-" if d.attempts is None else d.attempts,
            _short(error),
        ])
    return rows


def dead_list(ctx: CommandContext) -> int:
    dead = _dead(ctx)
    letters = dead.list(ctx.args.limit, shard=ctx.args.shard, reason=ctx.args.reason)
    if ctx.json:
        print_json([d.to_dict() for d in letters])
    elif not letters:
        print(f"no dead letters in {dead.lane.name}")
    else:
        header = ["REF", "FAILED", "JOB", "JOB ID", "REASON", "ATTEMPTS", "ERROR"]
        print(table(header, dead_rows(letters, _server_ms(ctx)), {5}))
    return EXIT_OK


def dead_count(ctx: CommandContext) -> int:
    dead = _dead(ctx)
    counts: int | dict[str, int] = (
        dead.count(by_reason=True) if ctx.args.by_reason else dead.count()
    )
    if ctx.json:
        print_json(counts)
    elif isinstance(counts, dict):
        print(table(["REASON", "COUNT"], sorted(counts.items()), {1}) if counts else "0")
    else:
        print(counts)
    return EXIT_OK


def dead_retry(ctx: CommandContext) -> int:
    args = ctx.args
    if args.all == bool(args.ids):
        raise UsageError("dead retry: give --all or dead letter ids (one of them)")
    dead = _dead(ctx)
    name = dead.lane.name
    if args.all:
        total = dead.count()
        if total and not confirm(ctx, f"re-enqueue all {total} dead letter(s) of {name}"):
            return _declined(ctx, name, "retried")
        n = dead.retry(all=True)
    else:
        n = dead.retry(args.ids)
    missing = max(0, len(set(args.ids)) - n) if args.ids else 0
    if ctx.json:
        print_json({"queue": name, "retried": n, "not_found": missing})
    else:
        print(f"re-enqueued {n} job(s) from the dead letters of {name}")
    if missing:
        print(
            f"{missing} of the given dead letters were not found or hold no job (lost payload)",
            file=sys.stderr,
        )
    return EXIT_OK


def dead_purge(ctx: CommandContext) -> int:
    args = ctx.args
    if sum([bool(args.ids), args.all, args.older_than is not None]) != 1:
        raise UsageError("dead purge: give exactly one of --all, --older-than or ids")
    dead = _dead(ctx)
    name = dead.lane.name
    if args.all:
        question = f"delete all {dead.count()} dead letter(s) of {name}"
    elif args.older_than is not None:
        age = format_duration(args.older_than.total_seconds() * 1000)
        question = f"delete the dead letters of {name} older than {age}"
    else:
        question = f"delete {len(set(args.ids))} dead letter(s) of {name}"
    if not confirm(ctx, question):
        return _declined(ctx, name, "deleted")
    if args.all:
        n = dead.purge(all=True)
    elif args.older_than is not None:
        n = dead.purge(older_than=args.older_than)
    else:
        n = dead.purge(args.ids)
    if ctx.json:
        print_json({"queue": name, "deleted": n})
    else:
        print(f"deleted {n} dead letter(s) of {name}")
    return EXIT_OK


def _declined(ctx: CommandContext, queue: str, counted: str) -> int:
    if ctx.json:
        print_json({"queue": queue, counted: 0, "declined": True})
    else:
        print("nothing done")
    return EXIT_OK


# -- queue state: pause, resume, consumers ---------------------------------------------------


def add_queue_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    for name, what in (("pause", "stop starting new jobs"), ("resume", "start jobs again")):
        c = cmds.add_parser(name, parents=[common], help=what)
        c.add_argument("queue")
        c.set_defaults(handler=cmd_pause)
    cons = cmds.add_parser("consumers", parents=[common], help="the workers consuming a queue")
    cons.add_argument("queue")
    cons.set_defaults(handler=cmd_consumers)


def cmd_pause(ctx: CommandContext) -> int:
    admin = SyncQueueAdmin(ctx.client, ctx.lane(ctx.args.queue), prefix=ctx.prefix)
    name = admin.lane.name
    pause = ctx.args.command == "pause"
    if pause:
        admin.pause()
    else:
        admin.resume()
    if ctx.json:
        print_json({"queue": name, "paused": pause})
    elif pause:
        print(f"paused {name}: workers start no new jobs; running jobs finish")
    else:
        print(f"resumed {name}")
    return EXIT_OK


def cmd_consumers(ctx: CommandContext) -> int:
    lane = ctx.lane(ctx.args.queue)
    found = SyncQueueAdmin(ctx.client, lane, prefix=ctx.prefix, group=ctx.group).consumers()
    if ctx.json:
        print_json([asdict(c) for c in found])
        return EXIT_OK
    if not found:
        print(f"no consumers of {lane.name}")
        return EXIT_OK
    now = _server_ms(ctx)
    rows = [
        [
            c.name,
            c.pending,
            "-" if c.idle_ms is None else format_duration(c.idle_ms),
            "-" if c.last_heartbeat_ms is None else ago(c.last_heartbeat_ms, now),
        ]
        for c in found
    ]
    print(table(["CONSUMER", "PENDING", "IDLE", "HEARTBEAT"], rows, {1, 2}))
    return EXIT_OK
