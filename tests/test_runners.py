"""Runners: supervised background coroutines, and singletons led by one replica at a time.

Singleton takeover is tested against real processes too: a holder started with
``python -m tests.test_runners holder ...`` is SIGKILLed or SIGSTOPped. Leases are short
(about a second) so the suite stays fast; bounds leave room for busy cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamq import (
    App,
    ConfigurationError,
    LeadershipLost,
    RegistrationError,
    RunnerConfig,
    RunnerContext,
    WorkerManager,
)
from streamq import lease as leases
from streamq._redis import run_calls, run_calls_sync
from streamq.backoff import Backoff
from streamq.hooks import Hooks
from streamq.keys import RunnerKeys
from tests.runtime.conftest import MakeManager
from tests.runtime.support import wait_until

LEASE_S = 1.0
RENEW_S = 0.25
ROOT = Path(__file__).resolve().parent.parent


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


class Recorded(Hooks):
    def __init__(self) -> None:
        self.crashes: list[str] = []
        self.leadership: list[tuple[str, bool]] = []

    def runner_crashed(self, runner: str) -> None:
        self.crashes.append(runner)

    def runner_leadership_changed(self, runner: str, leader: bool) -> None:
        self.leadership.append((runner, leader))


def runners_of(m: WorkerManager) -> Any:
    return next(s for s in m._services if s.name == "runners")


# -- supervision -------------------------------------------------------------------------------
async def test_a_crashing_runner_is_restarted_with_capped_backoff_logged_and_counted(
    managers: MakeManager, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[float] = []
    app = App()

    @app.runner("crasher", restart_backoff=Backoff.exponential(0.02, max_delay=0.2, jitter=0))
    async def crasher(ctx: RunnerContext) -> None:
        calls.append(time.monotonic())
        raise RuntimeError("boom")

    hooks = Recorded()
    m = managers(app, hooks=hooks)
    with caplog.at_level(logging.ERROR, logger="streamq.runners"):
        await m.start()
        await asyncio.sleep(1.0)
        await m.close_workers()
    n = len(calls)
    # 0.02, 0.04, 0.08, 0.16 then 0.2 s apart: about 8 calls in a second, never a hot loop.
    assert 4 <= n <= 10, calls
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(g >= 0.015 for g in gaps), gaps
    assert max(gaps) <= 0.2 + 0.3  # capped (with room for a busy loop)
    assert hooks.crashes == ["crasher"] * n
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors
    assert all(getattr(r, "runner", None) == "crasher" for r in errors)
    assert "crasher" in errors[0].getMessage()
    assert errors[0].exc_info is not None
    await asyncio.sleep(0.3)
    assert len(calls) == n  # closed: not restarted any more


async def test_a_long_lived_runner_runs_until_the_worker_closes_and_is_cancelled(
    managers: MakeManager,
) -> None:
    events: list[str] = []
    app = App()

    @app.runner("exporter")
    async def exporter(ctx: RunnerContext) -> None:
        events.append("start")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    m = managers(app)
    await m.start()
    await wait_until(lambda: events == ["start"], what="the runner started")
    await m.close_workers()
    assert events == ["start", "cancelled"]


async def test_a_periodic_runner_is_called_every_interval(managers: MakeManager) -> None:
    calls: list[float] = []
    app = App()

    @app.runner("ticker", every=0.1)
    async def ticker(ctx: RunnerContext) -> None:
        calls.append(time.monotonic())

    m = managers(app)
    await m.start()
    await wait_until(lambda: len(calls) >= 5, timeout_s=5, what="five calls")
    await m.close_workers()
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(g >= 0.09 for g in gaps), gaps
    assert sum(gaps) / len(gaps) < 0.3, gaps


async def test_a_disabled_runner_does_not_start_and_unknown_names_are_refused(
    managers: MakeManager,
) -> None:
    started: list[str] = []
    app = App()

    @app.runner("on-runner")
    async def on(ctx: RunnerContext) -> None:
        started.append(ctx.name)

    @app.runner("off-runner")
    async def off(ctx: RunnerContext) -> None:
        started.append(ctx.name)

    with pytest.raises(ConfigurationError, match="nope"):
        app.runner_config = RunnerConfig(enabled={"nope": True})
    app.runner_config = RunnerConfig(enabled={"off-runner": False})
    assert RunnerConfig.flag("off-runner") == "RUNNER_OFF_RUNNER_IS_ENABLED"
    assert set(app.runners) == {"on-runner", "off-runner"}
    m = managers(app)
    await m.start()
    await wait_until(lambda: started == ["on-runner"], what="the enabled runner")
    await asyncio.sleep(0.1)
    assert started == ["on-runner"]


def test_runner_declarations_are_checked_at_import() -> None:
    app = App()

    async def fn(ctx: RunnerContext) -> None: ...

    def sync(ctx: RunnerContext) -> None: ...

    app.runner("taken")(fn)
    with pytest.raises(RegistrationError, match="already declared"):
        app.runner("taken")(fn)
    with pytest.raises(RegistrationError, match="async"):
        app.runner("sync-one")(sync)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="lowercase"):
        app.runner("Bad_Name")
    with pytest.raises(RegistrationError, match="half the lease"):
        app.runner("slow-renew", singleton=True, lease=1.0, renew_interval=0.8)
    with pytest.raises(ConfigurationError):
        app.runner("neg", every=-1)


# -- singletons in one process -----------------------------------------------------------------
def singleton_app(name: str, log: list[tuple[str, str, int | None]], running: list[int],
                  *, every: float | None = None) -> App:
    """An app whose singleton runner records start/stop per consumer and how many run at once."""
    app = App()

    @app.runner(name, singleton=True, lease=LEASE_S, renew_interval=RENEW_S, every=every)
    async def lead(ctx: RunnerContext) -> None:
        running[0] += 1
        running[1] = max(running[1], running[0])
        log.append(("start", ctx.consumer, ctx.token))
        try:
            if every is None:
                await asyncio.Event().wait()
            await asyncio.sleep(0)
        finally:
            running[0] -= 1
            log.append(("stop", ctx.consumer, ctx.token))

    return app


def leaders(log: list[tuple[str, str, int | None]]) -> set[str]:
    live: dict[str, int] = {}
    for ev, consumer, _ in log:
        live[consumer] = live.get(consumer, 0) + (1 if ev == "start" else -1)
    return {c for c, n in live.items() if n > 0}


async def test_one_of_three_managers_leads_and_another_takes_over_when_it_closes(
    managers: MakeManager,
) -> None:
    log: list[tuple[str, str, int | None]] = []
    running = [0, 0]
    hooks = Recorded()
    ms = {f"m{i}": managers(singleton_app("leader", log, running), consumer_name=f"m{i}",
                            hooks=hooks) for i in range(3)}
    for m in ms.values():
        await m.start()
    await wait_until(lambda: len(leaders(log)) == 1, what="a leader")
    for _ in range(10):  # a few renewals later, still exactly one
        await asyncio.sleep(0.05)
        assert len(leaders(log)) == 1
    (first,) = leaders(log)
    first_token = log[-1][2]
    assert first_token is not None

    t0 = time.monotonic()
    await ms[first].close_workers()  # releases the lease: the others need not wait it out
    await wait_until(lambda: len(leaders(log)) == 1, timeout_s=5, what="a new leader")
    assert time.monotonic() - t0 < LEASE_S
    (second,) = leaders(log)
    assert second != first
    assert log[-1][2] is not None
    assert log[-1][2] > first_token
    assert running[1] == 1  # never two at once
    assert ("leader", True) in hooks.leadership
    assert ("leader", False) in hooks.leadership


async def test_a_periodic_singleton_runs_only_on_the_leader(managers: MakeManager) -> None:
    log: list[tuple[str, str, int | None]] = []
    running = [0, 0]
    a = managers(singleton_app("tick", log, running, every=0.1), consumer_name="a")
    b = managers(singleton_app("tick", log, running, every=0.1), consumer_name="b")
    await a.start()
    await b.start()
    await wait_until(lambda: len(log) >= 10, timeout_s=5, what="five calls")
    callers = {c for ev, c, _ in log if ev == "start"}
    assert len(callers) == 1
    leader = a if callers == {"a"} else b
    other = b if leader is a else a
    await leader.close_workers()
    n = len(log)
    await wait_until(lambda: len(log) >= n + 6, timeout_s=5, what="calls on the new leader")
    assert {c for ev, c, _ in log[n:] if ev == "start"} == {other.consumer}


async def test_a_stale_token_cannot_write_after_a_takeover(
    managers: MakeManager, aredis: Any, prefix: str
) -> None:
    tokens: list[int] = []
    app = App()

    @app.runner("writer", singleton=True, lease=LEASE_S, renew_interval=RENEW_S)
    async def writer(ctx: RunnerContext) -> None:
        assert await ctx.still_leader()
        assert not ctx.fenced
        await ctx.fenced_set(ctx.key("owner"), str(ctx.token))
        tokens.append(ctx.token or 0)
        await asyncio.Event().wait()

    m = managers(app)
    await m.start()
    await wait_until(lambda: len(tokens) == 1, what="the first write")
    keys = RunnerKeys(prefix, "writer")
    # The lease expires (as if the holder paused) and another replica takes it.
    await aredis.delete(keys.lease)
    grant = (await run_calls(aredis, [leases.acquire(keys, "other", 5000)]))[0]
    assert grant.held
    assert grant.token > tokens[0]

    status = (await run_calls(aredis, [leases.fenced_set(keys, tokens[0], keys.data("owner"),
                                                         "stale", 0)]))[0]
    assert status is leases.LeaseStatus.OTHER
    assert await aredis.get(keys.data("owner")) == str(tokens[0]).encode()
    # The old holder's renewal finds the new holder: its run is cancelled and it steps down.
    runner = runners_of(m).runner("writer")
    await wait_until(lambda: not runner.leading, timeout_s=3, what="the old run cancelled")
    ctx = runner.ctx
    assert ctx.fenced
    assert not await ctx.still_leader()
    with pytest.raises(LeadershipLost):
        await ctx.fenced_set(ctx.key("owner"), "late")
    assert await aredis.get(keys.data("owner")) == str(tokens[0]).encode()


async def test_a_blocked_event_loop_keeps_its_lease_renewed_from_the_lease_thread(
    managers: MakeManager, aredis: Any, prefix: str
) -> None:
    done: list[int] = []
    app = App()

    @app.runner("blocker", singleton=True, lease=LEASE_S, renew_interval=RENEW_S)
    async def blocker(ctx: RunnerContext) -> None:
        time.sleep(2 * LEASE_S)  # blocks the loop past the lease: CPU-bound or a sync call
        done.append(ctx.token or 0)
        assert not ctx.fenced
        assert await ctx.still_leader()
        await asyncio.Event().wait()

    hooks = Recorded()
    m = managers(app, hooks=hooks)
    await m.start()
    await wait_until(lambda: bool(done), timeout_s=10, what="the blocking call returned")
    assert hooks.leadership == [("blocker", True)]
    holder = await aredis.hget(RunnerKeys(prefix, "blocker").lease, "token")
    assert int(holder) == done[0]


def test_lease_scripts_fence_on_holder_and_token(sredis: Any, prefix: str) -> None:
    keys = RunnerKeys(prefix, "scripted")

    def run(call: Any) -> Any:
        return run_calls_sync(sredis, [call])[0]

    a = run(leases.acquire(keys, "a", 5000))
    assert (a.held, a.token, a.holder) == (True, 1, "a")
    assert run(leases.acquire(keys, "a", 5000)).token == 1  # a re-send keeps the token
    b = run(leases.acquire(keys, "b", 5000))
    assert not b.held
    assert (b.token, b.holder) == (1, "a")
    assert 0 < b.ttl_ms <= 5000
    assert run(leases.renew(keys, "b", 1, 5000)) is leases.LeaseStatus.OTHER
    assert run(leases.renew(keys, "a", 1, 5000)) is leases.LeaseStatus.HELD
    # A holder whose run with token 1 was cancelled gets a new token, never token 1 again.
    assert run(leases.acquire(keys, "a", 5000, spent_token=1)).token == 2
    assert run(leases.renew(keys, "a", 1, 5000)) is leases.LeaseStatus.OTHER
    assert run(leases.release(keys, "b", 2)) is leases.LeaseStatus.OTHER
    assert run(leases.release(keys, "a", 2)) is leases.LeaseStatus.HELD
    assert run(leases.release(keys, "a", 2)) is leases.LeaseStatus.GONE
    assert run(leases.renew(keys, "a", 2, 5000)) is leases.LeaseStatus.GONE
    target = keys.data("v")
    assert run(leases.fenced_set(keys, 2, target, "x", 0)) is leases.LeaseStatus.GONE
    assert run(leases.acquire(keys, "b", 5000)).token == 3  # tokens outlive the lease
    assert run(leases.fenced_set(keys, 2, target, "x", 0)) is leases.LeaseStatus.OTHER
    assert run(leases.fenced_set(keys, 3, target, "y", 1000)) is leases.LeaseStatus.HELD
    assert sredis.get(target) == b"y"
    assert 0 < sredis.pttl(target) <= 1000
    sredis.delete(keys.lease, keys.fence, target)


# -- singletons across real processes ----------------------------------------------------------
class Holder:
    """A ``python -m tests.test_runners holder`` process and the events it prints."""

    def __init__(self, redis_url: str, prefix: str, consumer: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_runners", "holder", "--redis-url", redis_url,
             "--prefix", prefix, "--consumer", consumer],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def seen(self, ev: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["ev"] == ev]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def holders(redis_url: str, prefix: str) -> Iterator[Any]:
    made: list[Holder] = []

    def make(consumer: str) -> Holder:
        h = Holder(redis_url, prefix, consumer)
        made.append(h)
        return h

    yield make
    for h in made:
        with_signal = h.proc.poll() is None
        if with_signal:
            os.kill(h.proc.pid, signal.SIGCONT)
        h.stop()


def writer_app(log: list[tuple[str, int]]) -> App:
    app = App()

    @app.runner("proc-lead", singleton=True, lease=LEASE_S, renew_interval=RENEW_S)
    async def lead(ctx: RunnerContext) -> None:
        log.append(("leader", ctx.token or 0))
        await ctx.fenced_set(ctx.key("owner"), str(ctx.token))
        await asyncio.Event().wait()

    return app


async def test_a_sigkilled_holder_is_replaced_within_lease_plus_renew_interval(
    managers: MakeManager, holders: Any
) -> None:
    holder = holders("proc-holder")
    await wait_until(lambda: bool(holder.seen("leader")), timeout_s=20, what="the subprocess leads")
    old_token = holder.seen("leader")[0]["token"]

    log: list[tuple[str, int]] = []
    m = managers(writer_app(log), consumer_name="in-test")
    await m.start()
    await asyncio.sleep(2 * RENEW_S)
    assert log == []  # the live holder keeps its lease

    holder.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await wait_until(lambda: bool(log), timeout_s=5, what="the takeover")
    took = time.monotonic() - killed_at
    assert took <= LEASE_S + RENEW_S + 0.5, took  # slack for busy cores
    assert log[0][1] > old_token


async def test_a_paused_holder_past_its_lease_is_replaced_and_its_writes_refused(
    managers: MakeManager, holders: Any, aredis: Any, prefix: str
) -> None:
    holder = holders("proc-paused")
    await wait_until(lambda: bool(holder.seen("wrote")), timeout_s=20, what="the subprocess writes")
    old_token = holder.seen("leader")[0]["token"]
    key = RunnerKeys(prefix, "proc-lead").data("owner")

    holder.proc.send_signal(signal.SIGSTOP)  # a GC pause, a frozen VM
    log: list[tuple[str, int]] = []
    m = managers(writer_app(log), consumer_name="in-test")
    await m.start()
    await wait_until(lambda: bool(log), timeout_s=5, what="the takeover")
    new_token = log[0][1]
    assert new_token > old_token
    await wait_until(lambda: aredis.get(key), what="the new leader's write")
    assert await aredis.get(key) == str(new_token).encode()

    mark = len(holder.events)
    holder.proc.send_signal(signal.SIGCONT)
    # It resumes mid-loop and tries to write at once: refused (or cancelled first).
    await wait_until(lambda: any(e["ev"] in ("refused", "cancelled")
                                 for e in holder.events[mark:]),
                     timeout_s=5, what="the old holder steps down")
    await asyncio.sleep(0.3)
    assert [e for e in holder.events[mark:] if e["ev"] == "wrote"] == []
    assert await aredis.get(key) == str(new_token).encode()
    assert runners_of(m).runner("proc-lead").leading


# -- the holder process ------------------------------------------------------------------------
def _holder(argv: list[str]) -> None:
    """Leads singleton ``proc-lead`` and writes its token every 50 ms; prints JSON events."""
    p = argparse.ArgumentParser()
    p.add_argument("role")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--consumer", required=True)
    args = p.parse_args(argv)

    def emit(ev: str, **kw: Any) -> None:
        print(json.dumps({"ev": ev, "t": time.time(), **kw}), flush=True)

    app = App()

    @app.runner("proc-lead", singleton=True, lease=LEASE_S, renew_interval=RENEW_S)
    async def lead(ctx: RunnerContext) -> None:
        emit("leader", token=ctx.token)
        try:
            while True:
                try:
                    await ctx.fenced_set(ctx.key("owner"), str(ctx.token))
                except LeadershipLost:
                    emit("refused", token=ctx.token)
                    raise
                emit("wrote", token=ctx.token)
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            emit("cancelled", token=ctx.token)
            raise

    async def main() -> None:
        m = WorkerManager(redis_url=args.redis_url, prefix=args.prefix,
                          consumer_name=args.consumer)
        m.register_app(app)
        await m.run_until_signal()

    asyncio.run(main())


if __name__ == "__main__":
    _holder(sys.argv[1:])
