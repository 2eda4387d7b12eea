"""Runners: long-lived background coroutines of a worker app, optionally one per fleet.

Example::

    app = App(CONTRACTS, state=AppState())

    @app.runner("project-cleaner", singleton=True, every=timedelta(minutes=1))
    async def clean_projects(ctx: RunnerContext[AppState]) -> None:
        await ctx.state.db.delete_stale_projects()        # called every minute, on the leader

    @app.runner("metrics-exporter")
    async def export(ctx: RunnerContext[AppState]) -> None:
        while True:                                        # runs until cancelled
            await push_metrics()
            await asyncio.sleep(10)

Runners start with the worker (after its consumers) and stop with it (before them), as one
:class:`~streamq.services.Service`. A runner that raises is logged at ERROR with its name,
counted (``Hooks.runner_crashed``) and restarted after a capped exponential backoff; one
that returns is done (a periodic runner is called again each ``every``).

A ``singleton`` runner runs in one process of the fleet at a time: the one holding its lease
in Redis (:mod:`streamq.lease`), renewed on a thread of its own. Every acquisition takes a
new, greater fencing token (``ctx.token``). When the holder dies, another replica takes over
within the lease; when a renewal finds another holder, or the lease ran out, the runner is
cancelled (cooperatively: at its next ``await``) and, from that moment, ``ctx.fenced`` is
true and :meth:`RunnerContext.fenced_set` refuses its writes, however late they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from streamq import lease
from streamq._redis import run_calls
from streamq.backoff import Backoff
from streamq.durations import Duration, to_ms
from streamq.errors import ConfigurationError, LeadershipLost, RegistrationError
from streamq.keys import NAME_RE, RunnerKeys
from streamq.runtime.worker import stop_tasks
from streamq.services import ServiceContext

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_RESTART_BACKOFF",
    "RunnerConfig",
    "RunnerContext",
    "RunnerFn",
    "RunnerService",
    "RunnerSpec",
    "runner_spec",
]

_log = logging.getLogger("streamq.runners")

StateT = TypeVar("StateT", default=Any)

DEFAULT_LEASE = timedelta(seconds=15)
"""How long a singleton's lease lasts without renewal: the longest a dead leader is missed."""
DEFAULT_RESTART_BACKOFF = Backoff.exponential(
    timedelta(milliseconds=100), max_delay=timedelta(seconds=30), jitter=0.2
)
"""Wait before restarting a crashed runner: 0.1 s doubling to 30 s, +/- 20 %."""
STOP_TIMEOUT_S = 10.0
"""How long a cancelled runner may take to stop before the worker goes on without it."""

_FLAG_RE = re.compile(r"[^A-Z0-9]")


class RunnerContext(Generic[StateT]):
    """What a runner is called with: the app's state, Redis, and its leadership.

    Attributes:
        name: the runner's name.
        state: the app's state object (``App(..., state=...)``).
        client: the worker's async Redis client (no blocking reads on it).
        prefix: the key prefix.
        consumer: this process's consumer name (the lease holder's name).
        token: the fencing token of this run's lease (singleton runners), else None. It is
            greater than every token before it: pass it to stores that can fence on it.
        logger: a logger carrying the runner's name and token.
    """

    __slots__ = ("_keeper", "_keys", "client", "consumer", "logger", "name", "prefix", "state",
                 "token")

    def __init__(
        self,
        *,
        name: str,
        state: StateT,
        client: Any,
        prefix: str,
        consumer: str,
        token: int | None = None,
        keeper: lease.LeaseKeeper | None = None,
    ) -> None:
        self.name = name
        self.state = state
        self.client = client
        self.prefix = prefix
        self.consumer = consumer
        self.token = token
        self._keeper = keeper
        self._keys = RunnerKeys(prefix, name)
        self.logger = logging.LoggerAdapter(_log, {"runner": name, "token": token})

    @property
    def singleton(self) -> bool:
        return self.token is not None

    @property
    def fenced(self) -> bool:
        """True once this run's lease is lost (as this process knows, without a round trip):
        stop, the runner is being cancelled and fenced writes are refused."""
        return self._keeper is not None and not self._keeper.holds(self.token)

    async def still_leader(self) -> bool:
        """Whether this run still holds its lease, asked of Redis (always True for a runner
        that is not a singleton)."""
        if self._keeper is None:
            return True
        if self.fenced:
            return False
        held = await self.client.hget(self._keys.lease, "token")
        return held is not None and int(held) == self.token

    def key(self, name: str) -> str:
        """``<prefix>:{runner:<name>}:data:<name>``: a key in the runner's cluster slot.

        On Redis Cluster, :meth:`fenced_set` can only write keys made here (the script
        touches the lease and the key together); on a single Redis any key works.
        """
        return self._keys.data(name)

    async def fenced_set(
        self, key: str, value: str | bytes, *, ttl: Duration | None = None
    ) -> None:
        """``SET key value`` only while this run holds the lease (checked in Redis, atomically
        with the write), so a replaced leader's late write is refused.

        Raises:
            LeadershipLost: the lease expired or another replica holds it (nothing written).
            ConfigurationError: the runner is not a singleton.
        """
        if self.token is None or self._keeper is None:
            raise ConfigurationError(
                f"runner {self.name!r}: fenced writes need @app.runner(..., singleton=True)"
            )
        ttl_ms = 0 if ttl is None else to_ms(ttl, "fenced_set ttl", minimum=1)
        if not self.fenced:
            call = lease.fenced_set(self._keys, self.token, key, value, ttl_ms)
            (status,) = await run_calls(self.client, [call])
            if status is lease.LeaseStatus.HELD:
                return
            self._keeper.renew_now()
        raise LeadershipLost(
            f"runner {self.name!r}: write to {key!r} refused, token {self.token} no longer "
            "holds the lease", runner=self.name, token=self.token,
        )


RunnerFn = Callable[[RunnerContext[StateT]], Awaitable[Any]]
"""An async function taking a :class:`RunnerContext`."""


@dataclass(frozen=True, slots=True)
class RunnerSpec:
    """One declared runner (see :meth:`streamq.App.runner`). Durations in ms."""

    name: str
    fn: RunnerFn[Any]
    singleton: bool = False
    every_ms: int | None = None
    lease_ms: int = 15_000
    renew_interval_ms: int = 5_000
    restart_backoff: Backoff = DEFAULT_RESTART_BACKOFF


def runner_spec(
    name: str,
    fn: object,
    *,
    singleton: bool = False,
    every: Duration | None = None,
    lease: Duration = DEFAULT_LEASE,
    renew_interval: Duration | None = None,
    restart_backoff: Backoff = DEFAULT_RESTART_BACKOFF,
) -> RunnerSpec:
    """A checked :class:`RunnerSpec`.

    Raises:
        RegistrationError: a malformed name, a function that is not ``async def``, a renewal
            interval not below half the lease.
        ConfigurationError: a malformed duration.
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RegistrationError(f"runner name {name!r} must be lowercase letters, digits and "
                                "single hyphens (it names keys and RUNNER_<NAME>_IS_ENABLED)")
    if not asyncio.iscoroutinefunction(fn) and not asyncio.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    ):
        raise RegistrationError(
            f"runner {name!r}: {fn!r} must be an async function taking a RunnerContext "
            "(run sync work with asyncio.to_thread)"
        )
    if not isinstance(restart_backoff, Backoff):
        raise ConfigurationError(f"runner {name!r}: restart_backoff must be a Backoff")
    every_ms = None if every is None else to_ms(every, f"runner {name!r} every", minimum=1)
    lease_ms = to_ms(lease, f"runner {name!r} lease", minimum=100)
    renew_ms = (lease_ms // 3 if renew_interval is None
                else to_ms(renew_interval, f"runner {name!r} renew_interval", minimum=10))
    if renew_ms * 2 > lease_ms:
        raise RegistrationError(
            f"runner {name!r}: renew_interval ({renew_ms} ms) must be at most half the lease "
            f"({lease_ms} ms), or one late renewal loses it"
        )
    return RunnerSpec(name, cast("RunnerFn[Any]", fn), bool(singleton), every_ms, lease_ms,
                      renew_ms, restart_backoff)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Which runners a process runs: every declared runner unless ``enabled`` says False.

    The library never reads the environment: the entry point builds this from
    ``RUNNER_<NAME>_IS_ENABLED`` flags (see :meth:`flag`) and sets ``app.runner_config``.

    Example::

        app.runner_config = RunnerConfig(enabled={"project-cleaner": False})
    """

    enabled: Mapping[str, bool] = field(default_factory=dict)

    def is_enabled(self, name: str) -> bool:
        return bool(self.enabled.get(name, True))

    @staticmethod
    def flag(name: str) -> str:
        """The variable that enables runner ``name``: ``RUNNER_<NAME>_IS_ENABLED``, the name
        upper-cased with ``-`` as ``_``."""
        return f"RUNNER_{_FLAG_RE.sub('_', name.upper())}_IS_ENABLED"


class RunnerService:
    """Every runner of an app, as one :class:`~streamq.services.Service` (``"runners"``)."""

    name = "runners"

    def __init__(self) -> None:
        self.specs: dict[str, RunnerSpec] = {}
        self.config = RunnerConfig()
        self._runners: list[_Runner] = []
        self._running = False
        self._refused = 0

    def add(self, spec: RunnerSpec) -> None:
        """Declare ``spec``. Raises RegistrationError when its name is taken."""
        if spec.name in self.specs:
            raise RegistrationError(f"a runner named {spec.name!r} is already declared")
        self.specs[spec.name] = spec

    def configure(self, config: RunnerConfig) -> None:
        """Use ``config``. Raises ConfigurationError when it names an undeclared runner."""
        unknown = sorted(set(config.enabled) - set(self.specs))
        if unknown:
            raise ConfigurationError(
                f"runner config names undeclared runners {unknown}; declared: "
                f"{sorted(self.specs) or 'none'}"
            )
        self.config = config

    async def start(self, ctx: ServiceContext) -> None:
        if self._running:
            # The manager closes a service whose start failed: that close must leave the
            # runners of the manager that does run them alone.
            self._refused += 1
            raise RegistrationError(
                "this app's runners already run in another WorkerManager of this process; "
                "give each manager an App of its own"
            )
        self._running = True
        for spec in self.specs.values():
            if not self.config.is_enabled(spec.name):
                _log.info("runner disabled", extra={"runner": spec.name,
                                                     "flag": RunnerConfig.flag(spec.name)})
                continue
            runner = _Runner(spec, ctx)
            self._runners.append(runner)
            await runner.start()

    async def close(self) -> None:
        if self._refused:
            self._refused -= 1
            return
        runners, self._runners, self._running = self._runners, [], False
        await asyncio.gather(*(r.close() for r in runners))

    def runner(self, name: str) -> _Runner | None:
        """The running runner ``name`` in this process (for tests and health)."""
        return next((r for r in self._runners if r.spec.name == name), None)


class _Runner:
    """One runner in one process: its runs, their supervision and, for a singleton, the
    lease keeper whose gains and losses start and cancel runs."""

    def __init__(self, spec: RunnerSpec, sctx: ServiceContext) -> None:
        self.spec = spec
        self.sctx = sctx
        self.keeper: lease.LeaseKeeper | None = None
        self.task: asyncio.Task[None] | None = None
        self.ctx: RunnerContext[Any] | None = None
        self.crashes = 0
        self.calls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        self._control: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def leading(self) -> bool:
        """A run is going on here (for a singleton: this process leads)."""
        return self.task is not None and not self.task.done()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self.spec.singleton:
            self._launch(None)
            return
        self._control = self._loop.create_task(self._leadership(),
                                               name=f"runner-{self.spec.name}-leadership")
        self.keeper = lease.LeaseKeeper(
            self.sctx.sync_client(), RunnerKeys(self.sctx.prefix, self.spec.name),
            # A holder id of this process's own: two processes given one consumer name (a
            # restarted pod) must not both believe they hold the lease.
            runner=self.spec.name, holder=f"{self.sctx.consumer}:{uuid.uuid4().hex[:8]}",
            lease_ms=self.spec.lease_ms,
            renew_interval_ms=self.spec.renew_interval_ms,
            on_gained=lambda token: self._from_thread("gained", token),
            on_lost=lambda token, _reason: self._from_thread("lost", token),
            on_error=self._error_from_thread,
        )
        self.keeper.start()

    async def close(self) -> None:
        self._closing = True
        await self._stop_run()
        if self.keeper is not None:
            self.keeper.stop()  # releases the lease once the run has stopped
            await asyncio.to_thread(self.keeper.join, STOP_TIMEOUT_S)
        if self._control is not None:
            await stop_tasks([self._control])

    # -- leadership (singletons) -----------------------------------------------------------
    def _from_thread(self, event: str, token: int) -> None:
        self.sctx.hooks.runner_leadership_changed(self.spec.name, event == "gained")
        self._post(self._events.put_nowait, (event, token))

    def _error_from_thread(self, exc: BaseException) -> None:
        self._post(self.sctx.status.error, None, exc, task=f"runner:{self.spec.name}")

    def _post(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # The loop may close meanwhile: then there is nothing left to start or stop.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: fn(*args, **kw))

    async def _leadership(self) -> None:
        """Starts a run on each gain and cancels it on its loss, one event at a time, so a
        new run never starts before the previous one stopped."""
        while True:
            event, token = await self._events.get()
            try:
                if event == "gained":
                    await self._stop_run()
                    if not self._closing and self.keeper is not None and self.keeper.holds(token):
                        self._launch(token)
                elif self.ctx is not None and self.ctx.token == token and self.leading:
                    _log.info("runner cancelled: its lease is lost",
                              extra={"runner": self.spec.name, "token": token})
                    await self._stop_run()
            except Exception:  # keep handling leadership whatever one event did
                _log.exception("runner leadership event failed",
                               extra={"runner": self.spec.name, "event": event})

    # -- runs ------------------------------------------------------------------------------
    def _launch(self, token: int | None) -> None:
        s = self.sctx
        self.ctx = RunnerContext(name=self.spec.name, state=s.state, client=s.client,
                                 prefix=s.prefix, consumer=s.consumer, token=token,
                                 keeper=self.keeper)
        assert self._loop is not None
        self.task = self._loop.create_task(self._supervise(self.ctx),
                                           name=f"runner-{self.spec.name}")

    async def _stop_run(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            await stop_tasks([task], timeout_s=STOP_TIMEOUT_S)

    async def _supervise(self, ctx: RunnerContext[Any]) -> None:
        """Runs ``ctx``'s run; restarts it after a capped backoff whenever it raises."""
        loop = asyncio.get_running_loop()
        backoff = self.spec.restart_backoff
        failures = 0
        next_at = loop.time()
        while True:
            began = loop.time()
            try:
                if self.spec.every_ms is None:
                    await self.spec.fn(ctx)
                    _log.info("runner returned; it is done in this process",
                              extra={"runner": self.spec.name})
                    return
                while True:
                    await asyncio.sleep(max(0.0, next_at - loop.time()))
                    next_at = loop.time() + self.spec.every_ms / 1000
                    await self.spec.fn(ctx)
                    self.calls += 1
                    failures = 0
            except asyncio.CancelledError:
                raise
            except LeadershipLost:
                _log.info("runner stopped: a fenced write found its lease lost",
                          extra={"runner": self.spec.name, "token": ctx.token})
                return
            except Exception as exc:
                if loop.time() - began > backoff.max_delay_ms / 1000:
                    failures = 0  # it ran fine for a while: a new failure, not a crash loop
                failures += 1
                delay = backoff.delay_for(min(failures, 30)) / 1000
                self._report(exc, failures, delay)
            await asyncio.sleep(delay)

    def _report(self, exc: Exception, failures: int, delay: float) -> None:
        # Every error counts, Redis's included: a runner's connection errors are as likely to
        # come from its own database or HTTP calls, which say nothing of the queue's Redis.
        name = self.spec.name
        self.crashes += 1
        self.sctx.hooks.runner_crashed(name)
        _log.error("runner %r crashed; restarting it in %.2f s", name, delay, exc_info=exc,
                   extra={"runner": name, "failures": failures})
