"""The producer is typed by its contract and its client: mypy refuses another job's payload
model, a client of the wrong kind (sync for ``Queue``, asyncio for ``SyncQueue``), and a
misspelt or mistyped ``@app.processor`` option."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

SRC = Path(__file__).resolve().parents[1] / "src"

HEADER = """\
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import App, Job, JobRequest, Queue, QueueContract, SyncQueue, job


class A(BaseModel):
    x: int


class Wrong(BaseModel):
    y: str


class Spec(QueueContract, name="spec"):
    a = job("a", A)
"""

GOOD = """
async def produce(r: aioredis.Redis, s: redis.Redis) -> list[str]:
    queue = Queue(Spec, r)
    first: str = await queue.add(Spec.a, A(x=1))
    await queue.for_key("k").add(Spec.a, {"x": 1}, job_id="j", delay=5)
    await queue.add("a", A(x=2))
    SyncQueue(Spec, s).add(Spec.a, A(x=3))
    return [first, *await queue.add_bulk([JobRequest(Spec.a, A(x=4))])]


app = App([Spec])


@app.processor(Spec, concurrency=5, timeout=30, lock_duration=1.5)
async def handle(job: Job[A]) -> None:
    pass
"""

BAD = """
async def produce(r: aioredis.Redis, s: redis.Redis) -> None:
    queue = Queue(Spec, r)
    await queue.add(Spec.a, Wrong(y="no"))  # line A
    SyncQueue(Spec, s).add(Spec.a, Wrong(y="no"))  # line B
    await queue.for_key("k").add(Spec.a, Wrong(y="no"))  # line C
    await queue.add(Spec.a, A(x=1), delay="soon")  # line D
    await queue.add_bulk([JobRequest(Spec.a, Wrong(y="no"))])  # line E
    Queue(Spec, s)  # line F
    SyncQueue(Spec, r)  # line G


app = App([Spec])


@app.processor(Spec, concurency=5)  # line H
async def misspelt(job: Job[A]) -> None:
    pass


@app.processor(Spec, timeout="soon")  # line I
async def mistyped(job: Job[A]) -> None:
    pass
"""


def error_lines(output: str, path: Path, about: str = "") -> set[int]:
    # Match the file name only: with a warm cache mypy replays a module's errors under the
    # path it had when first checked (an earlier run's tmp_path).
    pattern = rf"^(?:.*/)?{re.escape(path.name)}:(\d+): error: .*{about}"
    return {int(m.group(1)) for m in re.finditer(pattern, output, re.M)}


def line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if marker in line)


def test_mypy_refuses_another_model_or_the_wrong_client_kind_and_accepts_the_right_ones(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    good_src = HEADER + textwrap.dedent(GOOD)
    bad_src = HEADER + textwrap.dedent(BAD)
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(good_src)
    bad.write_text(bad_src)
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nstrict = True\nplugins = pydantic.mypy\nmypy_path = {SRC}\n")
    # A cache kept across runs (pytest's own cache dir) keeps this test under a second;
    # scripts/test runs without the cache plugin, so fall back to a fresh directory.
    store = getattr(request.config, "cache", None)
    cache = store.mkdir("mypy-typing") if store is not None else tmp_path / "mypy-cache"
    out, err, _ = mypy_api.run(
        ["--config-file", str(config), "--cache-dir", str(cache), str(good), str(bad)]
    )
    assert err == ""
    assert error_lines(out, good) == set(), out
    expected = {line_of(bad_src, f"# line {m}") for m in "ABCD"}
    assert error_lines(out, bad, about='"add" of "(Sync)?Queue"') == expected, out
    assert error_lines(out, bad, about='"JobRequest"') == {line_of(bad_src, "# line E")}, out
    wrong_client = {line_of(bad_src, f"# line {m}") for m in "FG"}
    assert error_lines(out, bad, about='Argument 2 to "(Sync)?Queue"') == wrong_client, out
    # A misspelt or mistyped processor option is caught at the decorator.
    options = {line_of(bad_src, f"# line {m}") for m in "HI"}
    assert error_lines(out, bad, about='"processor" of "App"') == options, out


def test_processor_options_type_every_worker_option_and_nothing_else() -> None:
    from dataclasses import fields

    from streamq.options import ProcessorOptions, WorkerOptions

    assert set(ProcessorOptions.__annotations__) == {f.name for f in fields(WorkerOptions)}
