"""The worker app: processors registered as decorated functions.

Example::

    app = App(CONTRACTS)

    @app.processor(Ingestion, concurrency=20, lock_duration=timedelta(seconds=60))
    async def ingest(job: Job[IngestEvent]) -> None:
        await services.ingest(job.payload)

``python -m worker`` loads ``app`` (``WORKER_APP=package.module:app``) and starts a consumer
for every queue whose ``QUEUE_CONSUMER_<QUEUE>_IS_ENABLED`` flag is true.

An app can also hold a typed state object (``App(CONTRACTS, state=AppState())``), startup and
shutdown hooks (``@app.on_startup`` / ``@app.on_shutdown``, :mod:`streamq.lifecycle`) and
background runners (``@app.runner``, :mod:`streamq.runners`).
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    TypeVar,
    Union,
    Unpack,
    get_args,
    get_origin,
    overload,
)

from pydantic import BaseModel
from typing_extensions import TypeVar as DefaultTypeVar

from streamq.contracts import ContractSet, JobSpec, QueueContract
from streamq.durations import Duration
from streamq.errors import RegistrationError
from streamq.job import Job
from streamq.options import Batch, ProcessorOptions, WorkerOptions
from streamq.schedules import Missed, PayloadFactory, Schedule, Scheduler, SchedulerConfig

if TYPE_CHECKING:  # runners import the runtime, which imports this module
    from streamq.backoff import Backoff
    from streamq.runners import RunnerConfig, RunnerFn, RunnerService, RunnerSpec

__all__ = ["App", "Processor", "Registration"]

Processor = Callable[[Job[Any]], Awaitable[Any]] | Callable[[Job[Any]], Any]
F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P", bound=BaseModel)
StateT = DefaultTypeVar("StateT", default=Any)


@dataclass(slots=True)
class Registration:
    """The processors of one queue contract and how the queue is consumed."""

    contract: type[QueueContract]
    options: WorkerOptions
    default: Processor | None = None
    by_job: dict[str, Processor] = field(default_factory=dict)
    options_given: bool = False
    batch: Batch | None = None
    """Set for a batch processor: ``default`` then takes ``list[Job[P]]``."""

    def handler(self, job_name: str) -> Processor | None:
        """The processor for ``job_name``, or None when nothing handles it."""
        return self.by_job.get(job_name, self.default)

    @staticmethod
    def is_async(fn: Processor) -> bool:
        return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
        )


class App(Generic[StateT]):
    """Holds the processors, runners, lifecycle hooks and state of a worker application.

    Args:
        contracts: the application's contracts (a ``ContractSet`` or queue contracts).
        state: an object of the app's own (a database pool, clients, settings), reachable as
            ``app.state`` (processors import the app), ``ctx.state`` (runners) and passed to
            lifecycle hooks. Typed: ``App(CONTRACTS, state=AppState())`` is an
            ``App[AppState]``.

    Example::

        @dataclass
        class AppState:
            db: Pool | None = None

        app = App(CONTRACTS, state=AppState())

        @app.on_startup
        async def open_db(state: AppState) -> None:
            state.db = await create_pool(DSN)
    """

    @overload
    def __init__(
        self: App[None],
        contracts: ContractSet | Iterable[type[QueueContract]] = (),
        *,
        state: None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        contracts: ContractSet | Iterable[type[QueueContract]] = (),
        *,
        state: StateT,
    ) -> None: ...

    def __init__(
        self, contracts: ContractSet | Iterable[type[QueueContract]] = (), *, state: Any = None
    ) -> None:
        self.contracts = contracts if isinstance(contracts, ContractSet) else ContractSet(
            *contracts
        )
        self.registrations: dict[str, Registration] = {}
        self.services: list[Any] = []
        """Services run beside the consumers (:mod:`streamq.services`); ``register_app``
        hands them to the manager."""
        self.scheduler: Scheduler | None = None
        """The service that enqueues this app's schedules; made by the first
        :meth:`schedule`."""
        self.state: StateT = state
        self.startup_hooks: list[Callable[..., Any]] = []
        self.shutdown_hooks: list[Callable[..., Any]] = []
        self._runners: RunnerService | None = None

    def on_startup(self, fn: F) -> F:
        """Run ``fn`` when a worker starts, before any queue is consumed (declaration order).

        ``fn`` is async or sync and takes the app's state or nothing. If it raises, the
        worker does not start: ``WorkerManager.start`` raises
        :class:`~streamq.errors.StartupHookFailed` naming it.

        Raises:
            RegistrationError: ``fn`` cannot be called as ``fn(state)`` or ``fn()``.
        """
        from streamq.lifecycle import check_hook

        check_hook(fn, "on_startup")
        self.startup_hooks.append(fn)
        return fn

    def on_shutdown(self, fn: F) -> F:
        """Run ``fn`` when a worker stops, after its consumers and runners closed (in the
        reverse order of declaration). A hook that raises is logged; the next one runs.

        Raises:
            RegistrationError: ``fn`` cannot be called as ``fn(state)`` or ``fn()``.
        """
        from streamq.lifecycle import check_hook

        check_hook(fn, "on_shutdown")
        self.shutdown_hooks.append(fn)
        return fn

    def runner(
        self,
        name: str,
        *,
        singleton: bool = False,
        every: Duration | None = None,
        lease: Duration | None = None,
        renew_interval: Duration | None = None,
        restart_backoff: Backoff | None = None,
    ) -> Callable[[RunnerFn[StateT]], RunnerFn[StateT]]:
        """Run the decorated ``async def fn(ctx: RunnerContext[State])`` in every worker.

        Without ``every`` it is long-lived: it runs until the worker stops (it is cancelled);
        with ``every`` (a timedelta or seconds) it is called at that interval. A runner that
        raises is logged, counted and restarted after ``restart_backoff`` (default 0.1 s
        doubling to 30 s). ``singleton=True`` runs it on one worker of the fleet at a time,
        the holder of a lease in Redis (``lease``, default 15 s, renewed every
        ``renew_interval``, default a third of it); see :mod:`streamq.runners`.

        ``python -m worker`` runs a runner unless ``RUNNER_<NAME>_IS_ENABLED`` is false
        (see :attr:`runner_config`).

        Raises:
            RegistrationError: the name is malformed or taken, the function is not async,
                or the renewal interval is over half the lease.
        """
        from streamq import runners

        opts: dict[str, Any] = {"singleton": singleton, "every": every,
                                "renew_interval": renew_interval}
        if lease is not None:
            opts["lease"] = lease
        if restart_backoff is not None:
            opts["restart_backoff"] = restart_backoff
        runners.runner_spec(name, _probe, **opts)  # refuse bad options at the decorator call

        def decorate(fn: RunnerFn[StateT]) -> RunnerFn[StateT]:
            self._runner_service().add(runners.runner_spec(name, fn, **opts))
            return fn

        return decorate

    @property
    def runners(self) -> dict[str, RunnerSpec]:
        """The declared runners by name (the entry point reads their flags from these)."""
        return dict(self._runners.specs) if self._runners is not None else {}

    @property
    def runner_config(self) -> RunnerConfig:
        """Which runners run in this process (default: all). Set it before the worker starts.

        Raises (on set):
            ConfigurationError: the config names a runner that is not declared.
        """
        from streamq.runners import RunnerConfig

        return self._runners.config if self._runners is not None else RunnerConfig()

    @runner_config.setter
    def runner_config(self, config: RunnerConfig) -> None:
        from streamq.runners import RunnerService

        # With no runner declared, a throwaway service still refuses the names it is given.
        (self._runners or RunnerService()).configure(config)

    def _runner_service(self) -> RunnerService:
        from streamq.runners import RunnerService

        if self._runners is None:
            self._runners = RunnerService()
            self.add_service(self._runners)
        return self._runners

    def schedule(
        self,
        name: str,
        job: JobSpec[P],
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str = "UTC",
        payload: P | dict[str, Any] | PayloadFactory[P] | None = None,
        missed: Missed = "skip",
        grace: Duration | None = None,
        enabled: bool = True,
    ) -> Schedule[P]:
        """Enqueue ``job`` periodically: one job per tick across every worker of the fleet.

        Every worker consuming the job's queue runs the scheduler; ticks are read on the
        Redis clock and each tick's job id, ``sched:<name>:<tick ms>``, is deduplicated, so
        any number of replicas enqueue each tick once (see :mod:`streamq.schedules`).

        Args:
            name: the schedule's name (``[a-z0-9-]``), unique in the app.
            job: a job of a queue contract (``Maintenance.retention``).
            cron: a cron expression (5 fields, or 6 with seconds first), in ``timezone``.
            every: a fixed interval (timedelta or seconds, at least 0.1 s); ticks fall on
                its multiples since the epoch. Give ``cron`` or ``every``.
            timezone: an IANA zone for ``cron`` (and the ticks handed to ``payload``).
            payload: the job's payload (a model or a mapping, checked now), or a function
                of the tick (an aware datetime) or of nothing, sync or async, returning it.
                Default: the model built with no arguments.
            missed: ticks older than ``grace`` when first seen due (no scheduler ran):
                ``"skip"`` them, or run ``"once"`` for all of them.
            grace: how late a tick may still run as on time (default 30 s, at most the
                interval of an ``every`` schedule).
            enabled: run it at all (``python -m worker`` also reads
                ``SCHEDULE_<NAME>_IS_ENABLED``).

        Example::

            app.schedule("retention", Maintenance.retention, cron="0 3 * * *",
                         timezone="Europe/Berlin", payload=Retention(days=30))
            app.schedule("metering", Maintenance.meter, every=timedelta(minutes=5),
                         payload=lambda tick: Meter(at=tick.isoformat()))

        Raises:
            ConfigurationError: a malformed argument (see :class:`Schedule`).
            RegistrationError: the name is taken.
        """
        made = Schedule(name, job, cron=cron, every=every, timezone=timezone,
                        payload=payload, missed=missed, grace=grace, enabled=enabled)
        if self.scheduler is None:
            self.scheduler = Scheduler()
            self.add_service(self.scheduler)
        self.scheduler.add(made)
        return made

    @property
    def schedules(self) -> dict[str, Schedule[Any]]:
        """The declared schedules by name (the entry point reads their flags from these)."""
        return dict(self.scheduler.schedules) if self.scheduler is not None else {}

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """Which schedules run in this process (default: all). Set it before the worker
        starts.

        Raises (on set):
            ConfigurationError: the config disables a schedule that is not declared.
        """
        return self.scheduler.config if self.scheduler is not None else SchedulerConfig()

    @scheduler_config.setter
    def scheduler_config(self, config: SchedulerConfig) -> None:
        # With no schedule declared, a throwaway scheduler still refuses the names given.
        (self.scheduler or Scheduler()).configure(config)

    def add_service(self, service: Any) -> None:
        """Run ``service`` (a :class:`streamq.services.Service`) in every worker of this app."""
        self.services.append(service)

    def processor(
        self,
        target: type[QueueContract] | JobSpec[Any],
        *,
        batch: Batch | None = None,
        **options: Unpack[ProcessorOptions],
    ) -> Callable[[F], F]:
        """Register the decorated function as the processor of a queue or of one job.

        ``target`` is a queue contract (the function handles all its jobs) or one job spec
        (``Ingestion.ingest_event``). Keyword options are :class:`WorkerOptions` fields and
        apply to the whole queue; give them once per queue.

        With ``batch=Batch(max_size, max_wait)`` (a whole queue only) the function takes a
        ``list[Job[P]]``: it completes the jobs by returning, fails them all by raising,
        and fails single ones with :meth:`Job.fail`.

        The processor is called with the job only: ``fn(job)``.

        Raises:
            RegistrationError: the job is not declared by the contract; the decorated object
                is not callable, is a generator function (sync or async), or has required
                parameters besides the job; its ``Job[...]`` annotation does not match the
                payload type; the job or queue already has a processor; or options are given
                twice for one queue.
        """
        if isinstance(target, JobSpec):
            if target.queue is None or target.queue.jobs.get(target.name) is not target:
                raise RegistrationError(
                    f"job {target.name!r} is not declared by any queue contract", job=target.name
                )
            contract = target.queue
            models: list[type[BaseModel]] = [target.model]
            job_name: str | None = target.name
        elif isinstance(target, type) and issubclass(target, QueueContract):
            contract = target
            models = [s.model for s in target.jobs.values()]
            job_name = None
        else:
            raise RegistrationError(
                f"@app.processor needs a QueueContract or a JobSpec, got {target!r}"
            )
        opts = WorkerOptions().merged(**options) if options else WorkerOptions()
        _check_batch(batch, contract, job_name)

        def decorate(fn: F) -> F:
            _check_signature(fn, contract, job_name)
            _check_annotation(fn, contract, job_name, models, batch=batch is not None)
            reg = self.registrations.get(contract.queue_name)
            if reg is None:
                reg = Registration(contract, opts, options_given=bool(options))
                self.registrations[contract.queue_name] = reg
            elif options:
                if reg.options_given and reg.options != opts:
                    raise RegistrationError(
                        f"queue {contract.queue_name!r}: options were already given by another "
                        "@app.processor; give queue options once",
                        queue=contract.queue_name,
                    )
                reg.options, reg.options_given = opts, True
            _check_batch_mix(reg, batch, job_name)
            if job_name is None:
                if reg.default is not None:
                    raise RegistrationError(
                        f"queue {contract.queue_name!r} already has a processor",
                        queue=contract.queue_name,
                    )
                reg.default = fn
                reg.batch = batch
            else:
                if job_name in reg.by_job:
                    raise RegistrationError(
                        f"job {job_name!r} of queue {contract.queue_name!r} already has a "
                        "processor",
                        queue=contract.queue_name,
                        job=job_name,
                    )
                reg.by_job[job_name] = fn
            return fn

        return decorate

    def registration(self, queue_name: str) -> Registration | None:
        """The registration covering lane ``queue_name`` (primary or secondary)."""
        for reg in self.registrations.values():
            if any(lane.name == queue_name for lane in reg.contract.lanes()):
                return reg
        return None

    def lane_names(self) -> list[str]:
        """Every lane that has a processor, primary and secondary."""
        return [lane.name for r in self.registrations.values() for lane in r.contract.lanes()]


async def _probe(_ctx: Any) -> None:
    """Stands for the runner function while its options are checked."""


def _check_batch(batch: object, contract: type[QueueContract], job_name: str | None) -> None:
    if batch is None:
        return
    if not isinstance(batch, Batch):
        raise RegistrationError(f"batch must be a streamq.Batch, got {batch!r}",
                                queue=contract.queue_name)
    if job_name is not None:
        raise RegistrationError(
            f"a batch processor handles a whole queue: decorate it with the contract "
            f"{contract.__name__}, not one job ({job_name!r})",
            queue=contract.queue_name, job=job_name,
        )


def _check_batch_mix(reg: Registration, batch: Batch | None, job_name: str | None) -> None:
    queue = reg.contract.queue_name
    if batch is not None and reg.by_job:
        raise RegistrationError(
            f"queue {queue!r} has per-job processors: a batch processor must handle every "
            "job of its queue", queue=queue,
        )
    if job_name is not None and reg.batch is not None:
        raise RegistrationError(f"queue {queue!r} has a batch processor already",
                                queue=queue, job=job_name)


def _check_signature(fn: object, contract: type[QueueContract], job_name: str | None) -> None:
    """Refuse what cannot run as ``fn(job)``, at decoration instead of on the first job.

    A generator function would return a generator that nobody iterates: the job would
    "complete" without its body ever running.
    """
    queue = contract.queue_name
    where = f"job {job_name!r} of queue {queue!r}" if job_name else f"queue {queue!r}"
    name = getattr(fn, "__qualname__", None) or repr(fn)

    def refuse(why: str) -> RegistrationError:
        return RegistrationError(
            f"@app.processor for {where}: {name} {why}", queue=queue, job=job_name
        )

    if not callable(fn):
        raise refuse("is not callable (decorate a function: def process(job): ...)")
    # A function, a method or a partial of one; or an object whose class defines __call__.
    calls = (fn, getattr(type(fn), "__call__", None))  # noqa: B004
    if any(inspect.isasyncgenfunction(c) for c in calls):
        raise refuse("is an async generator function; a processor returns, it does not yield")
    if any(inspect.isgeneratorfunction(c) for c in calls):
        raise refuse("is a generator function; a processor returns, it does not yield")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): it is called with the job all the same
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise refuse("must take the job as its first positional parameter")
    extra = [
        p.name
        for p in positional[1:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
        if p.default is p.empty
    ]
    if extra:
        raise refuse(
            f"has required parameters besides the job ({', '.join(extra)}); it is called "
            "with the job only: give them defaults, or bind them with functools.partial"
        )


def _payload_type(fn: Callable[..., Any], *, batch: bool = False) -> Any:
    """The ``P`` of the first parameter's ``Job[P]`` annotation (``list[Job[P]]`` for a
    batch processor), or None when absent."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    params = list(inspect.signature(fn).parameters)
    if not params:
        raise RegistrationError(f"processor {fn.__qualname__} must take one argument (the job)")
    hint = hints.get(params[0])
    if hint is None:
        return None
    if batch:
        origin = get_origin(hint)
        if origin not in (list, Sequence, collections.abc.Sequence) or not get_args(hint):
            raise RegistrationError(
                f"batch processor {fn.__qualname__}: its first parameter must be annotated "
                f"list[Job[...]], got {hint!r}"
            )
        hint = get_args(hint)[0]
    if get_origin(hint) is Job or hint is Job:
        args = get_args(hint)
        return args[0] if args else None
    raise RegistrationError(
        f"processor {fn.__qualname__}: its first parameter must be annotated Job[...], "
        f"got {hint!r}"
    )


def _check_annotation(
    fn: Callable[..., Any],
    contract: type[QueueContract],
    job_name: str | None,
    models: list[type[BaseModel]],
    *,
    batch: bool = False,
) -> None:
    declared = _payload_type(fn, batch=batch)
    if declared is None or declared is Any or declared is BaseModel:
        return
    accepted: tuple[Any, ...]
    if get_origin(declared) in (Union, types.UnionType):
        accepted = get_args(declared)
    else:
        accepted = (declared,)
    for m in models:
        if not any(isinstance(a, type) and issubclass(m, a) for a in accepted):
            where = f"job {job_name!r}" if job_name else f"queue {contract.queue_name!r}"
            raise RegistrationError(
                f"processor {fn.__qualname__} takes Job[{_name(declared)}] but {where} "
                f"carries {m.__name__} payloads",
                queue=contract.queue_name,
                job=job_name,
            )


def _name(t: Any) -> str:
    return getattr(t, "__name__", repr(t))
