"""``streamq tenant flag|unflag|list``: tenant flags (see docs/tenants.md)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from streamq._cli_support import (
    CommandContext,
    ago,
    format_duration,
    parse_duration,
    print_json,
    table,
    when,
)
from streamq.admin import SyncQueueAdmin

__all__ = ["add_tenant_commands"]

EXIT_OK = 0


def add_tenant_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    tenant = cmds.add_parser(
        "tenant", parents=[common],
        help="flag, unflag or list tenants routed to the secondary lane",
    )
    actions = tenant.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    tf = actions.add_parser(
        "flag", parents=[common], help="route a tenant's new jobs to the secondary lane"
    )
    tf.add_argument("queue")
    tf.add_argument("tenant")
    tf.add_argument("--for", dest="duration", type=parse_duration, required=True,
                    metavar="DURATION", help="how long (10m, 2h, 1d)")
    tf.add_argument("--reason", default="", help="why (shown by tenant list)")
    tf.set_defaults(handler=tenant_flag)
    tu = actions.add_parser("unflag", parents=[common], help="lift a tenant's flag now")
    tu.add_argument("queue")
    tu.add_argument("tenant")
    tu.set_defaults(handler=tenant_unflag)
    tl = actions.add_parser("list", parents=[common], help="the tenants flagged now")
    tl.add_argument("queue")
    tl.set_defaults(handler=tenant_list)


def _admin(ctx: CommandContext) -> SyncQueueAdmin:
    return SyncQueueAdmin(ctx.client, ctx.lane(ctx.args.queue), prefix=ctx.prefix)


def tenant_flag(ctx: CommandContext) -> int:
    admin = _admin(ctx)
    queue = admin.lane.contract.queue_name
    flag = admin.flag_tenant(ctx.args.tenant, ctx.args.duration, reason=ctx.args.reason,
                             by="cli")
    if ctx.json:
        print_json(asdict(flag))
    else:
        span = format_duration(ctx.args.duration.total_seconds() * 1000)
        print(f"flagged tenant {flag.tenant!r} of {queue} until {when(flag.expires_at_ms)} "
              f"UTC (for {span}): its new jobs go to the secondary lane")
    return EXIT_OK


def tenant_unflag(ctx: CommandContext) -> int:
    admin = _admin(ctx)
    queue = admin.lane.contract.queue_name
    tenant = ctx.args.tenant
    was = admin.unflag_tenant(tenant, by="cli")
    if ctx.json:
        print_json({"queue": queue, "tenant": tenant, "unflagged": was})
    elif was:
        print(f"unflagged tenant {tenant!r} of {queue}")
    else:
        print(f"tenant {tenant!r} of {queue} was not flagged")
    return EXIT_OK


def tenant_list(ctx: CommandContext) -> int:
    admin = _admin(ctx)
    queue = admin.lane.contract.queue_name
    flags = admin.flagged_tenants()
    if ctx.json:
        print_json([asdict(f) for f in flags])
        return EXIT_OK
    if not flags:
        print(f"no flagged tenants in {queue}")
        return EXIT_OK
    sec, usec = ctx.client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    rows = [
        [
            f.tenant,
            f"in {format_duration(f.expires_at_ms - now)}",
            "-" if f.since_ms is None else ago(f.since_ms, now),
            f.by or "-",
            " ".join((f.reason or "-").split()),
        ]
        for f in flags
    ]
    print(table(["TENANT", "EXPIRES", "FLAGGED", "BY", "REASON"], rows, set()))
    return EXIT_OK
