"""Dead letters are logged at WARNING: a job that will never run again needs someone to look
at it, and INFO lines are the first a production log level filters out."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import CompositeHooks, PermanentError, Queue, QueueContract, job
from streamq.app import App
from streamq.job import Job
from streamq.observe import JobLogHooks
from tests.runtime.support import RecordingHooks, keys, wait_until


class Order(BaseModel):
    n: int


class Orders(QueueContract, name="rt-dead-logs"):
    order = job("order", Order)


FAST: dict[str, Any] = {"lock_duration": 2, "promote_interval": 0.02}


def records(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


async def test_permanent_error_and_bad_payload_dead_letters_are_logged_at_warning(
    managers, aredis, prefix, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = App([Orders])

    @app.processor(Orders, attempts=5, **FAST)
    async def proc(job: Job[Order]) -> None:
        if job.payload.n == 1:
            raise PermanentError("order 1 was cancelled")

    sk = keys(prefix, "rt-dead-logs").shards[0]
    await aredis.xgroup_create(sk.stream, "streamq", id="0", mkstream=True)
    # A foreign producer's entry whose payload fails the schema: it never runs.
    await aredis.xadd(sk.stream, {"id": "bad", "name": "order", "ts": "1", "attempt": "1",
                                  "payload": '{"n": "not a number"}'})
    queue = Queue(Orders, aredis, prefix=prefix)
    await queue.add(Orders.order, Order(n=1), job_id="cancelled")
    await queue.add(Orders.order, Order(n=2), job_id="fine")
    recorder = RecordingHooks()
    m = managers(app, hooks=CompositeHooks([JobLogHooks(), recorder]))
    await m.start()
    await wait_until(
        lambda: recorder.counts["dead:permanent"] == 1
        and recorder.counts["dead:invalid_payload"] == 1
        and recorder.counts["finished:completed"] == 1,
        what="both dead letters and the completed job",
    )
    await m.run_until_idle(5)

    jobs = records(caplog, "streamq.jobs")
    by_message = {(r.getMessage(), getattr(r, "job_id", None)): r for r in jobs}
    permanent = by_message[("job failed", "cancelled")]
    assert permanent.levelno == logging.WARNING
    assert permanent.__dict__["error"] == "order 1 was cancelled"
    poison = by_message[("job dead-lettered without running", None)]
    assert poison.levelno == logging.WARNING
    assert poison.__dict__["reason"] == "invalid_payload"
    # A job that completed stays at INFO.
    assert by_message[("job completed", "fine")].levelno == logging.INFO
    # The runtime's own line, for managers without JobLogHooks, is a WARNING too.
    runtime = [r for r in records(caplog, "streamq.worker")
               if getattr(r, "job_id", None) == "cancelled"]
    assert [(r.levelno, r.getMessage()) for r in runtime] == [
        (logging.WARNING, "job failed; dead-lettering")
    ]
