"""Job status and cancel through ``QueueAdmin`` and the ``streamq job`` command (run as a
subprocess against real Redis)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from streamq import Queue, QueueAdmin, SyncQueueAdmin
from tests.jobcontrol.support import Ctl, Item

ROOT = Path(__file__).resolve().parents[2]


def streamq(*args: str, url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "streamq", "--redis-url", url, "--prefix", prefix,
         "--contracts", "tests.jobcontrol.support:Ctl", *args],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60,
    )


async def test_queue_admin_reads_and_cancels_a_tracked_job(aredis, prefix):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.tracked, Item(n=1), sharding_key="k", delay=timedelta(minutes=1))
    admin = QueueAdmin(aredis, Ctl, prefix=prefix)

    assert (await admin.status(job_id)).state == "delayed"
    assert (await admin.status(job_id, sharding_key="k")).state == "delayed"
    assert (await admin.cancel(job_id, sharding_key="k")).outcome == "removed"
    assert (await admin.status(job_id)).state == "unknown"


def test_sync_queue_admin_reads_a_waiting_job(sredis, prefix):
    from streamq import SyncQueue

    job_id = SyncQueue(Ctl, sredis, prefix=prefix).add(Ctl.summed, Item(n=1))
    st = SyncQueueAdmin(sredis, Ctl, prefix=prefix).status(job_id)
    assert (st.state, st.job, st.keep_ms) == ("waiting", "summed", 300_000)


async def test_streamq_job_prints_the_status_and_cancels_with_json(aredis, prefix, redis_url):
    q = Queue(Ctl, aredis, prefix=prefix)
    job_id = await q.add(Ctl.summed, Item(n=1), delay=timedelta(minutes=1))

    p = streamq("job", job_id, "--queue", "jc", url=redis_url, prefix=prefix)
    assert p.returncode == 0, p.stderr
    assert f"job {job_id}" in p.stdout
    assert any(line.split()[:2] == ["state", "delayed"] for line in p.stdout.splitlines())

    p = streamq("job", job_id, "--queue", "jc", "--json", url=redis_url, prefix=prefix)
    data = json.loads(p.stdout)
    p = streamq("job", job_id, "--queue", "jc", url=redis_url, prefix=prefix)
    assert (data["state"], data["job"], data["queue"], data["result"]) == (
        "delayed", "summed", "jc", None
    )

    # Moments read as durations from now: due in about a minute.
    assert re.search(r"^due_ms +in (\d+s|1m)$", p.stdout, re.M), p.stdout

    refused = streamq("job", job_id, "--queue", "jc", "--cancel", url=redis_url, prefix=prefix)
    assert refused.returncode == 2
    assert f"refusing to cancel job {job_id} of jc without confirmation" in refused.stderr

    p = streamq("job", job_id, "--queue", "jc", "--cancel", "--json", "--yes", url=redis_url,
                prefix=prefix)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outcome"] == "removed"
    data = json.loads(streamq("job", job_id, "--queue", "jc", "--json", url=redis_url,
                              prefix=prefix).stdout)
    assert (data["state"], data["reason"]) == ("cancelled", "cancelled")


def test_streamq_job_of_an_unknown_id_exits_3(redis_url, prefix):
    p = streamq("job", "nope", "--queue", "jc", url=redis_url, prefix=prefix)
    assert p.returncode == 3
    assert "unknown" in p.stdout
    p = streamq("job", "nope", "--queue", "nowhere", url=redis_url, prefix=prefix)
    assert p.returncode == 2
    assert "nowhere" in p.stderr
