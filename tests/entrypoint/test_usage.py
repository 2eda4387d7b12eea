"""``python -m worker --help`` lists every variable it reads; any other argument is refused."""

from __future__ import annotations

import re
from typing import Any

import pytest

from worker.__main__ import main
from worker.settings import QUEUE_OPTIONS, parse_settings
from worker.usage import VARIABLES

from .helpers import ROOT, clean_env, run_worker


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_every_variable_with_its_default_and_exits_0(flag: str) -> None:
    done = run_worker(clean_env(), flag)  # no WORKER_APP: help needs no settings
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert out.startswith("usage: python -m worker")
    for v in VARIABLES:
        assert f"  {v.name}  {v.kind} [{v.default}]" in out
    assert "QUEUE_CONSUMER_<QUEUE>_IS_ENABLED" in out
    for option in QUEUE_OPTIONS:
        assert re.search(rf"^\s+{option}\s", out, re.MULTILINE), option
    assert "WORKER_APP is required" not in out


def test_an_unknown_argument_exits_2_naming_it() -> None:
    done = run_worker(clean_env(WORKER_APP="tests.entrypoint.sample_app:app"), "--queues",
                      "notes")
    assert done.returncode == 2
    assert done.stderr.startswith("python -m worker: unknown argument '--queues'")
    assert "--help" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("argv", [["run"], ["--help", "--verbose"], ["-hv"]])
def test_help_with_anything_else_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main({}, argv) == 2
    err = capsys.readouterr().err
    bad = next(a for a in argv if a not in ("-h", "--help"))
    assert f"unknown argument {bad!r}" in err


class Recording(dict[str, str]):
    """An environment that remembers every variable name it was asked about."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)


def test_help_lists_exactly_the_global_variables_the_parser_reads() -> None:
    env = Recording({"WORKER_APP": "x:app", "QUEUE_CONSUMER_NOTES_IS_ENABLED": "true"})
    parse_settings(env, lanes=["notes"])
    global_names = {name for name in env.asked if not name.startswith("QUEUE_")}
    assert global_names == {v.name for v in VARIABLES}


def documented_globals() -> dict[str, str]:
    """``variable -> default`` from the global table of docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("## Global variables", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0].strip("`")] = cells[2].replace("`", "")
    return rows


def test_help_and_the_docs_list_the_same_variables_and_defaults() -> None:
    assert documented_globals() == {v.name: v.default for v in VARIABLES}
