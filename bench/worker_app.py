"""The app ``python -m worker`` runs in scenario (e): ``WORKER_APP=bench.worker_app:app``.

The processor of scenario (a): one ``INCR`` per job on a ``redis.asyncio`` client of its own
(``REDIS_URL``), concurrency 10 (``BENCH_CONCURRENCY``). With ``BENCH_SNAP_DIR`` set, each
process that imports this module counts the commands it sends (:class:`bench.stats.
ClientCommands`), writes ``alive-<pid>`` there, and answers every ``mark-<k>`` file that
appears with ``counts-<pid>-<k>.json`` (its counts then), so the benchmark reads what the
worker processes sent between two marks.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import redis.asyncio as aioredis

from bench import stats
from bench.consumers import LOCK_S, STALLED_S
from bench.contract import Bench, Ping
from streamq import App, Job

KEY = f"{os.environ.get('REDIS_PREFIX', 'streamq')}:counter"
_client: aioredis.Redis | None = None

app = App([Bench])


@app.processor(Bench, concurrency=int(os.environ.get("BENCH_CONCURRENCY", "10")),
               lock_duration=LOCK_S, stalled_interval=STALLED_S)
async def incr(job: Job[Ping]) -> None:
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    await _client.incr(KEY)


def _answer_marks(d: Path) -> None:
    pid = os.getpid()
    answered: set[str] = set()
    (d / f"alive-{pid}").touch()
    while True:
        try:
            names = os.listdir(d)
        except OSError:
            return  # the benchmark removed the directory: this run is over
        for name in names:
            if name.startswith("mark-") and name not in answered:
                answered.add(name)
                tmp = d / f".counts-{pid}-{name[5:]}"
                tmp.write_text(json.dumps(stats.ClientCommands.snapshot()))
                tmp.rename(d / f"counts-{pid}-{name[5:]}.json")
        threading.Event().wait(0.005)


if os.environ.get("BENCH_SNAP_DIR"):
    stats.ClientCommands.install()
    threading.Thread(target=_answer_marks, args=(Path(os.environ["BENCH_SNAP_DIR"]),),
                     name="bench-marks", daemon=True).start()
