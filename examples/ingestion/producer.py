"""Enqueue a deterministic mix of jobs across the example's queues.

The mix: three quarters ingestion events (a quarter of them from the noisy projects, which
go to the secondary lane), a quarter evaluations, and a deletion every 250 jobs, plus two
deletions of a project that no longer exists (they fail permanently). The same ``--jobs``
and ``--seed`` always give the same jobs.

Run it on its own (``REDIS_URL`` unset: the embedded Redis of ``STREAMQ_DATA_DIR``)::

    python -m examples.ingestion.producer --jobs 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from examples.ingestion.contracts import (
    NOISY_PROJECTS,
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
from streamq import JobRequest, Queue
from streamq.embedded import DEFAULT_PORT, ensure_embedded_redis

__all__ = ["Plan", "plan", "produce"]

PROJECTS = [f"proj-{i:03d}" for i in range(40)]


@dataclass
class Plan:
    """The jobs to enqueue, per queue."""

    ingestion: list[JobRequest[IngestEvent]] = field(default_factory=list)
    evaluation: list[JobRequest[EvaluateEntity]] = field(default_factory=list)
    deletion: list[tuple[str, DeleteEntities]] = field(default_factory=list)
    """(job id, payload): deletions carry an id, so enqueuing one twice runs it once."""

    def lanes(self) -> Counter[str]:
        """How many jobs go to each lane."""
        counts: Counter[str] = Counter()
        for r in self.ingestion:
            noisy = getattr(r.payload, "project_id", None) in NOISY_PROJECTS
            counts["ingestion-secondary" if noisy else "ingestion"] += 1
        counts["evaluation"] += len(self.evaluation)
        counts["deletion"] += len(self.deletion)
        return counts

    def __len__(self) -> int:
        return len(self.ingestion) + len(self.evaluation) + len(self.deletion)


def plan(jobs: int, *, seed: int = 7) -> Plan:
    """``jobs`` jobs (at least 3), the same ones for the same ``jobs`` and ``seed``."""
    rng = random.Random(seed)
    out = Plan()
    gone = sorted(GONE_PROJECTS)[0]
    out.deletion = [
        (f"delete-{gone}-{n}", DeleteEntities(project_id=gone, entity_ids=["ent-001"]))
        for n in range(2 if jobs >= 100 else 1)
    ]
    for i in range(jobs - len(out.deletion)):
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
            out.ingestion.append(JobRequest(
                Ingestion.ingest_event,
                IngestEvent(
                    project_id=project,
                    entity_id=entity,
                    event_id=f"evt-{seed}-{i:07d}",
                    kind=rng.choice(("create", "update", "update", "delete")),
                    attributes={"source": "demo"},
                    api_key=f"key-{project}",
                ),
                sharding_key=sharding_key(project, entity),
            ))
    return out


async def produce(client: Any, the_plan: Plan, *, prefix: str) -> Counter[str]:
    """Enqueue ``the_plan``; returns how many jobs each lane received."""
    ingestion = Queue(Ingestion, client, prefix=prefix, secondary_when=is_noisy)
    evaluation = Queue(Evaluation, client, prefix=prefix)
    deletion = Queue(Deletion, client, prefix=prefix)
    # Bulk adds: one pipelined round trip per 500 jobs, each job on its key's shard.
    await ingestion.add_bulk(the_plan.ingestion)
    await evaluation.add_bulk(the_plan.evaluation)
    # One at a time, the way a service enqueues after a request, with a job id for dedup.
    for job_id, payload in the_plan.deletion:
        await deletion.for_key(payload.project_id).add(
            Deletion.delete_entities, payload, job_id=job_id
        )
    return the_plan.lanes()


async def _main(ns: argparse.Namespace) -> None:
    url = os.environ.get("REDIS_URL") or ensure_embedded_redis(
        os.environ.get("STREAMQ_DATA_DIR", ".streamq"),
        port=int(os.environ.get("STREAMQ_EMBEDDED_PORT", DEFAULT_PORT)),
    )
    client = aioredis.Redis.from_url(url)
    try:
        counts = await produce(client, plan(ns.jobs, seed=ns.seed), prefix=ns.prefix)
    finally:
        await client.aclose()
    print(", ".join(f"{lane}: {n}" for lane, n in sorted(counts.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prefix", default=os.environ.get("REDIS_PREFIX", "streamq"))
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
