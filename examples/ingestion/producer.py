"""Enqueue a deterministic mix of jobs across the example's queues.

The mix: three quarters ingestion events (a quarter of them from the noisy projects, which
go to the secondary lane), a quarter evaluations, and a deletion every 250 jobs, plus two
deletions of a project that no longer exists (they fail permanently). The same ``--jobs``
and ``--seed`` always give the same jobs.

A few events of the throttled project (``proj-007``) come in a second, *late* wave: the
worker flags that project when the event store throttles its first event, and the late
events then go to the secondary lane by themselves (the producer follows the flag).

Run it on its own (``REDIS_URL`` unset: the embedded Redis of ``STREAMQ_DATA_DIR``)::

    python -m examples.ingestion.producer --jobs 5000

With ``--metrics-port`` it serves its Prometheus metrics (``streamq_jobs_enqueued_total``,
``streamq_enqueue_rejected_total``...) on ``/metrics`` and keeps serving after its last
batch until SIGTERM or Ctrl-C, so a scrape sees the final counts. With ``--every S`` it
enqueues a new batch (the next seed) every ``S`` seconds; a batch that Redis refuses (down,
out of memory) is counted as ``reason="redis_error"`` and reported, and the next one is
tried on time: what the ``StreamqEnqueueFailing`` alert watches::

    python -m examples.ingestion.producer --jobs 500 --every 10 --metrics-port 9101
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from examples.ingestion.contracts import (
    NOISY_PROJECTS,
    THROTTLED_PROJECTS,
    DeleteEntities,
    Deletion,
    EvaluateEntity,
    Evaluation,
    IngestEvent,
    Ingestion,
    is_noisy,
    sharding_key,
)
from examples.ingestion.services import GONE_PROJECTS
from streamq import CompositeHooks, Hooks, JobRequest, Queue, RedisOutOfMemory, RedisUnavailable
from streamq.embedded import DEFAULT_PORT, ensure_embedded_redis

__all__ = ["FLAG_STALENESS_S", "Enqueued", "Plan", "plan", "produce", "serve_metrics"]

PROJECTS = [f"proj-{i:03d}" for i in range(40)]
FLAG_STALENESS_S = 0.25
"""How stale the ingestion producer's view of flagged projects may be."""


@dataclass
class Plan:
    """The jobs to enqueue, per queue."""

    ingestion: list[JobRequest[IngestEvent]] = field(default_factory=list)
    evaluation: list[JobRequest[EvaluateEntity]] = field(default_factory=list)
    deletion: list[tuple[str, DeleteEntities]] = field(default_factory=list)
    """(job id, payload): deletions carry an id, so enqueuing one twice runs it once."""
    late: list[JobRequest[IngestEvent]] = field(default_factory=list)
    """Events of the throttled project, enqueued after the first wave."""

    def __len__(self) -> int:
        return len(self.ingestion) + len(self.evaluation) + len(self.deletion) + len(self.late)


class Enqueued(Hooks):
    """Counts the jobs written to each lane, and those routed by a tenant flag."""

    def __init__(self) -> None:
        self.lanes: Counter[str] = Counter()
        self.routed = 0

    def enqueued(self, queue: str, shard: str, job_name: str, *, delayed: bool) -> None:
        self.lanes[queue] += 1

    def tenant_routed(self, queue: str, job_name: str) -> None:
        self.routed += 1


def _event(project: str, entity: str, event_id: str, kind: str) -> JobRequest[IngestEvent]:
    return JobRequest(
        Ingestion.ingest_event,
        IngestEvent(project_id=project, entity_id=entity, event_id=event_id, kind=kind,
                    attributes={"source": "demo"}, api_key=f"key-{project}"),
        sharding_key=sharding_key(project, entity),
    )


def plan(jobs: int, *, seed: int = 7) -> Plan:
    """``jobs`` jobs (at least 6), the same ones for the same ``jobs`` and ``seed``."""
    rng = random.Random(seed)
    out = Plan()
    gone = sorted(GONE_PROJECTS)[0]
    out.deletion = [
        (f"delete-{gone}-{n}", DeleteEntities(project_id=gone, entity_ids=["ent-001"]))
        for n in range(2 if jobs >= 100 else 1)
    ]
    # The throttled project's first event leads the first wave; a few more come late.
    throttled = sorted(THROTTLED_PROJECTS)[0]
    out.ingestion.append(_event(throttled, "ent-000", f"evt-{seed}-throttled-0", "update"))
    out.late = [_event(throttled, f"ent-{n:03d}", f"evt-{seed}-late-{n}", "update")
                for n in range(max(2, jobs // 100))]
    for i in range(jobs - len(out)):
        noisy = rng.random() < 0.25
        project = rng.choice(sorted(NOISY_PROJECTS)) if noisy else rng.choice(PROJECTS[2:])
        entity = f"ent-{rng.randrange(500):03d}"
        if i % 250 == 249:
            ids = [f"ent-{rng.randrange(500):03d}" for _ in range(rng.randint(5, 20))]
            out.deletion.append((f"delete-{project}-{i}", DeleteEntities(
                project_id=project, entity_ids=ids)))
        elif rng.random() < 0.25:
            key = sharding_key(project, entity)
            out.evaluation.append(JobRequest(
                Evaluation.evaluate_entity,
                EvaluateEntity(project_id=project, entity_id=entity),
                sharding_key=key,
            ))
        else:
            kind = rng.choice(("create", "update", "update", "delete"))
            out.ingestion.append(_event(project, entity, f"evt-{seed}-{i:07d}", kind))
    return out


async def produce(
    client: Any, the_plan: Plan, *, prefix: str, hooks: Hooks | None = None,
    before_late: Callable[[], Awaitable[None]] | None = None,
    wave_done: Callable[[int], None] | None = None,
) -> Enqueued:
    """Enqueue ``the_plan``: the first wave, then (after ``before_late``) the late events.

    ``hooks`` instrument the adds too (see :func:`serve_metrics`). ``wave_done(n)`` is told
    how many jobs are enqueued after each wave. Returns the counts: jobs per lane, and how
    many the throttled project's flag routed.
    """
    counts = Enqueued()
    both: Hooks = counts if hooks is None else CompositeHooks([counts, hooks])
    # The rule sends the known noisy projects aside; a flagged project goes aside too.
    ingestion = Queue(Ingestion, client, prefix=prefix, secondary_when=is_noisy, hooks=both,
                      tenant_flags_staleness=FLAG_STALENESS_S)
    evaluation = Queue(Evaluation, client, prefix=prefix, hooks=both)
    deletion = Queue(Deletion, client, prefix=prefix, hooks=both)
    # Bulk adds: one pipelined round trip per 500 jobs, each job on its key's shard.
    await ingestion.add_bulk(the_plan.ingestion)
    await evaluation.add_bulk(the_plan.evaluation)
    # One at a time, the way a service enqueues after a request, with a job id for dedup.
    for job_id, payload in the_plan.deletion:
        await deletion.for_key(payload.project_id).add(
            Deletion.delete_entities, payload, job_id=job_id
        )
    if wave_done is not None:
        wave_done(len(the_plan) - len(the_plan.late))
    if before_late is not None:
        await before_late()
    await ingestion.add_bulk(the_plan.late)
    if wave_done is not None:
        wave_done(len(the_plan))
    return counts


def serve_metrics(port: int, host: str = "0.0.0.0") -> tuple[Hooks, Any]:
    """Prometheus hooks for the producer's queues and an HTTP server for them on
    ``host:port`` (``/metrics``): ``(hooks, server)``; ``server.shutdown()`` stops it.

    Needs the ``metrics`` extra (prometheus-client).
    """
    import prometheus_client

    from streamq.metrics import PrometheusHooks

    hooks = PrometheusHooks()
    server, _ = prometheus_client.start_http_server(port, addr=host, registry=hooks.registry)
    return hooks, server


async def _batches(client: Any, ns: argparse.Namespace, hooks: Hooks | None,
                   stop: asyncio.Event) -> None:
    """One batch, or one every ``ns.every`` seconds until ``stop``."""
    seed = ns.seed
    while True:
        try:
            counts = await produce(client, plan(ns.jobs, seed=seed), prefix=ns.prefix,
                                   hooks=hooks)
            print(", ".join(f"{lane}: {n}" for lane, n in sorted(counts.lanes.items())),
                  flush=True)
        except (RedisUnavailable, RedisOutOfMemory) as exc:
            if ns.every <= 0:
                raise
            # A producer outlives a Redis outage; each refused write is counted.
            print(f"batch of seed {seed} not enqueued: {exc}", flush=True)
        seed += 1
        if ns.every <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ns.every)
        if stop.is_set():
            return


async def _main(ns: argparse.Namespace) -> None:
    url = os.environ.get("REDIS_URL") or ensure_embedded_redis(
        os.environ.get("STREAMQ_DATA_DIR", ".streamq"),
        port=int(os.environ.get("STREAMQ_EMBEDDED_PORT", DEFAULT_PORT)),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hooks, server = (None, None)
    if ns.metrics_port is not None:
        hooks, server = serve_metrics(ns.metrics_port, ns.metrics_host)
        print(f"metrics on http://{ns.metrics_host}:{ns.metrics_port}/metrics", flush=True)
    client = aioredis.Redis.from_url(url)
    try:
        await _batches(client, ns, hooks, stop)
        if server is not None:
            # Serve the final counts until stopped, so a scrape after the last batch sees them.
            await stop.wait()
    finally:
        await client.aclose()
        if server is not None:
            server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per batch")
    parser.add_argument("--seed", type=int, default=7, help="seed of the first batch")
    parser.add_argument("--prefix", default=os.environ.get("REDIS_PREFIX", "streamq"))
    parser.add_argument("--every", type=float, default=0.0, metavar="S",
                        help="enqueue a new batch every S seconds (default: one batch)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve /metrics on this port, until stopped")
    parser.add_argument("--metrics-host", default="0.0.0.0")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
