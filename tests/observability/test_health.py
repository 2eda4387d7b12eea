"""/healthz and /readyz: a wedged consumer and an unreachable Redis fail liveness, and both
pass again once the worker recovers; depth gauges show the backlog behind the wedge."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from streamq import Hooks, Queue
from streamq.keys import QueueKeys
from streamq.metrics import PrometheusHooks
from streamq.observe import ObservabilityConfig, build_hooks
from tests.observability.conftest import RunWorker
from tests.observability.support import (
    Behaviour,
    Obs,
    Work,
    http_get,
    make_app,
    scrape,
    total,
    wait_for,
)
from tests.support.redis_server import RedisServer, find_binary


async def health(port: int, path: str = "/healthz") -> tuple[int, dict[str, object]]:
    status, headers, body = await http_get(port, path)
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


async def test_liveness_fails_while_every_slot_is_blocked_with_jobs_ready_and_recovers(
    run_worker: RunWorker, aredis: aioredis.Redis, prefix: str
) -> None:
    hooks = PrometheusHooks()
    state = Behaviour()
    _manager, server = await run_worker(
        make_app(state, concurrency=1), hooks, liveness_wedge_timeout_s=0.5
    )
    port = server.port
    assert port is not None
    queue = Queue(Obs, aredis, prefix=prefix)
    await queue.add(Obs.work, Work(project_id="p", mode="block"), job_id="blocker")
    await wait_for(lambda: _true(bool(state.runs)), what="the blocking job to start")
    assert (await health(port))[0] == 200

    for i in range(3):
        await queue.add(Obs.work, Work(project_id="p", n=i))
    await queue.add(Obs.work, Work(project_id="p"), delay=60)

    async def wedged() -> bool:
        return (await health(port))[0] == 503

    await wait_for(wedged, what="liveness to fail")
    _status, body = await health(port)
    problems = body["problems"]
    assert isinstance(problems, list)
    assert len(problems) == 1
    assert "'obs' has 3 ready jobs" in problems[0]
    assert "active 1/1" in problems[0]
    # Readiness is about Redis and startup, not about the wedge.
    assert (await health(port, "/readyz"))[0] == 200

    s = await scrape(port)
    assert total(s, "streamq_queue_ready", queue="obs", shard="all") == 3
    assert total(s, "streamq_queue_in_flight", queue="obs", shard="all") == 1
    assert total(s, "streamq_queue_delayed", queue="obs", shard="all") == 1
    # Liveness failed 0.5 s after a poll first saw them ready; the gauge is the last poll's
    # reading (a poll interval earlier at most), by the Redis clock: well over 0.3 s.
    assert total(s, "streamq_queue_oldest_ready_age_seconds", queue="obs", shard="all") >= 0.3
    assert total(s, "streamq_jobs_active", queue="obs") == 1

    state.gate.set()

    async def recovered() -> bool:
        return (await health(port))[0] == 200

    await wait_for(recovered, what="liveness to pass again")
    await wait_for(
        lambda: _ready_is(port, 0), what="the backlog to drain in the depth gauges"
    )
    assert len(state.runs) == 4


async def test_a_paused_queue_with_ready_jobs_is_not_wedged(
    run_worker: RunWorker, aredis: aioredis.Redis, prefix: str
) -> None:
    await aredis.hset(QueueKeys(prefix, "obs", 2).meta, "paused", "1")
    state = Behaviour()
    _, server = await run_worker(
        make_app(state, concurrency=1), PrometheusHooks(), liveness_wedge_timeout_s=0.3
    )
    port = server.port
    assert port is not None
    queue = Queue(Obs, aredis, prefix=prefix)
    for i in range(3):
        await queue.add(Obs.work, Work(project_id="p", n=i))
    await wait_for(lambda: _ready_is(port, 3), what="the poller to see the paused backlog")
    polls = server.monitor.polls
    await wait_for(lambda: _true(server.monitor.polls >= polls + 5), what="more polls")
    assert (await health(port))[0] == 200
    assert state.runs == []


async def test_liveness_and_readiness_fail_while_redis_is_unreachable_and_recover(
    run_worker: RunWorker,
) -> None:
    binary = find_binary()
    assert binary is not None
    server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
    try:
        hooks = build_hooks(ObservabilityConfig())
        _, obs = await run_worker(
            make_app(Behaviour()), hooks, url=server.url, liveness_redis_timeout_s=0.5
        )
        port = obs.port
        assert port is not None
        await wait_for(lambda: _status_is(port, "/readyz", 200), what="readiness")
        assert (await health(port))[0] == 200

        server.stop(kill=True)
        await wait_for(lambda: _status_is(port, "/readyz", 503), what="readiness to fail")
        await wait_for(lambda: _status_is(port, "/healthz", 503), what="liveness to fail")
        _, body = await health(port)
        assert "Redis unreachable" in str(body["problems"])

        server.start()
        await wait_for(lambda: _status_is(port, "/healthz", 200), timeout_s=15,
                       what="liveness to pass again")
        await wait_for(lambda: _status_is(port, "/readyz", 200), what="readiness again")
    finally:
        server.stop(kill=True)


async def test_unknown_paths_and_methods_are_refused_and_head_has_no_body(
    run_worker: RunWorker,
) -> None:
    _, server = await run_worker(make_app(Behaviour()), Hooks())
    port = server.port
    assert port is not None
    assert (await http_get(port, "/nope"))[0] == 404
    # Without PrometheusHooks, /metrics says how to turn metrics on.
    status, _, body = await http_get(port, "/metrics")
    assert status == 404
    assert b"streamq[metrics]" in body
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = await reader.read()
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200")
    assert raw.endswith(b"\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 405")
    writer.close()


async def _true(value: bool) -> bool:
    return value


async def _ready_is(port: int, n: int) -> bool:
    s = await scrape(port)
    return total(s, "streamq_queue_ready", queue="obs", shard="all") == n


async def _status_is(port: int, path: str, status: int) -> bool:
    return (await http_get(port, path))[0] == status
