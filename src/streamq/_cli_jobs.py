"""``streamq job ID --queue Q [--cancel]``: a tracked job's status (see docs/job-control.md)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from streamq._cli_support import CommandContext, ago, confirm, format_duration, print_json, table
from streamq.admin import SyncQueueAdmin

__all__ = ["EXIT_NOT_FOUND", "add_job_commands"]

EXIT_OK = 0
EXIT_NOT_FOUND = 3
"""``streamq job``: the job is not tracked (or its final record expired)."""


def add_job_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    jb = cmds.add_parser("job", parents=[common], help="a tracked job's status (or cancel it)")
    jb.add_argument("id", help="the job id")
    jb.add_argument("--queue", required=True, help="the queue (lane) the job was added to")
    jb.add_argument("--key", help="the sharding key it was added with (asks one shard)")
    jb.add_argument("--cancel", action="store_true", help="cancel the job (asks first)")
    jb.set_defaults(handler=cmd_job)


def cmd_job(ctx: CommandContext) -> int:
    args = ctx.args
    lane = ctx.lane(args.queue)
    admin = SyncQueueAdmin(ctx.client, lane, prefix=ctx.prefix, group=ctx.group)
    if args.cancel:
        if not confirm(ctx, f"cancel job {args.id} of {lane.name}"):
            if ctx.json:
                print_json({"job_id": args.id, "outcome": "declined"})
            else:
                print("nothing done")
            return EXIT_OK
        done = admin.cancel(args.id, sharding_key=args.key)
        if ctx.json:
            print_json(asdict(done))
        else:
            print(f"{done.outcome}{f' ({done.detail})' if done.detail else ''}: {args.id}")
        return EXIT_OK if done.outcome != "unknown" else EXIT_NOT_FOUND
    st = admin.status(args.id, sharding_key=args.key)
    if ctx.json:
        print_json(st.to_dict())
    else:
        sec, usec = ctx.client.time()
        now = int(sec) * 1000 + int(usec) // 1000
        rows = [[k, _value(k, v, now)] for k, v in st.to_dict().items()
                if v not in (None, False) and k != "job_id"]
        print(f"job {args.id}")
        print(table(["FIELD", "VALUE"], rows, set()))
    return EXIT_OK if st.state != "unknown" else EXIT_NOT_FOUND


def _value(name: str, value: Any, now_ms: int) -> str:
    """A status field for people: moments as ``3m12s ago`` / ``in 2m``, spans as ``5m``."""
    if name == "keep_ms" and isinstance(value, int):
        return format_duration(value)
    if name.endswith("_ms") and isinstance(value, int):
        return ago(value, now_ms) if value <= now_ms else f"in {format_duration(value - now_ms)}"
    if isinstance(value, dict | list):
        value = json.dumps(value)
    text = " ".join(str(value).split())
    return text if len(text) <= 72 else text[:69] + "..."
