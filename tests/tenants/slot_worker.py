"""``python -m tests.tenants.slot_worker URL PREFIX``: a real worker process whose jobs run
until it is killed; it prints ``started <n>`` when a job starts."""

from __future__ import annotations

import asyncio
import sys

from streamq import App, Job, WorkerManager
from tests.tenants.contracts import Tenanted, Work

LOCK_S = 1.0

app = App([Tenanted])


@app.processor(Tenanted, concurrency=2, tenant_concurrency=1, lock_duration=LOCK_S,
               tenant_wait=0.05)
async def work(job: Job[Work]) -> None:
    print(f"started {job.payload.n}", flush=True)
    await asyncio.sleep(3600)


async def main(url: str, prefix: str) -> None:
    manager = WorkerManager(redis_url=url, prefix=prefix, consumer_name="doomed")
    manager.register_app(app)
    await manager.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
