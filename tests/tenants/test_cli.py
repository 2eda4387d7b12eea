"""``streamq tenant flag|unflag|list``, run as a subprocess against real Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis

from streamq import QueueAdmin
from tests.tenants.contracts import Tenanted

ROOT = Path(__file__).resolve().parents[2]


def streamq(*args: str, url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "streamq", "--redis-url", url, "--prefix", prefix,
         "--contracts", "tests.tenants.contracts:CONTRACTS", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )


async def test_tenant_commands_flag_list_and_unflag(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    flagged = streamq("tenant", "flag", "tn", "project-7", "--for", "10m", "--reason",
                      "upstream 429s", url=redis_url, prefix=prefix)
    assert flagged.returncode == 0, flagged.stderr
    assert "flagged tenant 'project-7' of tn until" in flagged.stdout
    assert "UTC (for 10m)" in flagged.stdout
    flags = await QueueAdmin(aredis, Tenanted, prefix=prefix).flagged_tenants()
    assert [(f.tenant, f.reason, f.by) for f in flags] == [("project-7", "upstream 429s", "cli")]

    listed = streamq("tenant", "list", "tn-secondary", url=redis_url, prefix=prefix)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["TENANT", "EXPIRES", "FLAGGED", "BY", "REASON"]
    assert re.match(r"project-7 +in (9m\d+s|10m) +\d+(ms|s) ago +cli +upstream 429s$",
                    lines[1].rstrip()), lines[1]
    as_json = json.loads(streamq("tenant", "list", "tn", "--json", url=redis_url,
                                 prefix=prefix).stdout)
    assert as_json[0]["tenant"] == "project-7"
    assert as_json[0]["expires_at_ms"] == flags[0].expires_at_ms

    gone = streamq("tenant", "unflag", "tn", "project-7", "--json", url=redis_url,
                   prefix=prefix)
    assert json.loads(gone.stdout) == {"queue": "tn", "tenant": "project-7", "unflagged": True}
    streamq("tenant", "flag", "tn", "project-7", "--for", "1m", url=redis_url, prefix=prefix)
    gone = streamq("tenant", "unflag", "tn", "project-7", url=redis_url, prefix=prefix)
    assert gone.stdout.strip() == "unflagged tenant 'project-7' of tn"
    again = streamq("tenant", "unflag", "tn", "project-7", url=redis_url, prefix=prefix)
    assert again.stdout.strip() == "tenant 'project-7' of tn was not flagged"
    empty = streamq("tenant", "list", "tn", url=redis_url, prefix=prefix)
    assert empty.stdout.strip() == "no flagged tenants in tn"


def test_tenant_flag_on_a_queue_that_cannot_route_exits_2_naming_it(
    redis_url: str, prefix: str
) -> None:
    p = streamq("tenant", "flag", "tn-nolane", "x", "--for", "1m", url=redis_url,
                prefix=prefix)
    assert p.returncode == 2
    assert "queue 'tn-nolane' cannot flag tenants" in p.stderr
    bad = streamq("tenant", "flag", "tn", "x", "--for", "soon", url=redis_url, prefix=prefix)
    assert bad.returncode == 2
    assert "invalid duration" in bad.stderr
