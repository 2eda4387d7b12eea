"""Running a processor: async on the event loop, sync in a thread pool, with a timeout."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamq.app import Processor, Registration
from streamq.errors import JobTimeout
from streamq.job import Job

__all__ = ["run_processor"]

_log = logging.getLogger("streamq.worker")


async def run_processor(
    fn: Processor,
    job: Job[Any] | list[Job[Any]],
    *,
    timeout_s: float | None,
    pool: ThreadPoolExecutor,
) -> Any:
    """Run ``fn(job)``; raise :class:`JobTimeout` past ``timeout_s``.

    An async processor is cancelled at its timeout. A sync one cannot be stopped: its thread
    is abandoned (it keeps running to its end, its result ignored) and a warning is logged.
    A ``TimeoutError`` the processor raises itself (an upstream call timing out) is an
    ordinary error, not a job timeout.
    """
    call: Any = fn  # a batch processor takes the list
    if Registration.is_async(fn):
        if timeout_s is None:
            return await call(job)
        limit = asyncio.timeout(timeout_s)
        try:
            async with limit:
                return await call(job)
        except TimeoutError:
            if not limit.expired():
                raise
            raise JobTimeout(f"job ran longer than its {timeout_s:g} s timeout") from None
    return await _run_sync(fn, job, timeout_s=timeout_s, pool=pool)


def _job_extra(job: Job[Any] | list[Job[Any]]) -> dict[str, Any]:
    if isinstance(job, list):
        return {"queue": job[0].queue if job else "", "batch": len(job)}
    return {"queue": job.queue, "job_id": job.id, "job": job.name}


async def _run_sync(
    fn: Callable[[Any], Any], job: Job[Any] | list[Job[Any]], *, timeout_s: float | None,
    pool: ThreadPoolExecutor,
) -> Any:
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    if timeout_s is None:
        return await loop.run_in_executor(pool, ctx.run, fn, job)
    began: asyncio.Future[None] = loop.create_future()

    def mark_began() -> None:
        if not began.done():
            began.set_result(None)

    def call() -> Any:
        loop.call_soon_threadsafe(mark_began)
        return ctx.run(fn, job)

    fut = loop.run_in_executor(pool, call)
    try:
        # The clock starts when a thread picks the job up: when abandoned threads fill the
        # pool, a job waits for a thread instead of timing out without having run.
        await asyncio.wait({began, fut}, return_when=asyncio.FIRST_COMPLETED)
        # asyncio.wait never cancels the future: past the timeout the thread is left to end.
        done, _ = await asyncio.wait({fut}, timeout=timeout_s)
    except asyncio.CancelledError:
        fut.cancel()  # never start it if it has not started yet
        raise
    if not done:
        # Its late outcome is ignored: retrieve it so asyncio does not report it as lost.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        _log.warning(
            "sync processor abandoned after timeout; its thread runs on",
            extra=_job_extra(job),
        )
        raise JobTimeout(f"job ran longer than its {timeout_s:g} s timeout (abandoned)")
    return fut.result()
