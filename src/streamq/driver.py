"""A sans-IO command driver: an operation written once as a generator of Redis requests,
run by an asyncio client (:func:`drive`) or a synchronous one (:func:`drive_sync`).

The operation yields :class:`Cmds` (plain commands, one pipelined round trip) or
:class:`Scripts` (script calls, see :func:`streamq._redis.run_calls`) and receives the
replies; the two drivers only differ in how they send a request, so the async and sync admin
classes (dead letters, queue admin, schedules) can never drift apart. Redis errors map to
streamq's errors naming the queue.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import redis
import redis.asyncio as aioredis

from streamq._redis import Call, map_error, run_calls, run_calls_sync

__all__ = ["Cmds", "Scripts", "Steps", "cmd", "drive", "drive_sync", "is_cluster", "text"]

_T = TypeVar("_T")




@dataclass(frozen=True, slots=True)
class Cmds:
    """Plain Redis commands sent in one pipelined round trip: ``(method, args, kwargs)``.

    With ``raise_on_error=False`` a failed command's reply is its exception object.
    """

    cmds: Sequence[tuple[str, tuple[Any, ...], Mapping[str, Any]]]
    transaction: bool = False
    raise_on_error: bool = True


@dataclass(frozen=True, slots=True)
class Scripts:
    """Script calls sent in one pipelined round trip (see :func:`streamq._redis.run_calls`)."""

    calls: Sequence[Call]


Steps: TypeAlias = Generator[Cmds | Scripts, list[Any], _T]


def cmd(method: str, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], Mapping[str, Any]]:
    return (method, args, kwargs)


def is_cluster(client: Any) -> bool:
    return isinstance(client, redis.RedisCluster | aioredis.RedisCluster)


def _raise_mapped(exc: Exception, queue: str) -> None:
    mapped = map_error(exc, queue=queue)
    if mapped is not None:
        raise mapped from exc


async def drive(client: Any, queue: str, steps: Steps[_T]) -> _T:
    """Run ``steps`` against an asyncio client; Redis errors map to streamq's errors."""
    try:
        req = next(steps)
        while True:
            if isinstance(req, Scripts):
                reply = await run_calls(client, req.calls, queue=queue)
            else:
                try:
                    async with client.pipeline(transaction=req.transaction) as pipe:
                        for method, args, kwargs in req.cmds:
                            getattr(pipe, method)(*args, **kwargs)
                        reply = await pipe.execute(raise_on_error=req.raise_on_error)
                except Exception as exc:
                    _raise_mapped(exc, queue)
                    raise
            req = steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def drive_sync(client: Any, queue: str, steps: Steps[_T]) -> _T:
    """The synchronous twin of :func:`drive`."""
    try:
        req = next(steps)
        while True:
            if isinstance(req, Scripts):
                reply = run_calls_sync(client, req.calls, queue=queue)
            else:
                try:
                    with client.pipeline(transaction=req.transaction) as pipe:
                        for method, args, kwargs in req.cmds:
                            getattr(pipe, method)(*args, **kwargs)
                        reply = pipe.execute(raise_on_error=req.raise_on_error)
                except Exception as exc:
                    _raise_mapped(exc, queue)
                    raise
            req = steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def text(v: Any) -> str:
    if v is None:
        return ""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
