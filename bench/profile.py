"""Profile one hot path with pyinstrument: ``python -m bench.profile <scenario> [--n N]``.

Scenarios: ``add-async``, ``add-sync``, ``bulk-async``, ``bulk-sync``, ``worker-async``,
``worker-sync`` (one worker, concurrency 100, pre-filled queue). Starts its own
redis-server; prints the call tree (``--html FILE`` to save an HTML report too).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from bench import consumers, producers
from bench.redis_server import BenchRedis


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile")
    ap.add_argument("scenario", choices=["add-async", "add-sync", "bulk-async", "bulk-sync",
                                         "worker-async", "worker-sync"])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--html", default=None)
    ap.add_argument("--interval", type=float, default=0.0005)
    args = ap.parse_args(argv)
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("pyinstrument is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    with BenchRedis() as server:
        url = server.url
        template = producers.template_fields(url, "tpl")
        prof = Profiler(interval=args.interval, async_mode="disabled")
        result: Any
        if args.scenario.startswith("worker"):
            consumers.prefill(url, "p", template, args.n)
            proc = args.scenario.split("-")[1]
            prof.start()
            result = asyncio.run(consumers.sq_consume(url, "p", args.n,
                                                      concurrency=args.concurrency,
                                                      processor=proc))
        else:
            fn: Any = {
                "add-async": lambda: asyncio.run(producers.sq_add_async(url, "p", args.n)),
                "add-sync": lambda: producers.sq_add_sync(url, "p", args.n),
                "bulk-async": lambda: asyncio.run(producers.sq_bulk_async(url, "p", args.n, 500)),
                "bulk-sync": lambda: producers.sq_bulk_sync(url, "p", args.n, 500),
            }[args.scenario]
            prof.start()
            result = fn()
        prof.stop()
    print(f"{args.scenario}: {result['rate']:,.0f} jobs/s under the profiler", file=sys.stderr)
    print(prof.output_text(unicode=False, color=False, show_all=False))
    if args.html:
        Path(args.html).write_text(prof.output_html())
    return 0


if __name__ == "__main__":
    sys.exit(main())
