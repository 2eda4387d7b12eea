"""Shared pieces of the observability tests: a contract, an app whose processors do what the
payload asks, and helpers to scrape and read a worker's /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from streamq import App, Backoff, Job, JobDefaults, PermanentError, QueueContract, job
from streamq.envelope import FIELD_NAMES, encode_fields

CANARY = "canary-s3cr3t-7f41d2"
"""A secret value that must never show up in logs, spans or dead-letter listings."""


class Work(BaseModel):
    project_id: str
    mode: str = "ok"
    token: str = ""
    n: int = 0


class Obs(
    QueueContract,
    name="obs",
    shards=2,
    tenant_field="project_id",
    secret_fields={"token"},
    defaults=JobDefaults(attempts=3, backoff=Backoff.fixed(timedelta(milliseconds=10))),
):
    work = job("work", Work)
    later = job("later", Work)


FAST = {
    "concurrency": 4,
    "lock_duration": timedelta(seconds=1),
    "stalled_interval": timedelta(milliseconds=200),
    "block_timeout": timedelta(milliseconds=200),
    "promote_interval": timedelta(milliseconds=50),
    "shutdown_timeout": timedelta(seconds=1),
}


@dataclass
class Behaviour:
    """What the processors saw, and a gate that ``block`` jobs wait on."""

    runs: list[tuple[str, int]] = field(default_factory=list)
    ran_at: dict[str, float] = field(default_factory=dict)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[Any] = field(default_factory=list)
    observe: Callable[[Job[Any]], Any] | None = None
    """Called by ``observe`` jobs inside the processor; its results land in ``seen``."""


def make_app(state: Behaviour, **options: Any) -> App:
    app = App([Obs])
    opts = {**FAST, **options}

    @app.processor(Obs, **opts)
    async def process(j: Job[Work]) -> None:
        state.runs.append((j.id, j.attempt))
        state.ran_at[j.id] = time.time()
        mode = j.payload.mode
        if mode == "flaky" and j.attempt < 3:
            raise RuntimeError(f"flaky attempt {j.attempt}")
        if mode == "fail":
            raise RuntimeError("always fails")
        if mode == "leak":
            raise RuntimeError(f"rejected token {j.payload.token!r}")
        if mode == "permanent":
            raise PermanentError("cannot ever work")
        if mode == "block":
            await state.gate.wait()
        if mode == "observe" and state.observe is not None:
            state.seen.append(state.observe(j))

    return app


def raw_entry(*, job_id: str, name: str, payload: bytes) -> dict[str, Any]:
    """Stream fields of a job written around the producer (a poison or foreign entry)."""
    values = encode_fields(
        job_id=job_id, name=name, timestamp_ms=int(time.time() * 1000), payload_json=payload
    )
    return dict(zip(FIELD_NAMES, values, strict=True))


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return status, headers, body


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Samples:
    # Imported here: the extras test loads this module with prometheus_client missing.
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and want <= lbl)


def has(samples: Samples, name: str) -> bool:
    return any(n == name for n, _ in samples)


async def scrape(port: int) -> Samples:
    status, _, body = await http_get(port, "/metrics")
    assert status == 200, body
    return parse_metrics(body.decode())


async def wait_for(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)
