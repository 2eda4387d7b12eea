"""``streamq schedules list|pause|resume``: the app's schedules (see docs/schedules.md).

Schedules are declared on the app, so these commands need it: ``--contracts`` (or
``STREAMQ_CONTRACTS``) naming the ``App``, or ``WORKER_APP``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from streamq._cli_support import CommandContext, UsageError, format_duration, print_json, table
from streamq.errors import ConfigurationError
from streamq.schedules import ScheduleInfo, SyncSchedules

__all__ = ["add_schedule_commands"]

EXIT_OK = 0


def add_schedule_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    sched = cmds.add_parser(
        "schedules", parents=[common],
        help="list the app's schedules (last and next run), pause or resume one",
    )
    actions = sched.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    sl = actions.add_parser("list", parents=[common], help="every schedule, its last and next run")
    sl.set_defaults(handler=schedules_list)
    for name, handler, what in (("pause", schedules_pause, "the whole fleet skips its ticks"),
                                ("resume", schedules_resume, "its ticks run again")):
        p = actions.add_parser(name, parents=[common], help=f"{name} a schedule: {what}")
        p.add_argument("name", help="the schedule's name")
        p.set_defaults(handler=handler)


def _schedules(ctx: CommandContext) -> SyncSchedules:
    if ctx.app is None:
        raise UsageError(
            "schedules are declared on the app: point --contracts (or STREAMQ_CONTRACTS) at "
            "the App, or set WORKER_APP"
        )
    return SyncSchedules(ctx.client, ctx.app, prefix=ctx.prefix)


def _jsonable(s: ScheduleInfo) -> dict[str, Any]:
    out = asdict(s)
    out["every"] = s.every.total_seconds() if s.every is not None else None  # seconds
    for k in ("last_run", "next_run"):
        value = getattr(s, k)
        out[k] = value.isoformat() if value is not None else None
    return out


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _timing(s: ScheduleInfo) -> str:
    if s.cron is not None:
        return f"cron {s.cron} ({s.timezone})"
    assert s.every is not None
    return f"every {format_duration(s.every.total_seconds() * 1000)}"


def schedules_list(ctx: CommandContext) -> int:
    infos = _schedules(ctx).list()
    if ctx.json:
        print_json([_jsonable(s) for s in infos], indent=2)
        return EXIT_OK
    if not infos:
        print("no schedules declared")
        return EXIT_OK
    rows = [
        [s.name, s.queue, s.job, _timing(s), "yes" if s.paused else "no",
         "yes" if s.enabled else "no",
         _utc(s.last_run) if s.last_run else "never",
         _utc(s.next_run) if s.next_run else "-"]
        for s in infos
    ]
    print(table(["NAME", "QUEUE", "JOB", "TIMING", "PAUSED", "ENABLED", "LAST RUN (UTC)",
                 "NEXT RUN (UTC)"], rows, set()))
    return EXIT_OK


def _set_paused(ctx: CommandContext, paused: bool) -> int:
    schedules = _schedules(ctx)
    try:
        (schedules.pause if paused else schedules.resume)(ctx.args.name)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    word = "paused" if paused else "resumed"
    if ctx.json:
        print_json({"schedule": ctx.args.name, "paused": paused})
    else:
        print(f"{word} schedule {ctx.args.name!r} (every replica obeys within about a second)")
    return EXIT_OK


def schedules_pause(ctx: CommandContext) -> int:
    return _set_paused(ctx, True)


def schedules_resume(ctx: CommandContext) -> int:
    return _set_paused(ctx, False)
