"""Services run beside the consumers: started after them, closed before them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from streamq import QueueContract, RegistrationError, job
from streamq.app import App
from streamq.job import Job
from streamq.services import Service, ServiceContext
from tests.runtime.conftest import MakeManager


class Unit(BaseModel):
    n: int


class Svc(QueueContract, name="rt-svc"):
    unit = job("unit", Unit)


class Recorder:
    def __init__(self, name: str, log: list[str], *, fail: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail = fail
        self.ctx: ServiceContext | None = None

    async def start(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.log.append(f"start {self.name}")
        if self.fail:
            raise RuntimeError("cannot start")

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


async def test_services_start_after_the_workers_and_close_before_them(
    managers: MakeManager, prefix: str
) -> None:
    log: list[str] = []
    app = App([Svc])

    @app.processor(Svc)
    async def proc(job: Job[Unit]) -> None: ...

    a, b = Recorder("a", log), Recorder("b", log)
    assert isinstance(a, Service)
    app.add_service(a)
    app.add_service(b)
    m = managers(app, consumer_name="me")
    await m.start()
    assert m.get_worker("rt-svc") is not None
    assert log == ["start a", "start b"]
    assert a.ctx is not None
    assert a.ctx.prefix == prefix
    assert a.ctx.consumer == "me"
    assert list(a.ctx.lanes) == ["rt-svc"]
    await m.close_workers()
    assert log == ["start a", "start b", "close b", "close a"]


async def test_a_service_that_fails_to_start_stops_the_manager_and_is_closed(
    managers: MakeManager,
) -> None:
    log: list[str] = []
    app = App([Svc])

    @app.processor(Svc)
    async def proc(job: Job[Unit]) -> None: ...

    app.add_service(Recorder("bad", log, fail=True))
    m = managers(app)
    with pytest.raises(RuntimeError, match="cannot start"):
        await m.start()
    assert log == ["start bad", "close bad"]


def test_two_services_of_one_name_are_refused(managers: MakeManager) -> None:
    app = App([Svc])

    @app.processor(Svc)
    async def proc(job: Job[Unit]) -> None: ...

    m = managers(app)
    log: list[Any] = []
    m.add_service(Recorder("x", log))
    with pytest.raises(RegistrationError):
        m.add_service(Recorder("x", log))
