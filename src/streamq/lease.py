"""Leases in Redis for singleton runners: one holder across the fleet, with a fencing token.

A lease is a hash (holder, token) that expires after ``lease_ms`` unless its holder renews it.
Each acquisition takes a new token from a counter that never expires, so tokens only grow:
a write fenced on the token (:func:`fenced_set`) is refused once a newer holder took over,
however late it arrives.

:class:`LeaseKeeper` campaigns for one lease and renews it while held, on its own thread and
synchronous connection, like job locks (:mod:`streamq.runtime.renewal`): a blocked event loop
neither loses a lease it holds nor keeps one it lost. Each script has one wrapper here, the
only code that knows its argument order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from streamq._redis import Call, run_calls_sync
from streamq.keys import RunnerKeys
from streamq.scripts import script

__all__ = [
    "Grant",
    "LeaseKeeper",
    "LeaseStatus",
    "acquire",
    "fenced_set",
    "release",
    "renew",
]

_log = logging.getLogger("streamq.runners")

RETRY_AFTER_FAILURE_S = 0.1
"""First wait after a failed lease call (doubling up to 1.6 s, never above the interval)."""


def _str(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True, slots=True)
class Grant:
    """What an acquisition found: whether we hold the lease, and its token, holder and ttl."""

    held: bool
    token: int
    holder: str
    ttl_ms: int


class LeaseStatus(IntEnum):
    """What a renewal, a release or a fenced write found."""

    HELD = 1
    """Ours: renewed, released or written."""
    OTHER = 0
    """Another holder, or a newer token, holds the lease."""
    GONE = -1
    """No lease: it expired (or was released)."""


def _grant(reply: Any) -> Grant:
    held, token, holder, ttl = reply
    return Grant(bool(int(held)), int(token), _str(holder), int(ttl))


def _status(reply: Any) -> LeaseStatus:
    return LeaseStatus(int(reply))


def acquire(keys: RunnerKeys, holder: str, lease_ms: int, *, spent_token: int = 0) -> Call:
    """Take the lease when it is free (a new token), or keep it when ``holder`` has it.

    ``spent_token``: a token whose run was cancelled; a holder still holding it gets a new one.
    """
    return Call(script("lease_acquire"), (keys.lease, keys.fence),
                (holder, lease_ms, spent_token), _grant)


def renew(keys: RunnerKeys, holder: str, token: int, lease_ms: int) -> Call:
    """Extend the lease if ``holder`` still holds it with ``token``."""
    return Call(script("lease_renew"), (keys.lease,), (holder, token, lease_ms), _status)


def release(keys: RunnerKeys, holder: str, token: int) -> Call:
    """Delete the lease if ``holder`` still holds it with ``token``."""
    return Call(script("lease_release"), (keys.lease,), (holder, token), _status)


def fenced_set(keys: RunnerKeys, token: int, key: str, value: str | bytes, ttl_ms: int) -> Call:
    """``SET key value [PX ttl_ms]`` only while ``token`` holds the lease."""
    return Call(script("lease_fenced_set"), (keys.lease, key), (token, value, ttl_ms), _status)


class LeaseKeeper(threading.Thread):
    """Campaigns for one lease and renews it while held, on its own thread and connection.

    ``on_gained(token)`` and ``on_lost(token, reason)`` are called from this thread (they
    must be thread-safe); ``reason`` is ``"taken over"``, ``"expired"`` or ``"released"``
    (after :meth:`stop`: the caller stops its work first, then the lease is given up so
    another replica takes it at once).
    :meth:`holds` answers at once, from any thread, whether a token still leads: it turns
    false when a renewal finds another holder, and when renewals failed until the lease's
    end (counted from before the last successful call was sent, so never after Redis expires
    it).
    """

    def __init__(
        self,
        client: Any,
        keys: RunnerKeys,
        *,
        runner: str,
        holder: str,
        lease_ms: int,
        renew_interval_ms: int,
        on_gained: Callable[[int], None],
        on_lost: Callable[[int, str], None],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(name=f"streamq-lease-{runner}", daemon=True)
        self.client = client
        self.keys = keys
        self.runner = runner
        self.holder = holder
        self.lease_ms = lease_ms
        self.interval_s = renew_interval_ms / 1000
        self.on_gained = on_gained
        self.on_lost = on_lost
        self.on_error = on_error
        self._lock = threading.Lock()
        self._token: int | None = None
        self._valid_until = 0.0
        self._spent = 0
        self._halt = threading.Event()
        self._wake = threading.Event()

    # -- what others read ------------------------------------------------------------------
    @property
    def token(self) -> int | None:
        """The token held now, or None."""
        with self._lock:
            return self._token if time.monotonic() < self._valid_until else None

    def holds(self, token: int | None) -> bool:
        """True while ``token`` holds the lease, as far as this process can tell."""
        return token is not None and self.token == token

    # -- the thread ------------------------------------------------------------------------
    def run(self) -> None:
        wait = 0.0
        failures = 0
        while not self._halt.is_set():
            self._wake.wait(self._bounded(wait))
            self._wake.clear()
            if self._halt.is_set():
                break
            try:
                wait = self._step()
                failures = 0
            except Exception as exc:
                # Retry soon: one failed renewal plus a whole interval can be most of a lease.
                failures += 1
                wait = min(self.interval_s, RETRY_AFTER_FAILURE_S * 2 ** min(failures - 1, 4))
                if self.on_error:
                    self.on_error(exc)
                if failures == 1 or failures % 20 == 0:
                    _log.warning("runner lease call failed; retrying soon",
                                 extra={"runner": self.runner, "error": repr(exc),
                                        "failures": failures, "retry_in_s": round(wait, 3)})
            self._check_expiry()
        self._release()

    def _bounded(self, wait: float) -> float:
        """Wake no later than the lease's local end, to step down on time."""
        with self._lock:
            if self._token is None:
                return wait
            return max(0.0, min(wait, self._valid_until - time.monotonic()))

    def _step(self) -> float:
        """One acquisition or renewal; the wait until the next."""
        with self._lock:
            token = self._token
        sent_at = time.monotonic()
        if token is None:
            call = acquire(self.keys, self.holder, self.lease_ms, spent_token=self._spent)
            grant: Grant = run_calls_sync(self.client, [call])[0]
            if not grant.held:
                if grant.ttl_ms < 0:  # no expiry (set by hand?) or just gone: ask as usual
                    return self.interval_s
                # Ask again just after the holder's lease would end: a dead holder is
                # replaced within its lease, a live one renews before then.
                return min(self.interval_s, grant.ttl_ms / 1000 + 0.005)
            self._gain(grant.token, sent_at)
            return self.interval_s
        (status,) = run_calls_sync(self.client, [renew(self.keys, self.holder, token,
                                                       self.lease_ms)])
        if status is LeaseStatus.HELD:
            with self._lock:
                # A renewal that returned after the lease's local end does not bring the
                # token back: holds() has said False meanwhile, so the run may have stopped.
                late = time.monotonic() >= self._valid_until
                if self._token == token and not late:
                    self._valid_until = sent_at + self.lease_ms / 1000
            if not late:
                return self.interval_s
        self._lose(token, "taken over" if status is LeaseStatus.OTHER else "expired")
        return 0.0

    def _gain(self, token: int, sent_at: float) -> None:
        with self._lock:
            self._token, self._valid_until = token, sent_at + self.lease_ms / 1000
            self._spent = token
        _log.info("runner leadership acquired",
                  extra={"runner": self.runner, "token": token, "consumer": self.holder})
        self.on_gained(token)

    def _lose(self, token: int, reason: str) -> None:
        with self._lock:
            if self._token != token:
                return
            self._token, self._valid_until = None, 0.0
        _log.info("runner leadership lost (%s)", reason,
                  extra={"runner": self.runner, "token": token, "consumer": self.holder,
                         "reason": reason})
        self.on_lost(token, reason)

    def _check_expiry(self) -> None:
        with self._lock:
            token, until = self._token, self._valid_until
        if token is not None and time.monotonic() >= until:
            self._lose(token, "expired")

    def _release(self) -> None:
        with self._lock:
            token, self._token, self._valid_until = self._token, None, 0.0
        if token is None:
            return
        try:
            (status,) = run_calls_sync(self.client, [release(self.keys, self.holder, token)])
            _log.info("runner leadership released" if status is LeaseStatus.HELD
                      else "runner lease already gone at release",
                      extra={"runner": self.runner, "token": token, "consumer": self.holder})
        except Exception as exc:  # it expires on its own within the lease
            _log.warning("could not release the runner lease; it expires by itself",
                         extra={"runner": self.runner, "error": repr(exc)})
        self.on_lost(token, "released")

    def renew_now(self) -> None:
        """Renew (or campaign) at once, e.g. after a fenced write was refused (thread-safe)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop campaigning and renewing; the thread releases a lease it holds, then ends."""
        self._halt.set()
        self._wake.set()
