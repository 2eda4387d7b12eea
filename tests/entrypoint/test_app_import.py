"""An app module that fails while it is imported: exit 2, naming WORKER_APP and the error."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from worker.settings import AppImportError, SettingsError, load_app

from .helpers import clean_env, last_line, run_worker, run_workers

# Each module is written to a temporary directory put on PYTHONPATH; the sample app's
# contracts come from the repository (the worker runs from its root).
BROKEN = {
    "registration": (
        """
        from streamq.app import App
        from tests.entrypoint.sample_app import Note, Notes
        from streamq.job import Job

        app = App([Notes])

        @app.processor(Notes)
        async def first(job: Job[Note]) -> None: ...

        @app.processor(Notes)
        async def second(job: Job[Note]) -> None: ...
        """,
        "RegistrationError",
        "already",
    ),
    "contract": (
        """
        from streamq import QueueContract

        class Broken(QueueContract, name="broken", shards=0):
            pass
        """,
        "ContractError",
        "shards",
    ),
    "syntax": ("app = (\n", "SyntaxError", "line 1"),
    "raises": (
        """
        import os

        raise RuntimeError("MYAPP_DSN is not set")
        """,
        "RuntimeError",
        "MYAPP_DSN is not set",
    ),
    "dependency": (
        "import streamq_no_such_dependency_9a1\n",
        "ModuleNotFoundError",
        "streamq_no_such_dependency_9a1",
    ),
}


def write_module(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompletedProcess[str]]:
    """One ``python -m worker`` per broken module, run side by side."""
    directory = tmp_path_factory.mktemp("apps")
    envs = {}
    for case, (source, _, _) in BROKEN.items():
        write_module(directory, f"broken_{case}", source)
        env = clean_env(WORKER_APP=f"broken_{case}:app", REDIS_URL="redis://127.0.0.1:1/0",
                        QUEUE_CONSUMER_NOTES_IS_ENABLED="true")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(directory), env.get("PYTHONPATH")])
        )
        envs[case] = env
    return run_workers(envs)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_an_app_that_raises_on_import_exits_2_naming_worker_app_and_the_error(
    case: str, outcomes: dict[str, CompletedProcess[str]]
) -> None:
    _, error_type, detail = BROKEN[case]
    module = f"broken_{case}"
    done = outcomes[case]

    assert done.returncode == 2, done.stderr
    last = last_line(done.stderr)
    assert last.strip().startswith(f"WORKER_APP: cannot load {module}:app")
    assert error_type in last
    assert detail in last
    # The user's code is shown (where it failed), not importlib's or streamq's frames.
    assert f"{module}.py" in done.stderr
    assert "importlib" not in done.stderr
    assert "worker/settings.py" not in done.stderr


def test_a_module_that_does_not_exist_is_named_without_a_traceback(tmp_path: Path) -> None:
    env = clean_env(WORKER_APP="streamq_no_such_app_module:app",
                    QUEUE_CONSUMER_NOTES_IS_ENABLED="true")
    done = run_worker(env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert last_line(done.stderr).strip() == (
        "WORKER_APP: cannot import 'streamq_no_such_app_module': "
        "No module named 'streamq_no_such_app_module'"
    )


def test_load_app_keeps_the_users_exception_as_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(tmp_path, "broken_inline", "raise KeyError('REGION')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SettingsError) as info:
        load_app("broken_inline:app")
    assert isinstance(info.value, AppImportError)
    assert info.value.variables == ["WORKER_APP"]
    assert isinstance(info.value.__cause__, KeyError)
    assert "KeyError: 'REGION'" in str(info.value)
    assert info.value.user_traceback().splitlines()[-1] == "KeyError: 'REGION'"
