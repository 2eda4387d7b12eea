"""No task dies silently: refusals are sorted into outages and permanent errors, outages are
logged once when they start and once when they end, and health fails at once on a refusal
retrying cannot fix."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ReadOnlyError, ResponseError

from streamq import Limiter, Queue, QueueContract, job
from streamq._redis import map_error, refusal_code
from streamq.app import App
from streamq.errors import RedisRefused, RedisUnavailable
from streamq.health import Monitor, RedisHealth
from streamq.job import Job
from streamq.runtime import WorkerManager
from streamq.runtime.supervise import RedisStatus
from tests.runtime.support import RecordingHooks, wait_until
from tests.support.redis_server import RedisServer, find_binary


class Unit(BaseModel):
    n: int


class Limited(QueueContract, name="rt-sup"):
    unit = job("unit", Unit)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: its config and ACLs are changed."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server")
    server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.stop(kill=True)


@pytest.mark.parametrize(
    ("exc", "code", "kind"),
    [
        (ReadOnlyError("You can't write against a read only replica."), "READONLY",
         RedisUnavailable),
        (ResponseError("NOREPLICAS Not enough good replicas to write. script: 1a2b, on "
                       "@user_script:12."), "NOREPLICAS", RedisUnavailable),
        (ResponseError("ERR Error running script (call to f_1): @user_script:9: "
                       "@user_script: 9: -NOREPLICAS Not enough good replicas to write."),
         "NOREPLICAS", RedisUnavailable),
        (ResponseError("BUSY Redis is busy running a script."), "BUSY", RedisUnavailable),
        (ResponseError("MASTERDOWN Link with MASTER is down"), "MASTERDOWN", RedisUnavailable),
        (NoPermissionError("this user has no permissions to run the 'evalsha' command"),
         "NOPERM", RedisRefused),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
         "WRONGTYPE", RedisRefused),
    ],
)
def test_refusals_are_sorted_into_outages_and_permanent_errors(
    exc: Exception, code: str, kind: type[Exception]
) -> None:
    assert refusal_code(exc) == code
    assert isinstance(map_error(exc, queue="q"), kind)


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    hooks = RecordingHooks()
    status = RedisStatus(hooks, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="streamq.worker"):
        for _ in range(5):
            status.error("q", RedisConnectionError("refused"), task="reader")
            now[0] += 1
        status.ok()
        status.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Redis outage: calls are failing; the worker retries with backoff",
                     "Redis outage ended"]
    assert caplog.records[1].duration_s == 5.0  # type: ignore[attr-defined]
    assert hooks.counts["redis_error"] == 5
    assert status.outages == 1


async def test_write_refusals_in_the_limiter_call_are_an_outage_and_the_worker_recovers(
    own_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = aioredis.Redis(port=own_redis.port)
    app = App([Limited])
    ran: list[int] = []

    @app.processor(Limited, concurrency=2, limiter=Limiter(1000, 1.0), block_timeout=0.1,
                   lock_duration=2)
    async def proc(job: Job[Unit]) -> None:
        ran.append(job.payload.n)

    hooks = RecordingHooks()
    m = WorkerManager(redis_url=own_redis.url, prefix=prefix, hooks=hooks)
    m.register_app(app)
    q = Queue(Limited, r, prefix=prefix)
    try:
        await m.start()
        await q.add(Limited.unit, Unit(n=0))
        await wait_until(lambda: ran == [0], what="the first job")
        with caplog.at_level(logging.WARNING, logger="streamq.worker"):
            # No replica: every write (the limiter script, the read, the settle) is refused.
            await r.config_set("min-replicas-to-write", 1)
            await r.config_set("min-replicas-max-lag", 10)
            await wait_until(lambda: hooks.counts["redis_error"] >= 3, what="refusals counted")
            await asyncio.sleep(0.3)
            await r.config_set("min-replicas-to-write", 0)
            for n in range(1, 6):
                await q.add(Limited.unit, Unit(n=n))
            await wait_until(lambda: sorted(ran) == list(range(6)), timeout_s=20,
                             what="jobs after the refusals ended")
            await m.run_until_idle(10)
        messages = [rec.getMessage() for rec in caplog.records]
        assert "Redis outage: calls are failing; the worker retries with backoff" in messages
        assert "Redis outage ended" in messages
        assert not [k for k in hooks.counts if k.startswith("crashed:")], hooks.counts
        w = m.get_worker("rt-sup")
        assert w is not None
        assert all(not t.done() for t in w.supervisor.tasks.values())
    finally:
        await m.close_workers(timeout_s=1)
        await r.aclose()


async def test_a_permanent_refusal_fails_health_at_once_and_says_what_to_fix(
    own_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = aioredis.Redis(port=own_redis.port)
    # A user that may read and write keys but not run scripts.
    await admin.execute_command(
        "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-evalsha", "-eval",
        "-script",
    )
    url = f"redis://noscripts:pw@127.0.0.1:{own_redis.port}/0"
    app = App([Limited])

    @app.processor(Limited, block_timeout=0.1, promote_interval=0.05)
    async def proc(job: Job[Unit]) -> None: ...

    health = RedisHealth()
    # The start-up check would refuse this user at once: skip it to see the runtime path.
    m = WorkerManager(redis_url=url, prefix=prefix, hooks=health, check_permissions=False)
    m.register_app(app)
    try:
        with caplog.at_level(logging.ERROR, logger="streamq.worker"):
            await m.start()
            mon = Monitor(m, health, health, interval_s=1, redis_timeout_s=30,
                          wedge_timeout_s=60)
            await wait_until(lambda: m.redis_status.refusal is not None,
                             what="the refusal noticed")
            ok, detail = mon.liveness()
        assert not ok
        assert any("NOPERM" in p for p in detail["problems"]), detail
        errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
        assert any("grant" in rec.getMessage() for rec in errors)
    finally:
        await m.close_workers(timeout_s=1)
        await admin.aclose()


