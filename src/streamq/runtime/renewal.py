"""Lock renewal on its own thread and connection.

A processor that blocks the event loop (CPU-bound code, a sync call inside ``async def``) is
exactly when locks expire and jobs run twice in loop-driven workers. Renewal here runs in a
thread with a synchronous client of its own, so a blocked loop cannot starve it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from streamq import ops
from streamq._redis import Call, run_calls_sync
from streamq.keys import ShardKeys

__all__ = ["HeldEntries", "LockRenewer"]

_log = logging.getLogger("streamq.worker")

RETRY_AFTER_FAILURE_S = 0.1
"""First wait after a failed renewal (doubling up to 1.6 s, never above the interval)."""


class HeldEntries:
    """Entry ids this worker holds (fetched and not yet settled), per shard; thread-safe."""

    def __init__(self, shards: tuple[ShardKeys, ...]) -> None:
        self.shards = shards
        self._ids: list[set[str]] = [set() for _ in shards]
        self._lock = threading.Lock()

    def add(self, shard: int, entry_id: str) -> None:
        with self._lock:
            self._ids[shard].add(entry_id)

    def discard(self, shard: int, entry_id: str) -> None:
        with self._lock:
            self._ids[shard].discard(entry_id)

    def __contains__(self, key: tuple[int, str]) -> bool:
        with self._lock:
            return key[1] in self._ids[key[0]]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._ids)

    def snapshot(self) -> list[list[str]]:
        with self._lock:
            return [sorted(s) for s in self._ids]


class LockRenewer(threading.Thread):
    """Renews every held entry each ``interval_s``; reports the ids found lost.

    ``on_lost(shard_index, ids)`` is called from this thread; it must be thread-safe.
    """

    def __init__(
        self,
        client: Any,
        held: HeldEntries,
        *,
        queue: str,
        group: str,
        consumer: str,
        interval_s: float,
        on_lost: Callable[[int, list[str]], None],
        on_error: Callable[[BaseException], None] | None = None,
        riders: Callable[[], list[tuple[Call, Callable[[Any], None]]]] | None = None,
    ) -> None:
        super().__init__(name=f"streamq-renew-{queue}", daemon=True)
        self.client = client
        self.held = held
        self.queue = queue
        self.group = group
        self.consumer = consumer
        self.interval_s = interval_s
        self.on_lost = on_lost
        self.on_error = on_error
        # Calls sent in the same round trip as each renewal, and what to do with each reply
        # (tracked jobs' control: streamq.runtime.tracking).
        self.riders = riders
        self._halt = threading.Event()
        self._now = threading.Event()
        self.renewals = 0

    def run(self) -> None:
        wait = self.interval_s
        failures = 0
        while not self._halt.is_set():
            self._now.wait(wait)
            self._now.clear()
            if self._halt.is_set():
                break
            try:
                self.renew_once()
                failures, wait = 0, self.interval_s
            except Exception as exc:
                # Retry soon, not a whole interval later: one failed renewal plus a full
                # interval can already be most of the lock.
                failures += 1
                wait = min(self.interval_s, RETRY_AFTER_FAILURE_S * 2 ** min(failures - 1, 4))
                if self.on_error:
                    self.on_error(exc)
                if failures == 1 or failures % 20 == 0:
                    _log.warning("lock renewal failed; retrying soon",
                                 extra={"queue": self.queue, "error": repr(exc),
                                        "failures": failures, "retry_in_s": round(wait, 3)})

    def renew_once(self) -> None:
        snap = self.held.snapshot()
        indexes = [i for i, ids in enumerate(snap) if ids]
        if not indexes:
            return
        calls = [
            ops.renew(self.held.shards[i], self.group, self.consumer, snap[i]) for i in indexes
        ]
        rides = self.riders() if self.riders is not None else []
        replies = run_calls_sync(self.client, [*calls, *(c for c, _ in rides)],
                                 queue=self.queue)
        for (_, done), reply in zip(rides, replies[len(calls):], strict=True):
            done(reply)
        replies = replies[:len(calls)]
        self.renewals += 1
        for i, lost in zip(indexes, replies, strict=True):
            # An entry settled between the snapshot and the call is not lost: drop those.
            still = [eid for eid in lost if (i, eid) in self.held]
            if still:
                self.on_lost(i, still)

    def renew_now(self) -> None:
        """Ask for a renewal at once (thread-safe)."""
        self._now.set()

    def stop(self) -> None:
        self._halt.set()
        self._now.set()
