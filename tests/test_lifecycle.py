"""Startup and shutdown hooks, and the app's state as processors and runners see it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import (
    App,
    Job,
    Queue,
    QueueContract,
    RegistrationError,
    RunnerContext,
    StartupHookFailed,
    WorkerManager,
    job,
)
from streamq.keys import QueueKeys
from tests.runtime.conftest import MakeManager
from tests.runtime.support import wait_until


@pytest.fixture
async def managers(redis_url: str, prefix: str, aredis: Any) -> AsyncIterator[MakeManager]:
    """``make(app, **manager_kwargs)``: a registered manager on this test's prefix; closed,
    and the prefix's keys removed, at teardown."""
    made: list[WorkerManager] = []

    def make(app: App, **kw: Any) -> WorkerManager:
        m = WorkerManager(redis_url=redis_url, prefix=prefix, **kw)
        m.register_app(app)
        made.append(m)
        return m

    yield make
    for m in made:
        await m.close_workers(timeout_s=0.5)
    keys = [k async for k in aredis.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await aredis.delete(*keys)


class Note(BaseModel):
    n: int


class Lc(QueueContract, name="lc-q"):
    note = job("note", Note)


@dataclass
class AppState:
    pool: str | None = None
    seen: list[str] = field(default_factory=list)


async def group_exists(aredis: Any, prefix: str) -> bool:
    stream = QueueKeys(prefix, "lc-q", 1).shards[0].stream
    try:
        return bool(await aredis.xinfo_groups(stream))
    except Exception:  # no stream yet
        return False


def make_app(log: list[str], aredis: Any, prefix: str) -> App[AppState]:
    app = App([Lc], state=AppState())

    @app.on_startup
    async def open_pool(state: AppState) -> None:
        assert not await group_exists(aredis, prefix), "a worker started before the hooks"
        state.pool = "open"
        log.append("startup open_pool")

    @app.on_startup
    def warm_cache() -> None:  # sync, and without the state
        log.append("startup warm_cache")

    @app.on_shutdown
    async def close_pool(state: AppState) -> None:
        log.append(f"shutdown close_pool (pool {state.pool})")
        state.pool = None

    @app.on_shutdown
    def flush(state: AppState) -> None:
        log.append("shutdown flush")

    @app.processor(Lc)
    async def process(job: Job[Note]) -> None:
        app.state.seen.append(f"job {job.payload.n} pool {app.state.pool}")  # the app, a global

    @app.runner("lc-runner")
    async def runner(ctx: RunnerContext[AppState]) -> None:
        ctx.state.seen.append(f"runner pool {ctx.state.pool}")
        try:
            await asyncio.Event().wait()
        finally:
            log.append("runner stopped")

    return app


async def test_startup_hooks_run_in_order_before_workers_and_shutdown_hooks_in_reverse_after(
    managers: MakeManager, aredis: Any, prefix: str
) -> None:
    log: list[str] = []
    app = make_app(log, aredis, prefix)
    await Queue(Lc, aredis, prefix=prefix).add(Lc.note, Note(n=1))
    m = managers(app)
    await m.start()
    assert log == ["startup open_pool", "startup warm_cache"]
    await m.run_until_idle(timeout_s=5)
    await wait_until(lambda: len(app.state.seen) == 2, what="the job and the runner")
    assert sorted(app.state.seen) == ["job 1 pool open", "runner pool open"]

    await m.close_workers()
    assert log[2:] == ["runner stopped", "shutdown flush", "shutdown close_pool (pool open)"]
    assert app.state.pool is None


async def test_a_failing_startup_hook_stops_the_start_naming_it_and_nothing_is_consumed(
    managers: MakeManager, aredis: Any, prefix: str
) -> None:
    log: list[str] = []
    app = make_app(log, aredis, prefix)

    @app.on_startup
    async def connect_db(state: AppState) -> None:
        raise ConnectionRefusedError("db is down")

    @app.on_startup
    def never(state: AppState) -> None:
        log.append("startup never")

    await Queue(Lc, aredis, prefix=prefix).add(Lc.note, Note(n=1))
    m = managers(app)
    with pytest.raises(StartupHookFailed, match="connect_db") as caught:
        await m.start()
    assert caught.value.hook.endswith("connect_db")
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert "db is down" in str(caught.value)
    await asyncio.sleep(0.2)
    assert app.state.seen == []  # no job, no runner
    assert not await group_exists(aredis, prefix)
    assert await aredis.xlen(QueueKeys(prefix, "lc-q", 1).shards[0].stream) == 1
    # The hooks that ran can release what they opened: shutdown hooks run, in reverse.
    assert log == ["startup open_pool", "startup warm_cache", "shutdown flush",
                   "shutdown close_pool (pool open)"]


async def test_a_failing_shutdown_hook_is_logged_and_the_others_still_run(
    managers: MakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[str] = []
    app = App([Lc])

    @app.processor(Lc)
    async def process(job: Job[Note]) -> None: ...

    @app.on_shutdown
    def first() -> None:
        log.append("first")

    @app.on_shutdown
    async def broken() -> None:
        raise RuntimeError("cannot close")

    m = managers(app)
    await m.start()
    with caplog.at_level(logging.ERROR):
        await m.close_workers()
    assert log == ["first"]
    assert any("broken" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_hooks_that_cannot_be_called_are_refused_at_decoration() -> None:
    app = App()

    def two(a: Any, b: Any) -> None: ...

    def gen(state: Any) -> Any:
        yield

    with pytest.raises(RegistrationError, match="required parameters"):
        app.on_startup(two)
    with pytest.raises(RegistrationError, match="generator"):
        app.on_shutdown(gen)
    with pytest.raises(RegistrationError, match="not callable"):
        app.on_startup(42)  # type: ignore[type-var]
