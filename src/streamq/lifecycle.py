"""Startup and shutdown hooks of an app (``@app.on_startup`` / ``@app.on_shutdown``).

``WorkerManager.start`` runs the startup hooks in declaration order once Redis is checked and
before any worker starts, so what they open (a database pool on ``app.state``) is ready
before the first job. ``close_workers`` runs the shutdown hooks in reverse order after the
workers and services closed. A hook takes the app's state (``def hook(state)``) or nothing
(``def hook()``), and is async or sync (a sync hook runs on the event loop's thread: nothing
else runs yet at startup, and nothing is left at shutdown).

A startup hook that raises stops the start: :class:`~streamq.errors.StartupHookFailed`
names it, no worker has started, and the shutdown hooks still run (in reverse order) so the
hooks that did run can release what they opened: write shutdown hooks that tolerate a
partial startup. A shutdown hook that raises is logged and the next one runs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from streamq.errors import RegistrationError, StartupHookFailed

__all__ = ["LifecycleHook", "check_hook", "hook_name", "run_shutdown", "run_startup"]

_log = logging.getLogger("streamq.worker")

LifecycleHook = Callable[..., Any]
"""``hook(state)`` or ``hook()``, async or sync."""


def hook_name(fn: object) -> str:
    """How logs and errors name a hook: ``module.qualname``."""
    qual = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{qual}" if module else qual


def _takes_state(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


def check_hook(fn: object, where: str) -> None:
    """Refuse, at decoration, a hook that cannot run as ``fn(state)`` or ``fn()``.

    Raises:
        RegistrationError: not callable, a generator function, or more than one required
            parameter.
    """
    name = hook_name(fn)
    if not callable(fn):
        raise RegistrationError(f"@app.{where}: {fn!r} is not callable")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise RegistrationError(f"@app.{where}: {name} is a generator function; a hook "
                                "returns, it does not yield")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    required = [p.name for p in params if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(required) > 1 or any(
        p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params
    ):
        raise RegistrationError(
            f"@app.{where}: {name} has required parameters {', '.join(required)}; a hook "
            "takes the app's state or nothing"
        )


async def _call(fn: LifecycleHook, state: Any) -> None:
    result = fn(state) if _takes_state(fn) else fn()
    if inspect.isawaitable(result):
        await result


async def run_startup(hooks: Sequence[LifecycleHook], state: Any) -> None:
    """Run ``hooks`` in order; the first that raises stops the rest.

    Raises:
        StartupHookFailed: naming the hook that raised (its exception is the cause).
    """
    for fn in hooks:
        name = hook_name(fn)
        try:
            await _call(fn, state)
        except Exception as exc:
            raise StartupHookFailed(
                f"startup hook {name} failed: {type(exc).__name__}: {exc}", hook=name
            ) from exc
        _log.debug("startup hook ran", extra={"hook": name})


async def run_shutdown(hooks: Sequence[LifecycleHook], state: Any) -> None:
    """Run ``hooks`` in reverse order; one that raises is logged and the next runs."""
    for fn in reversed(hooks):
        name = hook_name(fn)
        try:
            await _call(fn, state)
        except Exception:
            _log.exception("shutdown hook %s failed", name, extra={"hook": name})
