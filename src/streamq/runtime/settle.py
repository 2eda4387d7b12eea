"""Settling finished jobs: coalesced, fenced calls whose confirmed result is each job's outcome.

Completions of one shard become one ``complete`` call, releases likewise; retries and dead
letters are one call each; all of a flush go in one pipelined round trip. At most one flush is
in flight: settles that arrive meanwhile join the next one. A flush goes once ``concurrency``
settles are pending, or ``settle_delay`` (2 ms by default) after the first, so jobs that finish
at staggered times (processors doing real I/O) still share a call. The lane's next read rides
in the same round trip (a non-blocking ``XREADGROUP``, see :class:`Rider`): under load, one
round trip settles a batch and fetches the next.

Every call carries a token. A call whose reply was lost (connection dropped, Redis restarted
after the write) is sent again with the **same** token, and the script answers with the reply
it stored the first time: a re-send never turns "completed" into "lock lost". Each call's
reply is resolved on its own: when one call of a pipeline fails (OOM, a refusal) only that
call is sent again, the ones that landed are resolved. Nothing is ever dropped: a flush that
fails is retried with backoff until the worker stops (then :meth:`Settler.abandon` resolves
what is left as unsettled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from streamq import ops
from streamq._redis import Call, run_calls_each
from streamq.keys import ShardKeys
from streamq.runtime.context import LaneContext, new_token

__all__ = ["Rider", "SettleOp", "Settler"]

_log = logging.getLogger("streamq.worker")

Kind = Literal["complete", "release", "retry", "fail"]
Status = ops.SettleStatus


@dataclass(slots=True)
class SettleOp:
    """One settle.

    ``build(token)`` makes the call for retry and fail (complete and release are batched per
    shard). ``then(status)`` runs once Redis answered: ``APPLIED``, ``OTHER_OWNER``, ``GONE``;
    or ``None`` when the worker stopped before any answer came.
    """

    kind: Kind
    shard: ShardKeys
    entry_id: str
    build: Callable[[str], Call] | None = None
    then: Callable[[Status | None], None] | None = None
    batch: Callable[[list[SettleOp], str], Call] | None = None
    """When set, ops of one shard with the same ``batch`` share one call ``batch(ops, token)``
    whose reply is one status per op (tracked jobs' completions)."""


@dataclass(slots=True)
class Rider:
    """A call sent in the same round trip as a flush (the lane's next read), and what to do
    with its reply (or the exception that call or the round trip got)."""

    call: Call
    done: Callable[[Any], None]


@dataclass(slots=True)
class _Sent:
    """A built call, its token and the ops it settles; kept as-is for re-sends."""

    call: Call
    ops: list[SettleOp]
    batched: bool
    tries: int = 0
    errors: list[str] = field(default_factory=list)


class Settler:
    """Collects settles and flushes them; see the module doc.

    ``on_settled(op, status)`` runs for every op as its answer arrives, before ``op.then``.
    ``on_error(exc)`` is told of every failed flush or call; ``on_ok()`` of every flush that
    went through.
    """

    def __init__(
        self,
        ctx: LaneContext,
        *,
        on_settled: Callable[[SettleOp, Status | None], None],
        on_error: Callable[[BaseException], None],
        on_ok: Callable[[], None],
        delay_s: float = 0.0,
        batch_target: int = 1,
    ) -> None:
        self.ctx = ctx
        # A settle waits up to delay_s for company unless batch_target settles are pending:
        # jobs that finish at staggered times (real I/O) share one call instead of one each.
        self.delay_s = delay_s
        self.batch_target = max(1, batch_target)
        self.on_settled = on_settled
        self.on_error = on_error
        self.on_ok = on_ok
        self.rider: Callable[[], Rider | None] | None = None
        self._pending: list[SettleOp] = []
        self._resend: list[_Sent] = []
        self._first_at = 0.0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.flushes = 0
        self.resends = 0
        self.rides = 0

    def submit(self, op: SettleOp) -> None:
        """Queue ``op`` for the next flush."""
        pending = self._pending
        pending.append(op)
        if len(pending) == 1:
            self._first_at = asyncio.get_running_loop().time()
            self._idle.clear()
            self._wake.set()
        elif len(pending) >= self.batch_target:
            self._wake.set()

    @property
    def pending(self) -> int:
        """Ops not answered yet (queued or waiting for a re-send)."""
        return len(self._pending) + sum(len(s.ops) for s in self._resend)

    async def run(self) -> None:
        """Flush whenever something is pending, until cancelled; backs off while failing.

        When cancelled, whatever is still unanswered is resolved as unsettled: no job task
        may wait forever for an answer that will never come.
        """
        try:
            await self._run()
        except asyncio.CancelledError:
            self.abandon()
            raise

    async def _gather(self) -> None:
        """Wait until batch_target settles are pending, or delay_s after the first one."""
        loop = asyncio.get_running_loop()
        deadline = self._first_at + self.delay_s
        while len(self._pending) < self.batch_target:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    async def _run(self) -> None:
        delay = 0.05
        while True:
            if not self._pending and not self._resend:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            if self.delay_s > 0 and not self._resend:
                await self._gather()
            self._wake.clear()
            try:
                failed = await self._flush()
            except Exception as exc:
                # The whole round trip failed (connection lost): everything is kept.
                self.on_error(exc)
                failed = True
            if failed:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                delay = 0.05

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every op got its answer; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def abandon(self) -> int:
        """Resolve every op still unanswered as unsettled (``None``); returns how many."""
        left = [*self._pending, *(op for s in self._resend for op in s.ops)]
        self._pending, self._resend = [], []
        for op in left:
            self._resolve(op, None)
        self._idle.set()
        return len(left)

    # -- building and sending ------------------------------------------------------------------
    def _build(self, batch: list[SettleOp]) -> list[_Sent]:
        ctx = self.ctx
        grouped: dict[tuple[Kind, int], list[SettleOp]] = {}
        custom: dict[tuple[Any, int], list[SettleOp]] = {}
        sent: list[_Sent] = []
        for op in batch:
            if op.batch is not None:
                custom.setdefault((op.batch, op.shard.index), []).append(op)
            elif op.build is not None:
                sent.append(_Sent(op.build(new_token()), [op], batched=False))
            else:
                grouped.setdefault((op.kind, op.shard.index), []).append(op)
        for (kind, _), group_ops in grouped.items():
            wrap = ops.complete if kind == "complete" else ops.release
            call = wrap(group_ops[0].shard, ctx.group, ctx.consumer,
                        [o.entry_id for o in group_ops], token=new_token())
            sent.append(_Sent(call, group_ops, batched=True))
        for (make, _), group_ops in custom.items():
            sent.append(_Sent(make(group_ops, new_token()), group_ops, batched=True))
        return sent

    async def _flush(self) -> bool:
        """Send everything pending; True when some call failed (to back off)."""
        batch, self._pending = self._pending, []
        todo = self._resend + self._build(batch)
        self._resend = []
        ride = self.rider() if self.rider is not None and todo else None
        calls = [s.call for s in todo]
        if ride is not None:
            calls.append(ride.call)
        try:
            replies = await run_calls_each(self.ctx.client, calls, queue=self.ctx.name)
        except BaseException as exc:
            for s in todo:
                s.tries += 1
            self._resend = todo + self._resend
            if any(s.tries > 1 for s in todo):
                self.resends += 1
            if ride is not None:
                ride.done(exc)
            raise
        self.flushes += 1
        self.on_ok()
        if ride is not None:
            self.rides += 1
            ride.done(replies.pop())
        failed = False
        for s, reply in zip(todo, replies, strict=True):
            if isinstance(reply, BaseException):
                failed = True
                s.tries += 1
                self._resend.append(s)
                self.on_error(reply)
                if s.tries in (1, 10) or s.tries % 100 == 0:
                    _log.warning(
                        "a settle call failed; sending it again",
                        extra={"queue": self.ctx.name, "kind": s.ops[0].kind,
                               "jobs": len(s.ops), "tries": s.tries, "error": repr(reply)},
                    )
                continue
            if s.batched:
                for op, status in zip(s.ops, reply, strict=True):
                    self._resolve(op, Status(status))
            else:
                self._resolve(s.ops[0], Status(reply))
        return failed

    def _resolve(self, op: SettleOp, status: Status | None) -> None:
        try:
            self.on_settled(op, status)
            if op.then is not None:
                op.then(status)
        except Exception:
            # The rest of the batch must still resolve: their entries are held until then.
            _log.exception("settle callback failed", extra={"queue": self.ctx.name})
