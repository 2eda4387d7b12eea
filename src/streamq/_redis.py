"""Running script calls against Redis, sync and async, with one shared plan.

A :class:`Call` is a script, its keys and args, and a parser for its reply. Producers and the
worker build calls with the wrappers in :mod:`streamq.ops`, then run a batch of them in one
pipelined round trip here. When Redis answers ``NOSCRIPT`` (a restart or ``SCRIPT FLUSH``), the
scripts are loaded again and only the calls that did not run are sent again: a call that ran
is never repeated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamq.errors import RedisOutOfMemory, RedisRefused, RedisUnavailable, StreamqError
from streamq.scripts import Script

__all__ = [
    "PERMANENT_REFUSALS",
    "TRANSIENT_REFUSALS",
    "AsyncClient",
    "Call",
    "SyncClient",
    "map_error",
    "refusal_code",
    "run_calls",
    "run_calls_each",
    "run_calls_sync",
]

AsyncClient: TypeAlias = "aioredis.Redis | aioredis.RedisCluster"
SyncClient: TypeAlias = "redis.Redis | redis.RedisCluster"
Arg: TypeAlias = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: the script, its KEYS and ARGV, and how to read its reply.

    ``command``, when given, is sent instead of the script: a transition that one Redis
    command performs atomically on its own needs no script (see :func:`streamq.ops.enqueue_ready`).
    """

    script: Script
    keys: Sequence[str]
    args: Sequence[Arg]
    parse: Callable[[Any], Any] = lambda reply: reply
    command: Sequence[Arg] | None = None

    def redis_args(self) -> Sequence[Arg]:
        """The command to send: ``command``, or the script's EVALSHA."""
        if self.command is not None:
            return self.command
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


TRANSIENT_REFUSALS = frozenset(
    {"READONLY", "NOREPLICAS", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN",
     "MOVED", "ASK"}
)
"""Error codes that mean "this node cannot serve the call right now": an outage, not a bug."""

PERMANENT_REFUSALS = frozenset({"NOPERM", "WRONGTYPE", "NOSCRIPT", "NOAUTH", "WRONGPASS"})
"""Error codes retrying cannot fix: the ACL, a key of the wrong type, a script not loadable."""

_REDIS_PY_CODES = {
    "ReadOnlyError": "READONLY",
    "BusyLoadingError": "LOADING",
    "NoPermissionError": "NOPERM",
    "NoScriptError": "NOSCRIPT",
    "AuthenticationError": "NOAUTH",
    "AuthenticationWrongNumberOfArgsError": "NOAUTH",
    "ClusterDownError": "CLUSTERDOWN",
    "TryAgainError": "TRYAGAIN",
    "MasterDownError": "MASTERDOWN",
}


def refusal_code(exc: BaseException) -> str | None:
    """The Redis error code of a refusal (``"READONLY"``, ``"NOPERM"``...), or None.

    redis-py strips the code from some replies and raises a class instead; a script's error
    keeps the code of the command that failed inside it (``"NOREPLICAS Not enough good
    replicas ... script: ..."``), or wraps it (``"ERR Error running script ... NOPERM ..."``).
    """
    if isinstance(exc, StreamqError) and exc.__cause__ is not None:
        return refusal_code(exc.__cause__)  # a mapped error: read the original
    code = _REDIS_PY_CODES.get(type(exc).__name__)
    if code is not None:
        return code
    if not isinstance(exc, ResponseError):
        return None
    msg = str(exc)
    first = msg.split(" ", 1)[0]
    if first in TRANSIENT_REFUSALS or first in PERMANENT_REFUSALS:
        return first
    if first in ("ERR", "Error") or msg.startswith("Error running script"):
        for word in msg.replace(":", " ").replace("-", " ").split():
            if word in TRANSIENT_REFUSALS or word in PERMANENT_REFUSALS:
                return word
    if "no permissions to" in msg or "has no permissions" in msg:
        return "NOPERM"
    return None


def map_error(
    exc: BaseException, *, queue: str | None = None, keys: Sequence[str] = ()
) -> StreamqError | None:
    """The streamq error for a redis-py exception, or None when it is not one we translate.

    Connection failures and transient refusals (:data:`TRANSIENT_REFUSALS`: a replica that
    became read-only in a failover, ``min-replicas-to-write`` not met, a loading or busy
    server) are :class:`RedisUnavailable`: an outage that ends by itself. Refusals that
    retrying cannot fix (:data:`PERMANENT_REFUSALS`) are :class:`RedisRefused`; a ``NOPERM``
    about keys names ``keys`` (the call's), since Redis does not say which one it refused.
    """
    if isinstance(exc, StreamqError):
        return exc
    where = f" (queue {queue!r})" if queue else ""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | ConnectionError | OSError):
        return RedisUnavailable(f"Redis is unreachable{where}: {exc}", queue=queue)
    if _is_oom(exc):
        return RedisOutOfMemory(
            f"Redis refused the write: it is at maxmemory{where}: {exc}", queue=queue
        )
    code = refusal_code(exc)
    if code in TRANSIENT_REFUSALS:
        return RedisUnavailable(f"Redis cannot serve the call now ({code}){where}: {exc}",
                                queue=queue)
    if code in PERMANENT_REFUSALS:
        hint = ""
        if code == "NOPERM":
            if keys and "keys" in str(exc):
                hint += f" (the call's keys: {', '.join(keys)})"
            hint += ("; grant it to the ACL user (streamq.security.acl_rules lists what each "
                     "role needs)")
        return RedisRefused(f"Redis refused the call ({code}){where}: {exc}{hint}",
                            queue=queue, reply=str(exc))
    return None


def _is_oom(exc: BaseException) -> bool:
    # redis-py strips the "OOM " prefix and raises OutOfMemoryError; a script's error (and
    # Redis 6.2's "ERR Error running script ... OOM ...") can arrive as a plain ResponseError.
    if isinstance(exc, OutOfMemoryError):
        return True
    msg = str(exc)
    return isinstance(exc, ResponseError) and (
        msg.startswith("OOM") or "used memory > 'maxmemory'" in msg
    )


def _raise_mapped(exc: BaseException, queue: str | None, keys: Sequence[str] = ()) -> None:
    mapped = map_error(exc, queue=queue, keys=keys)
    if mapped is None or mapped is exc:
        raise exc
    raise mapped from exc


def _is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


class _Batch:
    """The state of one batch across NOSCRIPT reloads: which calls still have to run."""

    def __init__(self, calls: Sequence[Call], queue: str | None) -> None:
        self.calls = calls
        self.queue = queue
        self.replies: list[Any] = [None] * len(calls)
        self.todo = list(range(len(calls)))

    def queue_on(self, pipe: Any) -> None:
        for i in self.todo:
            c = self.calls[i]
            # Not pipe.evalsha(): redis-py's ClusterPipeline blocks that method, while the raw
            # command is routed by its keys like any other (all of a call's keys share a slot).
            pipe.execute_command(*c.redis_args())

    def absorb(self, out: Sequence[Any]) -> set[Script]:
        """Record replies; return the scripts to load before the missing calls run again."""
        missing = [i for i, r in zip(self.todo, out, strict=True) if _is_noscript(r)]
        for i, r in zip(self.todo, out, strict=True):
            self.replies[i] = r
        self.todo = missing
        return {self.calls[i].script for i in missing}

    def each(self) -> list[Any]:
        out: list[Any] = []
        for c, r in zip(self.calls, self.replies, strict=True):
            if isinstance(r, BaseException):
                out.append(map_error(r, queue=self.queue, keys=c.keys) or r)
                continue
            try:
                out.append(c.parse(r))
            except Exception as exc:  # a reply of the wrong shape: that call failed
                out.append(exc)
        return out

    def result(self) -> list[Any]:
        for c, r in zip(self.calls, self.replies, strict=True):
            if isinstance(r, BaseException):
                _raise_mapped(r, self.queue, c.keys)
        return [c.parse(r) for c, r in zip(self.calls, self.replies, strict=True)]


_ATTEMPTS = 3


# A lone call (one add, one settle at concurrency 1) is sent as a plain command: a pipeline of
# one costs the same round trip plus redis-py's pipeline set-up and reset (an asyncio task per
# reset), which made a single add about 10% slower.
async def _run_one(client: Any, c: Call, queue: str | None) -> Any:
    for attempt in range(_ATTEMPTS):
        try:
            reply = await client.execute_command(*c.redis_args())
        except Exception as exc:
            if _is_noscript(exc) and attempt + 1 < _ATTEMPTS:
                await client.script_load(c.script.source)
                continue
            _raise_mapped(exc, queue, c.keys)
        return c.parse(reply)


def _run_one_sync(client: Any, c: Call, queue: str | None) -> Any:
    for attempt in range(_ATTEMPTS):
        try:
            reply = client.execute_command(*c.redis_args())
        except Exception as exc:
            if _is_noscript(exc) and attempt + 1 < _ATTEMPTS:
                client.script_load(c.script.source)
                continue
            _raise_mapped(exc, queue, c.keys)
        return c.parse(reply)


async def run_calls(
    client: Any, calls: Sequence[Call], *, queue: str | None = None
) -> list[Any]:
    """Run ``calls`` in one pipelined round trip (async); replies parsed, in order.

    Raises the first error any call returned, mapped to streamq's errors.
    """
    if len(calls) == 1:
        return [await _run_one(client, calls[0], queue)]
    return (await _pipelined(client, calls, queue)).result()


async def run_calls_each(
    client: Any, calls: Sequence[Call], *, queue: str | None = None
) -> list[Any]:
    """Like :func:`run_calls`, but each call's reply is resolved on its own.

    Returns, per call in order, its parsed reply or the (mapped) exception that call got: in
    a pipeline one call can fail (OOM, a refusal) while the others landed, and those must
    not be sent again. A failure of the whole round trip (connection lost) still raises.
    """
    return (await _pipelined(client, calls, queue)).each()


async def _pipelined(client: Any, calls: Sequence[Call], queue: str | None) -> _Batch:
    """Send ``calls`` in one pipeline, re-sending after a script reload only those that got
    ``NOSCRIPT``; the whole round trip failing raises (mapped)."""
    batch = _Batch(calls, queue)
    try:
        for _ in range(_ATTEMPTS):
            if not batch.todo:
                break
            async with client.pipeline(transaction=False) as pipe:
                batch.queue_on(pipe)
                out = await pipe.execute(raise_on_error=False)
            for s in batch.absorb(out):
                await client.script_load(s.source)
    except Exception as exc:
        _raise_mapped(exc, queue)
    return batch


def run_calls_sync(
    client: Any, calls: Sequence[Call], *, queue: str | None = None
) -> list[Any]:
    """The synchronous twin of :func:`run_calls`."""
    if len(calls) == 1:
        return [_run_one_sync(client, calls[0], queue)]
    batch = _Batch(calls, queue)
    try:
        for _ in range(_ATTEMPTS):
            if not batch.todo:
                break
            with client.pipeline(transaction=False) as pipe:
                batch.queue_on(pipe)
                out = pipe.execute(raise_on_error=False)
            for s in batch.absorb(out):
                client.script_load(s.source)
    except Exception as exc:
        _raise_mapped(exc, queue)
    return batch.result()
