"""Which event loop ``python -m worker`` runs on: ``WORKER_EVENT_LOOP=auto|asyncio|uvloop``.

``auto`` takes uvloop when it is installed (``pip install 'streamq[uvloop]'``) and asyncio's
own loop otherwise; ``uvloop`` when it is not installed is a settings error (exit 2).

Example::

    runner = asyncio.Runner(loop_factory=loop_factory("auto"))
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Literal

__all__ = ["EVENT_LOOPS", "EventLoop", "loop_factory", "loop_name", "uvloop_installed"]

EventLoop = Literal["auto", "asyncio", "uvloop"]
EVENT_LOOPS: tuple[EventLoop, ...] = ("auto", "asyncio", "uvloop")


def uvloop_installed() -> bool:
    """True when ``import uvloop`` works."""
    try:
        importlib.import_module("uvloop")
    except ImportError:
        return False
    return True


def loop_factory(choice: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What ``asyncio.Runner(loop_factory=...)`` needs for ``choice``; None: asyncio's loop."""
    if choice == "asyncio" or (choice == "auto" and not uvloop_installed()):
        return None
    uvloop = importlib.import_module("uvloop")
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: the kind of ``loop``, for logs."""
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
