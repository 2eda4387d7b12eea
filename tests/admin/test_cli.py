"""The ``streamq`` admin command, run as a subprocess against real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from streamq import DeadLetters, Queue, QueueAdmin, SyncQueue
from streamq._cli_support import format_duration
from streamq.keys import QueueKeys
from tests.admin.contracts import Adm, Task, running_worker, wait_for
from tests.admin.test_admin import build_state
from tests.admin.test_deadletters import lost_payload, raw_dead, shard_keys
from tests.entrypoint.helpers import WorkerProcess
from tests.entrypoint.helpers import wait_for as wait_until
from tests.entrypoint.sample_app import Note, Notes

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
    header, *table = rows(out)
    assert header == ["QUEUE", "SHARD", "READY", "IN-FLIGHT", "DELAYED", "DEAD", "OLDEST", "READY"]
    assert [r[:6] for r in table] == [
        ["adm", "adm", "3", "2", "2", "1"],
        ["adm", "adm-1", "1", "0", "1", "0"],
        ["adm", "total", "4", "2", "3", "1"],
    ]
    # How long the oldest ready job has waited, as a duration.
    assert all(re.fullmatch(r"\d+(ms|s|m)(\d+s)?", r[6]) for r in table), table
    every = rows(ok(streamq("depth", url=redis_url, prefix=prefix)))
    assert ["solo", "solo", "0", "0", "0", "0", "-"] in every
    data = json.loads(ok(streamq("depth", "adm", "--json", url=redis_url, prefix=prefix)))
    assert data[0]["ready"] == 4
    assert data[0]["paused"] is False
    shard = data[0]["shards"][0]
    assert {k: shard[k] for k in ("shard", "ready", "in_flight", "delayed", "dead")} == {
        "shard": "adm",
        "ready": 3,
        "in_flight": 2,
        "delayed": 2,
        "dead": 1,
    }
    assert shard["oldest_ready_age_s"] >= 0


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
    assert rows(ok(p))[1] == ["solo", "solo", "0", "0", "0", "0", "-"]
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


# -- finding things: options after the subcommand, contracts, the embedded Redis -------------


async def test_global_options_work_after_the_subcommand_too(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await build_state(aredis, prefix)
    after = streamq("depth", "adm", "--json", url=redis_url, prefix=prefix, before=False)
    assert json.loads(ok(after))[0]["ready"] == 4
    nested = streamq("dead", "count", "adm", url=redis_url, prefix=prefix, before=False)
    assert ok(nested).strip() == "1"


def test_contracts_come_from_streamq_contracts_else_from_the_worker_app(
    redis_url: str, prefix: str
) -> None:
    from_env = streamq("depth", url=redis_url, prefix=prefix, contracts=None,
                       env={"STREAMQ_CONTRACTS": CONTRACTS})
    assert ["solo", "solo", "0", "0", "0", "0", "-"] in rows(ok(from_env))
    # WORKER_APP names the App that python -m worker runs; its contracts are the app's.
    from_app = streamq("depth", url=redis_url, prefix=prefix, contracts=None,
                       env={"WORKER_APP": "tests.entrypoint.sample_app:app"})
    queues = {r[0] for r in rows(ok(from_app))[1:]}
    assert queues == {"notes", "notes-secondary", "chores"}
    # --contracts wins over both.
    given = streamq("depth", url=redis_url, prefix=prefix,
                    env={"WORKER_APP": "tests.entrypoint.sample_app:app"})
    assert "solo" in ok(given)
    none = streamq("depth", url=redis_url, prefix=prefix, contracts=None)
    assert none.returncode == 2
    assert "STREAMQ_CONTRACTS" in none.stderr
    assert "WORKER_APP" in none.stderr
    wrong = streamq("depth", url=redis_url, prefix=prefix, contracts=None,
                    env={"WORKER_APP": "tests.entrypoint.sample_app:missing"})
    assert wrong.returncode == 2
    assert "WORKER_APP: module 'tests.entrypoint.sample_app' has no attribute" in wrong.stderr


def test_the_embedded_redis_is_found_when_redis_url_is_unset(
    tmp_path: Path, prefix: str
) -> None:
    from streamq import embedded
    from streamq.testing import free_port

    if embedded.find_redis_server() is None:
        pytest.skip("no redis-server (install redis-server or the 'embedded' extra)")
    data_dir = tmp_path / "data"
    server = embedded.ensure(data_dir, port=free_port())
    try:
        env = {"STREAMQ_DATA_DIR": str(data_dir),
               "STREAMQ_EMBEDDED_PORT": str(server.port)}
        p = streamq("pause", "solo", "--json", url=None, prefix=prefix, env=env)
        assert json.loads(ok(p)) == {"queue": "solo", "paused": True}
        assert f"using the embedded Redis at {server.url}" in p.stderr
        with redis.Redis(port=server.port) as client:
            assert client.hget(QueueKeys(prefix, "solo", 1).meta, "paused") == b"1"
    finally:
        server.stop()


def test_version_prints_the_package_version() -> None:
    import streamq as package

    p = subprocess.run([STREAMQ, "--version"], capture_output=True, text=True, timeout=60,
                       env=cli_env())
    assert p.returncode == 0
    assert p.stdout.strip() == f"streamq {package.__version__}"


# -- output: --json everywhere, human durations, --watch -------------------------------------


async def test_every_command_answers_in_json(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    s0 = shard_keys(prefix, index=0)
    a = await raw_dead(aredis, s0, "job-a")
    await raw_dead(aredis, s0, "job-b")
    await raw_dead(aredis, s0, "job-c")

    def j(*args: str) -> object:
        return json.loads(ok(streamq(*args, "--json", url=redis_url, prefix=prefix)))

    assert j("pause", "adm") == {"queue": "adm", "paused": True}
    assert j("resume", "adm") == {"queue": "adm", "paused": False}
    assert j("dead", "count", "adm") == 3
    assert j("dead", "retry", "adm", f"adm/{a}", "adm/1-0") == {
        "queue": "adm", "retried": 1, "not_found": 1
    }
    assert j("dead", "purge", "adm", "--older-than", "1h", "--yes") == {
        "queue": "adm", "deleted": 0
    }
    assert j("dead", "retry", "adm", "--all", "--yes") == {
        "queue": "adm", "retried": 2, "not_found": 0
    }
    assert [c["name"] for c in j("consumers", "adm")] == ["c1"]  # type: ignore[attr-defined]
    assert [d["queue"] for d in j("depth")] == ["adm", "solo"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (850, "850ms"),
        (42_000, "42s"),
        (192_000, "3m12s"),
        (180_000, "3m"),
        (7_200_000, "2h"),
        (7_260_000, "2h1m"),
        (100_800_000, "1d4h"),
        (1_814_400_000, "3w"),
        (-5, "0ms"),
    ],
)
def test_durations_read_like_people_write_them(ms: int, text: str) -> None:
    assert format_duration(ms) == text


async def test_dead_letters_and_consumers_show_ages_not_timestamps(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await raw_dead(aredis, shard_keys(prefix, index=0), "job-a")
    out = ok(streamq("dead", "list", "adm", url=redis_url, prefix=prefix))
    assert re.search(r"\b\d+(ms|s) ago\b", out), out
    gate = asyncio.Event()
    async with running_worker(redis_url, prefix, Adm, gate=gate) as h:
        await Queue(Adm, aredis, prefix=prefix).add(Adm.task, Task(n=1))
        await wait_for(lambda: _true(len(h.started) == 1), timeout_s=20, what="the job")
        admin = QueueAdmin(aredis, Adm, prefix=prefix)
        await wait_for(lambda: _heartbeat(admin), timeout_s=20, what="a heartbeat")
        listing = ok(await asyncio.to_thread(
            streamq, "consumers", "adm", url=redis_url, prefix=prefix
        ))
        gate.set()
    header, *table = rows(listing)
    row = next(r for r in table if r[0] == h.manager.consumer)
    assert header == ["CONSUMER", "PENDING", "IDLE", "HEARTBEAT"]
    assert row[1] == "1"
    assert re.fullmatch(r"\d+(ms|s)", row[2]), row
    assert re.fullmatch(r"\d+(ms|s)", row[3]), row
    assert row[4] == "ago", row


def test_depth_watch_redraws_until_ctrl_c(redis_url: str, prefix: str) -> None:
    proc = subprocess.Popen(
        [STREAMQ, "depth", "solo", "--watch", "--interval", "200ms", "--json",
         "--redis-url", redis_url, "--prefix", prefix, "--contracts", CONTRACTS],
        cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        readings = [json.loads(proc.stdout.readline()) for _ in range(3)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert [r["queues"][0]["queue"] for r in readings] == ["solo"] * 3
    stamps = [r["at_ms"] for r in readings]
    assert stamps == sorted(stamps)
    assert stamps[-1] - stamps[0] >= 300  # fresh readings an interval apart, not one thrice
    assert "Traceback" not in err


# -- destructive actions ask first -----------------------------------------------------------


async def test_purge_asks_on_a_terminal_and_does_nothing_unless_told_yes(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    s0 = shard_keys(prefix, index=0)
    for i in range(3):
        await raw_dead(aredis, s0, f"job-{i}")

    def on_a_terminal(answer: str) -> subprocess.CompletedProcess[str]:
        primary, secondary = pty.openpty()
        try:
            os.write(primary, answer.encode() + b"\n")
            return streamq("dead", "purge", "adm", "--all", url=redis_url, prefix=prefix,
                           stdin=secondary)
        finally:
            os.close(primary)
            os.close(secondary)

    declined = on_a_terminal("n")
    assert declined.returncode == 0, declined.stderr
    assert "Delete all 3 dead letter(s) of adm? [y/N]" in declined.stderr
    assert declined.stdout.strip() == "nothing done"
    assert await aredis.xlen(s0.dead) == 3

    refused = streamq("dead", "purge", "adm", "--all", url=redis_url, prefix=prefix)
    assert refused.returncode == 2
    assert "refusing to delete all 3 dead letter(s) of adm without confirmation" in (
        refused.stderr
    )
    assert await aredis.xlen(s0.dead) == 3

    agreed = on_a_terminal("y")
    assert "deleted 3 dead letter(s)" in ok(agreed)
    assert await aredis.xlen(s0.dead) == 0


async def test_retry_all_asks_first_but_retry_by_id_does_not(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    s0 = shard_keys(prefix, index=0)
    a = await raw_dead(aredis, s0, "job-a")
    await raw_dead(aredis, s0, "job-b")
    refused = streamq("dead", "retry", "adm", "--all", url=redis_url, prefix=prefix)
    assert refused.returncode == 2
    assert "refusing to re-enqueue all 2 dead letter(s) of adm" in refused.stderr
    assert await aredis.xlen(s0.stream) == 0
    assert "re-enqueued 1 job(s)" in ok(
        streamq("dead", "retry", "adm", f"adm/{a}", url=redis_url, prefix=prefix)
    )


# -- streamq worker --------------------------------------------------------------------------


def test_streamq_worker_is_python_m_worker(redis_url: str, prefix: str, tmp_path: Path) -> None:
    env = cli_env({"WORKER_APP": "tests.entrypoint.sample_app:app", "REDIS_URL": redis_url,
                   "REDIS_PREFIX": prefix, "QUEUE_CONSUMER_NOTES_IS_ENABLED": "true",
                   "LOG_FORMAT": "json"})
    usage = subprocess.run([STREAMQ, "worker", "--help"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0
    assert "WORKER_APP" in usage.stdout
    bad = subprocess.run([STREAMQ, "worker"], env={**env, "WORKER_APP": "nope"}, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "WORKER_APP: expected package.module:attribute, got 'nope'" in bad.stderr
    options = subprocess.run([STREAMQ, "--redis-url", redis_url, "worker"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert options.returncode == 2
    assert "streamq worker takes no options" in options.stderr

    worker = WorkerProcess(env, tmp_path / "worker.log", command=[STREAMQ, "worker"])
    try:
        worker.wait_consuming(timeout_s=60)
        SyncQueue(Notes, redis.Redis.from_url(redis_url), prefix=prefix).add(
            Notes.note, Note(n=1)
        )
        wait_until(lambda: _completed(redis_url, prefix), 30, "the note to be processed")
        assert worker.terminate() == 0
    finally:
        worker.kill()
    assert worker.logged("stopped")


async def _true(value: bool) -> bool:
    return value


async def _heartbeat(admin: QueueAdmin) -> bool:
    return any(c.last_heartbeat_ms is not None for c in await admin.consumers())


def _completed(url: str, prefix: str) -> bool:
    with redis.Redis.from_url(url) as client:
        shards = QueueKeys(prefix, "notes", 2).shards
        return sum(client.xlen(s.stream) for s in shards) == 0  # completed: XACK + XDEL


def test_compat_and_the_embedded_redis_are_subcommands_of_the_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamq.cli import main

    assert main(["compat", "snapshot", "tests.admin.contracts:CONTRACTS"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["queues"]
    (tmp_path / "old.json").write_text(json.dumps(snap))
    assert main(["compat", "check", str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 0
    capsys.readouterr()
    assert main(["redis", "status", "--data-dir", str(tmp_path / "none")]) == 1
    assert "not running" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "compat" in out
    assert "redis" in out


def test_schedules_are_listed_paused_and_resumed_from_the_app(
    redis_url: str, prefix: str, sredis: redis.Redis
) -> None:
    app = "tests.admin.contracts:SCHEDULED_APP"
    listed = json.loads(ok(streamq("schedules", "list", "--json", url=redis_url, prefix=prefix,
                                   contracts=app)))
    by_name = {s["name"]: s for s in listed}
    assert set(by_name) == {"nightly", "heartbeat"}
    assert by_name["nightly"]["cron"] == "0 3 * * *"
    assert by_name["nightly"]["paused"] is False
    assert by_name["nightly"]["next_run"] is not None
    ok(streamq("schedules", "pause", "nightly", url=redis_url, prefix=prefix, contracts=app))
    out = ok(streamq("schedules", "list", url=redis_url, prefix=prefix, contracts=app))
    nightly = next(line for line in out.splitlines() if line.startswith("nightly"))
    assert "cron 0 3 * * * (UTC)" in nightly
    assert " yes " in nightly  # paused
    ok(streamq("schedules", "resume", "nightly", url=redis_url, prefix=prefix, contracts=app))
    again = json.loads(ok(streamq("schedules", "list", "--json", url=redis_url, prefix=prefix,
                                  contracts=app)))
    assert {s["name"]: s["paused"] for s in again} == {"nightly": False, "heartbeat": False}
    unknown = streamq("schedules", "pause", "nope", url=redis_url, prefix=prefix, contracts=app)
    assert unknown.returncode == 2
    assert "nightly" in unknown.stderr  # the message lists the declared schedules
    no_app = streamq("schedules", "list", url=redis_url, prefix=prefix)
    assert no_app.returncode == 2
    assert "WORKER_APP" in no_app.stderr
