"""Processors: async and sync ones run, what a Job carries, per-job routing, and the
registration errors raised at decoration and registration time."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from streamq import Backoff, JobRequest, Queue, QueueContract, RegistrationError, job
from streamq.app import App
from streamq.job import Job
from tests.runtime.support import dead_entries, keys, wait_until


class Item(BaseModel):
    n: int


class Note(BaseModel):
    text: str


class Unrelated(BaseModel):
    x: float


class Work(QueueContract, name="rt-proc", shards=2, secondary_shards=1):
    item = job("item", Item)
    note = job("note", Note)


class Other(QueueContract, name="rt-proc-other"):
    item = job("item", Item)


FAST = {"lock_duration": 2, "promote_interval": 0.02, "backoff": Backoff.fixed(0.02)}


async def test_async_and_sync_processors_both_run_sync_ones_off_the_event_loop(
    managers, aredis, prefix
):
    app = App([Work])
    loop_thread = threading.get_ident()
    ran: dict[str, list[int]] = {"item": [], "note": []}

    @app.processor(Work.item, concurrency=4, **FAST)
    async def on_item(job: Job[Item]) -> None:
        ran["item"].append(threading.get_ident())

    @app.processor(Work.note)
    def on_note(job: Job[Note]) -> None:
        ran["note"].append(threading.get_ident())

    q = Queue(Work, aredis, prefix=prefix)
    await q.add_bulk(
        [JobRequest(Work.item, Item(n=i)) for i in range(5)]
        + [JobRequest(Work.note, Note(text=str(i))) for i in range(5)]
    )
    m = managers(app)
    await m.start()
    await m.run_until_idle(10)

    assert ran["item"] == [loop_thread] * 5
    assert len(ran["note"]) == 5
    assert loop_thread not in ran["note"]


async def test_job_id_is_stable_across_retries_and_job_carries_attempt_and_baggage(
    managers, aredis, prefix
):
    app = App([Work])
    seen: list[dict[str, Any]] = []

    @app.processor(Work, attempts=3, **FAST)
    async def proc(job: Job[Item | Note]) -> None:
        seen.append(
            {
                "id": job.id,
                "name": job.name,
                "queue": job.queue,
                "shard": job.shard,
                "payload": job.payload,
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "final": job.is_final_attempt,
                "baggage": job.retry_baggage,
                "log": dict(job.logger.extra or {}),
            }
        )
        if not job.is_final_attempt:
            raise RuntimeError(f"flaky on attempt {job.attempt}")

    q = Queue(Work, aredis, prefix=prefix)
    job_id = await q.add(Work.item, Item(n=7), job_id="order-7")
    m = managers(app)
    await m.start()
    await m.run_until_idle(10)

    assert job_id == "order-7"
    assert [s["id"] for s in seen] == ["order-7"] * 3
    assert [s["attempt"] for s in seen] == [1, 2, 3]
    assert {s["max_attempts"] for s in seen} == {3}
    assert [s["final"] for s in seen] == [False, False, True]
    assert all(s["payload"] == Item(n=7) and s["name"] == "item" for s in seen)
    assert {s["queue"] for s in seen} == {"rt-proc"}
    assert seen[0]["shard"] in Work.shard_names()
    assert seen[0]["baggage"] is None
    errs = seen[2]["baggage"]["errors"]
    assert [(e["attempt"], e["type"], e["message"]) for e in errs] == [
        (1, "RuntimeError", "flaky on attempt 1"),
        (2, "RuntimeError", "flaky on attempt 2"),
    ]
    assert seen[1]["baggage"]["errors"] == errs[:1]
    assert seen[1]["log"] == {"queue": "rt-proc", "job_id": "order-7", "job": "item", "attempt": 2}
    # The last attempt succeeded: nothing is dead.
    assert await dead_entries(aredis, keys(prefix, "rt-proc", 2)) == []


async def test_per_job_processors_each_receive_only_their_job(managers, aredis, prefix):
    app = App([Work])
    items: list[int] = []
    notes: list[str] = []

    @app.processor(Work.item, **FAST)
    async def on_item(job: Job[Item]) -> None:
        assert isinstance(job.payload, Item)
        items.append(job.payload.n)

    @app.processor(Work.note)
    async def on_note(job: Job[Note]) -> None:
        assert isinstance(job.payload, Note)
        notes.append(job.payload.text)

    q = Queue(Work, aredis, prefix=prefix)
    await q.add(Work.item, Item(n=1))
    await q.add(Work.note, Note(text="a"))
    await q.add(Work.item, {"n": 2})
    m = managers(app)
    await m.start()
    await m.run_until_idle(10)

    assert sorted(items) == [1, 2]
    assert notes == ["a"]


async def test_secondary_lane_is_consumed_by_the_same_processor(managers, aredis, prefix):
    app = App([Work])
    lanes: list[tuple[str, int]] = []

    @app.processor(Work, **FAST)
    async def proc(job: Job[Any]) -> None:
        lanes.append((job.queue, job.payload.n))

    await Queue(Work, aredis, prefix=prefix, secondary=True).add(Work.item, Item(n=1))
    await Queue(Work, aredis, prefix=prefix).add(Work.item, Item(n=2))
    m = managers(app, queues=["rt-proc-secondary"])
    assert m.registered_queue_names() == ["rt-proc-secondary"]
    await m.start()
    await wait_until(lambda: lanes == [("rt-proc-secondary", 1)], what="the secondary job")
    # The primary lane is not consumed by this manager: its job is still waiting.
    assert (
        await aredis.xlen(keys(prefix, "rt-proc", 2).shards[0].stream)
        + await aredis.xlen(keys(prefix, "rt-proc", 2).shards[1].stream)
        == 1
    )


async def test_manager_names_its_queues_and_gives_their_workers(managers):
    app = App([Work, Other])

    @app.processor(Work)
    async def a(job: Job[Any]) -> None: ...

    @app.processor(Other)
    async def b(job: Job[Item]) -> None: ...

    m = managers(app, queues=["rt-proc", "rt-proc-secondary", "rt-proc-other"])
    assert m.registered_queue_names() == ["rt-proc", "rt-proc-secondary", "rt-proc-other"]
    assert m.get_worker("rt-proc") is None  # not started
    await m.start()
    w = m.get_worker("rt-proc-secondary")
    assert w is not None
    assert w.name == "rt-proc-secondary"
    assert len(w.shards) == 1
    assert m.get_worker("rt-proc").name == "rt-proc"
    assert m.get_worker("nope") is None


def test_manager_refuses_a_second_registration_of_a_queue(managers):
    app = App([Work])

    @app.processor(Work)
    async def proc(job: Job[Any]) -> None: ...

    m = managers(app)
    with pytest.raises(RegistrationError, match="already registered") as err:
        m.register(Work, app.registrations["rt-proc"])
    assert err.value.queue == "rt-proc"
    with pytest.raises(RegistrationError, match="already registered"):
        m.register_app(app)


def test_manager_refuses_a_queue_the_app_does_not_process(managers):
    app = App([Work])

    @app.processor(Work)
    async def proc(job: Job[Any]) -> None: ...

    with pytest.raises(RegistrationError, match="no processor"):
        managers(app, queues=["rt-proc-other"])


# -- registration errors at decoration time ------------------------------------------------


def test_job_annotation_with_the_wrong_payload_model_is_refused():
    app = App([Work])
    with pytest.raises(RegistrationError, match="Unrelated") as err:

        @app.processor(Work.item)
        async def proc(job: Job[Unrelated]) -> None: ...

    assert err.value.queue == "rt-proc"
    with pytest.raises(RegistrationError, match="carries Note"):
        # A queue processor must accept every job of the queue.
        @app.processor(Work)
        def proc2(job: Job[Item]) -> None: ...


def test_job_annotation_union_covering_every_job_is_accepted():
    app = App([Work])

    @app.processor(Work)
    async def proc(job: Job[Item | Note]) -> None: ...

    assert app.registrations["rt-proc"].default is proc


def test_first_parameter_not_annotated_job_is_refused():
    app = App([Work])
    with pytest.raises(RegistrationError, match=r"annotated Job\[\.\.\.\]"):

        @app.processor(Work.item)
        async def proc(job: Item) -> None: ...


def test_job_spec_that_belongs_to_no_queue_is_refused():
    app = App([Work])
    loose = job("loose", Item)
    with pytest.raises(RegistrationError, match="not declared by any queue"):

        @app.processor(loose)
        async def proc(job: Job[Item]) -> None: ...


def test_second_processor_for_a_queue_or_a_job_is_refused():
    app = App([Work])

    @app.processor(Work)
    async def first(job: Job[Any]) -> None: ...

    with pytest.raises(RegistrationError, match="already has a processor"):

        @app.processor(Work)
        async def second(job: Job[Any]) -> None: ...

    @app.processor(Work.item)
    async def item_one(job: Job[Item]) -> None: ...

    with pytest.raises(RegistrationError, match="job 'item' of queue 'rt-proc' already"):

        @app.processor(Work.item)
        async def item_two(job: Job[Item]) -> None: ...


def test_queue_options_given_twice_with_different_values_are_refused():
    app = App([Work])

    @app.processor(Work.item, concurrency=5)
    async def a(job: Job[Item]) -> None: ...

    with pytest.raises(RegistrationError, match="options were already given"):

        @app.processor(Work.note, concurrency=6)
        async def b(job: Job[Note]) -> None: ...

    # The same options again, or none, are fine.
    @app.processor(Work.note, concurrency=5)
    async def c(job: Job[Note]) -> None: ...

    assert app.registrations["rt-proc"].options.concurrency == 5


def test_processor_with_required_parameters_besides_the_job_is_refused():
    app = App([Work])
    with pytest.raises(RegistrationError, match=r"required parameters besides the job \(db\)"):

        @app.processor(Work.item)
        async def proc(job: Job[Item], db: Any) -> None: ...

    with pytest.raises(RegistrationError) as err:

        @app.processor(Work)
        def proc2(job: Job[Any], *, session: Any, retries: int = 3) -> None: ...

    message = str(err.value)
    assert "queue 'rt-proc'" in message
    assert "proc2" in message
    assert "(session)" in message
    assert (err.value.queue, err.value.job) == ("rt-proc", None)
    assert "rt-proc" not in app.registrations  # nothing half-registered


def test_processor_whose_other_parameters_have_defaults_or_are_bound_is_accepted():
    app = App([Work])

    @app.processor(Work.item)
    async def on_item(job: Job[Item], db: Any = None, *args: Any, flag: bool = False) -> None: ...

    def with_db(job: Job[Note], db: Any) -> None: ...

    on_note = functools.partial(with_db, db=object())
    app.processor(Work.note)(on_note)
    assert app.registrations["rt-proc"].by_job == {"item": on_item, "note": on_note}


def test_processor_that_takes_no_job_is_refused():
    app = App([Work])
    with pytest.raises(RegistrationError, match=r"job 'item' of queue 'rt-proc'.*first positional"):

        @app.processor(Work.item)
        async def proc() -> None: ...

    with pytest.raises(RegistrationError, match="first positional"):

        @app.processor(Work.note)
        async def kw_only(*, job: Job[Note]) -> None: ...


def test_generator_and_async_generator_processors_are_refused():
    app = App([Work])
    with pytest.raises(RegistrationError, match=r"queue 'rt-proc'.*gen.* is a generator function"):

        @app.processor(Work.item)
        def gen(job: Job[Item]) -> Iterator[None]:
            yield None

    with pytest.raises(RegistrationError, match="agen is an async generator function") as err:

        @app.processor(Work.note)
        async def agen(job: Job[Note]) -> AsyncIterator[None]:
            yield None

    assert (err.value.queue, err.value.job) == ("rt-proc", "note")

    class Streaming:
        def __call__(self, job: Job[Item]) -> Iterator[None]:
            yield None

    with pytest.raises(RegistrationError, match="is a generator function"):
        app.processor(Work)(Streaming())
    with pytest.raises(RegistrationError, match="is a generator function"):
        app.processor(Work)(functools.partial(_gen))
    assert app.registrations == {}


def _gen(job: Job[Any]) -> Iterator[None]:
    yield None


@pytest.mark.parametrize("thing", [None, 42, "process", Item(n=1)])
def test_a_non_callable_is_refused(thing: Any):
    app = App([Work])
    with pytest.raises(RegistrationError, match=r"queue 'rt-proc'.*is not callable"):
        app.processor(Work)(thing)


def test_callable_objects_and_methods_are_accepted():
    app = App([Work])

    class Handler:
        async def __call__(self, job: Job[Item]) -> None: ...

        def on_note(self, job: Job[Note]) -> None: ...

    handler = Handler()
    app.processor(Work.item)(handler)
    app.processor(Work.note)(handler.on_note)
    assert app.registrations["rt-proc"].by_job == {"item": handler, "note": handler.on_note}
