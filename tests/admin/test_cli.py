"""The ``streamq`` admin command, run as a subprocess against real Redis."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis

from streamq import DeadLetters
from streamq.keys import QueueKeys
from tests.admin.contracts import Adm
from tests.admin.test_admin import build_state
from tests.admin.test_deadletters import lost_payload, raw_dead, shard_keys

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = "tests.admin.contracts:CONTRACTS"
# The installed console script, not python -m: it proves the command finds the modules of
# the directory it runs in, which a console script does not have on its path by itself.
STREAMQ = str(Path(sys.executable).parent / "streamq")
_OURS = ("REDIS_", "STREAMQ_", "WORKER_", "QUEUE_")


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    full_env.update(env or {})
    return full_env


def streamq(
    *args: str,
    url: str | None,
    prefix: str = "p",
    env: dict[str, str] | None = None,
    contracts: str | None = CONTRACTS,
    before: bool = True,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.CompletedProcess[str]:
    """Run ``streamq`` with the global options ``before`` the subcommand, or after it."""
    options = [] if url is None else ["--redis-url", url]
    options += ["--prefix", prefix]
    if contracts is not None:
        options += ["--contracts", contracts]
    argv = [*options, *args] if before else [*args, *options]
    return subprocess.run(
        [STREAMQ, *argv], cwd=ROOT, env=cli_env(env), stdin=stdin, capture_output=True,
        text=True, timeout=60,
    )


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


async def test_depth_prints_a_row_per_shard_with_exact_counts(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await build_state(aredis, prefix)
    out = ok(streamq("depth", "adm", url=redis_url, prefix=prefix))
    assert rows(out) == [
        ["QUEUE", "SHARD", "READY", "IN-FLIGHT", "DELAYED", "DEAD"],
        ["adm", "adm", "3", "2", "2", "1"],
        ["adm", "adm-1", "1", "0", "1", "0"],
        ["adm", "total", "4", "2", "3", "1"],
    ]
    every = rows(ok(streamq("depth", url=redis_url, prefix=prefix)))
    assert ["solo", "solo", "0", "0", "0", "0"] in every
    data = json.loads(ok(streamq("depth", "adm", "--json", url=redis_url, prefix=prefix)))
    assert data[0]["ready"] == 4
    assert data[0]["paused"] is False
    assert data[0]["shards"][0] == {
        "shard": "adm",
        "ready": 3,
        "in_flight": 2,
        "delayed": 2,
        "dead": 1,
    }


async def test_dead_list_shows_newest_first_and_json_has_redacted_payloads(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    first = await raw_dead(aredis, shard_keys(prefix, index=1), "job-a", reason="error")
    second = await raw_dead(aredis, shard_keys(prefix, index=0), "job-b")
    await lost_payload(aredis, shard_keys(prefix, index=0))

    out = ok(streamq("dead", "list", "adm", url=redis_url, prefix=prefix))
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["REF", "FAILED"]
    assert f"adm/{second}" in lines[2]
    assert "job-b" in lines[2]
    assert "permanent" in lines[2]
    assert f"adm-1/{first}" in lines[3]
    assert "PermanentError: gone" in lines[3]
    assert "lost_payload" in lines[1]

    data = json.loads(
        ok(streamq("dead", "list", "adm", "--json", "--limit", "2", url=redis_url, prefix=prefix))
    )
    assert [d["job_id"] for d in data] == [None, "job-b"]
    assert data[1]["payload"] == {"n": 1, "token": "***"}
    assert data[1]["ref"] == f"adm/{second}"
    only = json.loads(
        ok(
            streamq(
                "dead", "list", "adm", "--reason", "error", "--json", url=redis_url, prefix=prefix
            )
        )
    )
    assert [d["job_id"] for d in only] == ["job-a"]
    empty = ok(streamq("dead", "list", "solo", url=redis_url, prefix=prefix))
    assert empty.strip() == "no dead letters in solo"

    counts = json.loads(
        ok(streamq("dead", "count", "adm", "--by-reason", "--json", url=redis_url, prefix=prefix))
    )
    assert counts == {"error": 1, "permanent": 1, "lost_payload": 1}
    assert ok(streamq("dead", "count", "adm", url=redis_url, prefix=prefix)).strip() == "3"


async def test_dead_retry_by_id_once_and_all(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    a = await raw_dead(aredis, s0, "job-a")
    await raw_dead(aredis, s1, "job-b")
    await raw_dead(aredis, s1, "job-c")

    out = ok(streamq("dead", "retry", "adm", f"adm/{a}", url=redis_url, prefix=prefix))
    assert "re-enqueued 1 job(s)" in out
    again = streamq("dead", "retry", "adm", f"adm/{a}", url=redis_url, prefix=prefix)
    assert again.returncode == 0
    assert "re-enqueued 0 job(s)" in again.stdout
    assert "not found" in again.stderr
    assert await aredis.xlen(s0.stream) == 1

    out = ok(streamq("dead", "retry", "adm", "--all", "--yes", url=redis_url, prefix=prefix))
    assert "re-enqueued 2 job(s)" in out
    assert await aredis.xlen(s1.stream) == 2
    assert await DeadLetters(aredis, Adm, prefix=prefix).count() == 0


async def test_dead_purge_by_id_older_than_and_all(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    s0 = shard_keys(prefix, index=0)
    ids = [await raw_dead(aredis, s0, f"job-{i}") for i in range(4)]

    out = ok(streamq("dead", "purge", "adm", f"adm/{ids[0]}", "-y", url=redis_url,
                     prefix=prefix))
    assert "deleted 1 dead letter(s)" in out
    out = ok(streamq("dead", "purge", "adm", "--older-than", "1h", "--yes", url=redis_url,
                     prefix=prefix))
    assert "deleted 0 dead letter(s)" in out
    out = ok(streamq("dead", "purge", "adm", "--all", "--yes", url=redis_url, prefix=prefix))
    assert "deleted 3 dead letter(s)" in out
    assert await aredis.xlen(s0.dead) == 0


async def test_pause_and_resume_set_the_flag_workers_read(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    meta = QueueKeys(prefix, "adm", 2).meta
    out = ok(streamq("pause", "adm", url=redis_url, prefix=prefix))
    assert "paused adm" in out
    assert await aredis.hget(meta, "paused") == b"1"
    assert "adm is paused" in ok(streamq("depth", url=redis_url, prefix=prefix))
    out = ok(streamq("resume", "adm", url=redis_url, prefix=prefix))
    assert "resumed adm" in out
    assert await aredis.hget(meta, "paused") is None


def test_redis_url_comes_from_the_environment_when_not_given(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    p = streamq("depth", "solo", url=None, prefix=prefix, env={"REDIS_URL": redis_url})
    assert rows(ok(p))[1] == ["solo", "solo", "0", "0", "0", "0"]
    missing = streamq("depth", url=None, prefix=prefix,
                      env={"STREAMQ_DATA_DIR": str(tmp_path / "none")})
    assert missing.returncode == 2
    assert "REDIS_URL" in missing.stderr
    assert "no embedded Redis is running" in missing.stderr


def test_unknown_queue_and_bad_arguments_exit_2_with_a_clear_message(
    redis_url: str, prefix: str
) -> None:
    p = streamq("depth", "nope", url=redis_url, prefix=prefix)
    assert p.returncode == 2
    assert "unknown queue 'nope'" in p.stderr
    assert "adm" in p.stderr
    for args, needle in [
        (["dead", "retry", "adm"], "--all or dead letter ids"),
        (["dead", "retry", "adm", "adm/1-0", "--all"], "--all or dead letter ids"),
        (["dead", "retry", "adm", "1-0"], "<shard>/<id>"),
        (["dead", "purge", "adm"], "exactly one of"),
        (["dead", "purge", "adm", "--all"], "stdin is not a terminal; pass --yes"),
        (["dead", "purge", "adm", "--older-than", "soon"], "invalid duration"),
        (["dead", "list", "adm", "--limit", "0"], "expected an integer >= 1"),
        (["dead", "list", "adm", "--shard", "adm-9"], "no shard 'adm-9'"),
        (["frobnicate"], "invalid choice"),
    ]:
        p = streamq(*args, url=redis_url, prefix=prefix)
        assert p.returncode == 2, (args, p.stderr)
        assert needle in p.stderr, (args, p.stderr)
    bad = streamq("depth", url=redis_url, contracts="no.such:X")
    assert bad.returncode == 2
    assert "--contracts: cannot import 'no.such'" in bad.stderr


def test_unreachable_redis_exits_1_naming_the_url_without_its_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    p = streamq("depth", url=url)
    assert p.returncode == 1
    assert f"redis://:***@127.0.0.1:{port}/0" in p.stderr
    assert "hunter2" not in p.stderr
