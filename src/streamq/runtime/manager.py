"""WorkerManager: registers consumers and owns their lifecycle and connections.

Example::

    manager = WorkerManager(redis_url="redis://localhost:6379/0")
    manager.register_app(app)            # or manager.register(lane, registration, options)
    await manager.start()                # startup hooks, workers, then services (runners)
    ...
    await manager.close_workers()        # services, workers, then shutdown hooks
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from streamq import security
from streamq._redis import map_error
from streamq.app import App, Processor, Registration
from streamq.contracts import Lane, QueueContract
from streamq.errors import (
    ConfigurationError,
    IncompatibleContract,
    RedisOutOfMemory,
    RedisUnavailable,
    RegistrationError,
    UnsafeRedisConfig,
)
from streamq.hooks import Hooks
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from streamq.lifecycle import run_shutdown, run_startup
from streamq.options import WorkerOptions
from streamq.runtime.supervise import RedisStatus
from streamq.runtime.worker import Worker
from streamq.sentinel import SentinelURL
from streamq.services import Service
from streamq.tls import TLSConfig, check_tls_url, tls_options

__all__ = ["WorkerManager"]

_log = logging.getLogger("streamq.worker")


def default_consumer_name() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in XINFO."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class WorkerManager:
    """Consumes registered queues: one :class:`Worker` per queue lane.

    Args:
        redis_url: where Redis is (``redis://`` or ``rediss://``; a cluster with
            ``cluster=True``; a primary watched by Sentinel with
            ``redis+sentinel://host:port[,host:port...]/service[/db]``, see
            :class:`~streamq.sentinel.SentinelURL`). The manager opens its own
            connections: fetch, settle and a separate one for lock renewal.
        cluster: connect with ``RedisCluster``; each shard is then read on its own.
        prefix: key prefix shared with producers.
        group: the consumer group name.
        hooks: instrumentation (metrics, tracing, logs).
        consumer_name: this process's consumer name (default ``<host>-<pid>-<rand>``).
        allow_unsafe_eviction: start even when Redis's ``maxmemory-policy`` is not
            ``noeviction`` (a warning is logged instead of ``UnsafeRedisConfig``).
        refuse_incompatible_contract: refuse to start (``IncompatibleContract``) when the
            contract recorded in Redis by producers or other workers cannot be read by this
            worker's contract; when False the differences are logged at ERROR and the worker
            starts.
        check_permissions: before consuming, check that the Redis ACL user has every
            command and key the worker role needs (:func:`streamq.security.check_permissions`)
            and refuse to start (``PermissionsMissing``) otherwise.
        tls: TLS settings for a ``rediss://`` URL (:class:`streamq.TLSConfig`); certificates
            are verified unless it says otherwise.
    """

    def __init__(
        self,
        *,
        redis_url: str,
        cluster: bool = False,
        prefix: str = DEFAULT_PREFIX,
        group: str = DEFAULT_GROUP,
        hooks: Hooks | None = None,
        consumer_name: str | None = None,
        allow_unsafe_eviction: bool = False,
        refuse_incompatible_contract: bool = True,
        check_permissions: bool = True,
        tls: TLSConfig | None = None,
    ) -> None:
        check_tls_url(redis_url, tls)
        self.redis_url = redis_url
        self.cluster = cluster
        self._sentinel = SentinelURL.parse(redis_url) if SentinelURL.matches(redis_url) else None
        if self._sentinel is not None and cluster:
            raise ConfigurationError(
                "a redis+sentinel:// URL names one primary, not a Redis Cluster: "
                "use cluster=False, or a redis:// URL of a cluster node"
            )
        self.prefix = prefix
        self.group = group
        self.hooks = hooks or Hooks()
        self.consumer = consumer_name or default_consumer_name()
        self.allow_unsafe_eviction = allow_unsafe_eviction
        self.refuse_incompatible_contract = refuse_incompatible_contract
        self.check_permissions = check_permissions
        self.tls = tls
        self.redis_status = RedisStatus(self.hooks)
        self._pending: dict[str, tuple[Lane, Registration, WorkerOptions]] = {}
        self._services: list[Service] = []
        self._started_services: list[Service] = []
        self.state: Any = None
        self._startup_hooks: list[Any] = []
        self._shutdown_hooks: list[Any] = []
        self._hooks_started = False
        self._workers: dict[str, Worker] = {}
        self._clients: list[Any] = []
        self._sync_clients: list[Any] = []
        self.started = False
        self.last_redis_ok = time.monotonic()

    # -- registration ----------------------------------------------------------------------
    def register(
        self,
        queue: Lane | type[QueueContract],
        processor: Registration | Processor,
        options: WorkerOptions | None = None,
    ) -> None:
        """Consume ``queue`` (a lane, or a contract's primary lane) with ``processor``.

        ``processor`` is an app's :class:`Registration`, or a plain function taking a
        ``Job[...]`` (async or sync) that handles every job of the queue.

        Raises:
            RegistrationError: the queue is already registered, the manager started, or
                ``processor`` is neither a registration nor a valid processor function.
        """
        if isinstance(queue, type) and issubclass(queue, QueueContract):
            lane = queue.primary
        elif isinstance(queue, Lane):
            lane = queue
        else:
            raise RegistrationError(f"register() needs a QueueContract or a Lane, got {queue!r}")
        if not isinstance(processor, Registration):
            processor = self._wrap_function(lane, processor)
        if lane.name in self._pending:
            raise RegistrationError(f"queue {lane.name!r} is already registered", queue=lane.name)
        if self.started:
            raise RegistrationError("register queues before start()", queue=lane.name)
        if processor.contract is not lane.contract:
            raise RegistrationError(
                f"processor of queue {processor.contract.queue_name!r} cannot consume "
                f"{lane.name!r}",
                queue=lane.name,
            )
        opts = options or processor.options
        _check_tenant_cap(lane, processor, opts)
        self._pending[lane.name] = (lane, processor, opts)

    @staticmethod
    def _wrap_function(lane: Lane, fn: Any) -> Registration:
        if not callable(fn):
            raise RegistrationError(
                f"queue {lane.name!r}: the processor must be a function taking a Job, got "
                f"{fn!r}", queue=lane.name,
            )
        app = App([lane.contract])
        app.processor(lane.contract)(fn)  # the same checks as @app.processor
        reg = app.registration(lane.name)
        assert reg is not None
        return reg

    def register_app(
        self,
        app: App[Any],
        *,
        queues: Iterable[str] | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Register ``app``'s processors for ``queues`` (lane names; default: primary lanes).

        ``overrides`` maps a lane name to option overrides (``{"ingestion": {"concurrency":
        50}}``). Returns the registered lane names. The app's services (runners), startup
        and shutdown hooks and state come along.
        """
        names = list(queues) if queues is not None else [
            r.contract.primary.name for r in app.registrations.values()
        ]
        for service in app.services:
            if all(s is not service for s in self._services):
                self.add_service(service)
        self._take_lifecycle(app)
        for name in names:
            reg = app.registration(name)
            if reg is None:
                raise RegistrationError(f"no processor is registered for queue {name!r}",
                                        queue=name)
            lane = next(lane for lane in reg.contract.lanes() if lane.name == name)
            opts = reg.options.merged(**dict((overrides or {}).get(name, {})))
            self.register(lane, reg, opts)
        return names

    def _take_lifecycle(self, app: App[Any]) -> None:
        if app.state is not None:
            if self.state is not None and self.state is not app.state:
                raise RegistrationError("two apps with different state objects are registered")
            self.state = app.state
        for mine, theirs in ((self._startup_hooks, app.startup_hooks),
                             (self._shutdown_hooks, app.shutdown_hooks)):
            mine.extend(fn for fn in theirs if all(fn is not f for f in mine))

    def add_service(self, service: Service) -> None:
        """Run ``service`` in this process beside the consumers (see :mod:`streamq.services`).

        Raises:
            RegistrationError: the manager started, or a service of that name is added.
        """
        if self.started:
            raise RegistrationError("add services before start()")
        if any(s.name == service.name for s in self._services):
            raise RegistrationError(f"a service named {service.name!r} is already added")
        self._services.append(service)

    def registered_queue_names(self) -> list[str]:
        """Lane names registered, in registration order."""
        return list(self._pending)

    def get_worker(self, name: str) -> Worker | None:
        """The running worker of lane ``name`` (None before start or when not registered)."""
        return self._workers.get(name)

    @property
    def workers(self) -> list[Worker]:
        return list(self._workers.values())

    # -- lifecycle -------------------------------------------------------------------------
    def _async_client(self, socket_timeout: float | None) -> Any:
        kw: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": 5,
                              **tls_options(self.tls)}
        if self._sentinel is not None:
            client: Any = self._sentinel.async_client(health_check_interval=15, **kw)
        elif self.cluster:
            client = aioredis.RedisCluster.from_url(self.redis_url, **kw)
        else:
            client = aioredis.Redis.from_url(self.redis_url, health_check_interval=15, **kw)
        self._clients.append(client)
        return client

    def _sync_client(self) -> Any:
        kw: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 5,
                              **tls_options(self.tls)}
        if self._sentinel is not None:
            client: Any = self._sentinel.sync_client(**kw)
        elif self.cluster:
            client = redis.RedisCluster.from_url(self.redis_url, **kw)
        else:
            client = redis.Redis.from_url(self.redis_url, **kw)
        self._sync_clients.append(client)
        return client

    async def check_redis(self, client: Any) -> None:
        """Refuse a Redis whose eviction policy could silently drop queue keys."""
        try:
            cfg = await client.config_get("maxmemory-policy")
        except Exception as exc:
            mapped = map_error(exc)
            if isinstance(mapped, RedisUnavailable):
                raise mapped from exc
            # CONFIG is often disabled on managed Redis, and a least-privilege ACL user has no
            # CONFIG GET (it would read every setting, passwords included): say so, go on.
            _log.warning("cannot read maxmemory-policy; make sure it is noeviction",
                         extra={"error": repr(exc)})
            return
        values = cfg.values() if isinstance(cfg, dict) else []
        policy = next(iter(values), b"noeviction")
        policy = policy.decode() if isinstance(policy, bytes) else str(policy)
        if policy != "noeviction":
            msg = (
                f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis may evict "
                "queue keys and lose jobs. Set it to 'noeviction'"
            )
            if not self.allow_unsafe_eviction:
                raise UnsafeRedisConfig(msg + " (or pass allow_unsafe_eviction=True).")
            _log.warning(msg + "; starting anyway as allowed.")

    async def start(self) -> None:
        """Connect, check Redis, run the startup hooks, create groups and start every
        registered worker, then the services (runners).

        Raises:
            StartupHookFailed: a startup hook raised; no worker started (the shutdown hooks
                ran, and the connections are closed).
        """
        if self.started:
            return
        if not self._pending and not self._services:
            raise ConfigurationError("no queue registered: nothing to consume")
        client = self._async_client(socket_timeout=10)
        try:
            await self.check_redis(client)
            if self.check_permissions:
                await security.check_permissions(client, "worker", prefix=self.prefix)
        except BaseException:
            await self.close_workers()  # no worker yet: closes the connection just opened
            raise
        for name, (lane, reg, opts) in self._pending.items():
            # One fetch client per reader: a blocking read holds its connection, and on a
            # cluster each shard has its own reader (redis-py's async cluster client loses
            # replies when blocking reads share it).
            readers = lane.shards if self.cluster else 1
            fetch = [
                self._async_client(socket_timeout=opts.block_timeout_ms / 1000 + 5)
                for _ in range(readers)
            ]
            self._workers[name] = Worker(
                lane=lane,
                registration=reg,
                options=opts,
                client=client,
                fetch_clients=fetch,
                renew_client=self._sync_client(),
                prefix=self.prefix,
                group=self.group,
                consumer=self.consumer,
                hooks=self.hooks,
                cluster=self.cluster,
                status=self.redis_status,
            )
        self.started = True
        try:
            await self._run_startup_hooks()
            for w in self._workers.values():
                await self._check_contract(client, w)
                await w.start()
            await self._start_services(client)
        except BaseException:
            await self.close_workers()
            raise
        _log.info("worker started", extra={"consumer": self.consumer,
                                           "queues": list(self._workers)})

    async def _check_contract(self, client: Any, w: Worker) -> None:
        """Compare the contract recorded in Redis with this worker's, then record ours."""
        from streamq import fingerprint

        keys = w.keys
        breaking = await fingerprint.check_contract(client, keys, w.contract)
        if breaking:
            msg = (
                f"queue {w.name!r}: the contract recorded in Redis by producers or workers of "
                f"another version is incompatible with this worker's: {'; '.join(breaking)}"
            )
            if self.refuse_incompatible_contract:
                raise IncompatibleContract(
                    msg + " (deploy compatible versions, or pass "
                    "refuse_incompatible_contract=False; under python -m worker set "
                    "WORKER_REFUSE_INCOMPATIBLE_CONTRACT=false)",
                    changes=breaking,
                )
            _log.error(msg + "; starting anyway as configured", extra={"queue": w.name})
        try:
            await fingerprint.record_contract(client, keys, w.contract)
        except RedisOutOfMemory:
            # Redis at maxmemory refuses the write: start anyway, draining frees memory.
            _log.warning("cannot record the contract: Redis is out of memory; starting "
                         "anyway", extra={"queue": w.name})

    async def _run_startup_hooks(self) -> None:
        self._hooks_started = True
        await run_startup(self._startup_hooks, self.state)

    async def _start_services(self, client: Any) -> None:
        from streamq.services import ServiceContext

        ctx = ServiceContext(
            client=client, sync_client=self._sync_client,
            async_client=lambda: self._async_client(socket_timeout=10), prefix=self.prefix,
            consumer=self.consumer, hooks=self.hooks, status=self.redis_status,
            lanes=list(self._workers), state=self.state,
        )
        for service in self._services:
            self._started_services.append(service)
            await service.start(ctx)

    async def close_workers(self, timeout_s: float | None = None) -> None:
        """Graceful shutdown: services first, then every worker (see :meth:`Worker.close`),
        then the shutdown hooks, then disconnect."""
        services, self._started_services = self._started_services, []
        for service in reversed(services):
            try:
                await service.close()
            except Exception:
                _log.exception("service failed to close", extra={"service": service.name})
        await asyncio.gather(*(w.close(timeout_s) for w in self._workers.values()))
        if self._hooks_started:
            self._hooks_started = False
            await run_shutdown(self._shutdown_hooks, self.state)
        for c in self._clients:
            await c.aclose()
        for c in self._sync_clients:
            c.close()
        self._clients.clear()
        self._sync_clients.clear()

    async def run_until_signal(
        self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> signal.Signals:
        """Start (if not started), run until one of ``signals`` arrives, then shut down.

        Shutdown is :meth:`close_workers`: running jobs get their shutdown timeout, the rest
        are released for other workers. The handlers are removed once the first signal
        arrives, so a second one stops the process the default way (a forced exit).
        Returns the signal received.

        Example::

            async def main() -> None:
                manager = WorkerManager(redis_url="redis://localhost:6379/0")
                manager.register_app(app)
                await manager.run_until_signal()
        """
        loop = asyncio.get_running_loop()
        received: asyncio.Future[signal.Signals] = loop.create_future()
        wanted = list(signals)

        def on_signal(sig: signal.Signals) -> None:
            if not received.done():
                received.set_result(sig)

        for sig in wanted:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await self.start()
            got = await received
        finally:
            for sig in wanted:
                loop.remove_signal_handler(sig)
        _log.info("signal received; shutting down", extra={"signal": got.name,
                                                             "consumer": self.consumer})
        await self.close_workers()
        return got

    async def __aenter__(self) -> WorkerManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_workers()

    async def queue_idle(self, w: Worker) -> bool:
        """True when the lane has nothing ready, running or delayed, here or in Redis."""
        if not w.local_idle():
            return False
        pipe = w.client.pipeline(transaction=False)
        for s in w.shards:
            pipe.xlen(s.stream)
            pipe.zcard(s.delayed)
        counts = await pipe.execute()
        return not any(counts)

    async def run_until_idle(self, timeout_s: float = 10.0) -> None:
        """Wait until every registered lane is idle (nothing ready, delayed or running).

        Raises:
            TimeoutError: not idle within ``timeout_s``; the message says what is left.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            idle = [await self.queue_idle(w) for w in self._workers.values()]
            if all(idle):
                return
            if time.monotonic() > deadline:
                left = {w.name: w.stats() for w in self._workers.values()}
                raise TimeoutError(f"queues not idle after {timeout_s} s: {left}")
            await asyncio.sleep(0.02)


def _check_tenant_cap(lane: Lane, reg: Registration, options: WorkerOptions) -> None:
    """Refuse a ``tenant_concurrency`` that cannot be applied, instead of ignoring it."""
    if options.tenant_concurrency is None:
        return
    if not lane.contract.tenant_field:
        raise RegistrationError(
            f"queue {lane.name!r}: tenant_concurrency needs a tenant_field on the contract "
            f"({lane.contract.__name__})", queue=lane.name,
        )
    if reg.batch is not None:
        raise RegistrationError(
            f"queue {lane.name!r}: tenant_concurrency does not apply to a batch processor",
            queue=lane.name,
        )
