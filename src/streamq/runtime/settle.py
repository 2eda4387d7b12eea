"""Settling finished jobs in batches: one pipelined round trip for everything pending.

Completions of one shard become one fenced ``complete`` call; releases likewise; retries and
dead letters are one call each, all in the same pipeline. While a flush is in flight, new
settles accumulate for the next one, so the batch grows with the load and a lone job is
settled at once. A flush that fails (Redis unreachable) is kept and tried again with
backoff: a settle is never dropped.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from streamq import ops
from streamq._redis import Call, run_calls
from streamq.hooks import Hooks
from streamq.keys import ShardKeys

__all__ = ["SettleOp", "Settler"]

_log = logging.getLogger("streamq.worker")

Kind = Literal["complete", "release", "retry", "fail"]


@dataclass(slots=True)
class SettleOp:
    """One settle. ``call`` is given for retry and fail; complete/release are batched.

    ``then(ok)`` runs when the settle lands: ok is True when applied, False when the lock was
    lost. (A plain callback, not a future per job: the hot path settles every job.)
    """

    kind: Kind
    shard: ShardKeys
    entry_id: str
    call: Call | None = None
    then: Callable[[bool], None] | None = None


class Settler:
    """Collects settles and flushes them in one pipeline per round trip."""

    def __init__(
        self,
        client: object,
        *,
        queue: str,
        group: str,
        consumer: str,
        hooks: Hooks,
        on_unavailable: Callable[[BaseException], None] | None = None,
        on_settled: Callable[[SettleOp, bool], None] | None = None,
    ) -> None:
        self.client = client
        # Called for each op as its flush lands (before the op's own ``then``).
        self.on_settled = on_settled
        self.queue = queue
        self.group = group
        self.consumer = consumer
        self.hooks = hooks
        self.on_unavailable = on_unavailable
        self._pending: list[SettleOp] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.flushes = 0

    def submit(self, op: SettleOp) -> None:
        """Queue ``op`` for the next flush."""
        self._pending.append(op)
        self._idle.clear()
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        """Flush whenever something is pending, until cancelled."""
        delay = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                try:
                    await self._flush()
                    delay = 0.05
                except Exception as exc:
                    self.hooks.redis_error(self.queue, exc)
                    if self.on_unavailable:
                        self.on_unavailable(exc)
                    _log.warning(
                        "settle flush failed; retrying",
                        extra={"queue": self.queue, "error": repr(exc), "pending": self.pending},
                    )
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                    delay = min(delay * 2, 5.0)
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is pending; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _calls(self, batch: list[SettleOp]) -> tuple[list[Call], list[list[SettleOp]]]:
        grouped: dict[tuple[Kind, int], list[SettleOp]] = {}
        calls: list[Call] = []
        owners: list[list[SettleOp]] = []
        for op in batch:
            if op.call is not None:
                calls.append(op.call)
                owners.append([op])
            else:
                grouped.setdefault((op.kind, op.shard.index), []).append(op)
        for (kind, _), group_ops in grouped.items():
            wrap = ops.complete if kind == "complete" else ops.release
            shard = group_ops[0].shard
            calls.append(wrap(shard, self.group, self.consumer, [o.entry_id for o in group_ops]))
            owners.append(group_ops)
        return calls, owners

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        calls, owners = self._calls(batch)
        try:
            replies = await run_calls(self.client, calls, queue=self.queue)
        except BaseException:
            self._pending[:0] = batch
            raise
        self.flushes += 1
        for group_ops, reply in zip(owners, replies, strict=True):
            if isinstance(reply, list):
                lost = set(reply)
                for op in group_ops:
                    self._resolve(op, op.entry_id not in lost)
            else:
                self._resolve(group_ops[0], bool(reply))

    def _resolve(self, op: SettleOp, ok: bool) -> None:
        try:
            if self.on_settled is not None:
                self.on_settled(op, ok)
            if op.then is not None:
                op.then(ok)
        except Exception:
            # The rest of the batch must still resolve: their entries are held until then.
            _log.exception("settle callback failed", extra={"queue": self.queue})
