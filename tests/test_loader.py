"""One loader for every ``module:attribute`` reference (WORKER_APP, --contracts, compat)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamq import ConfigurationError, LoadError
from streamq.loader import load_object, split_ref


def write(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(source)


def test_a_reference_names_a_module_attribute_dotted_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "loader_ok", "class Box:\n    inner = 42\nvalue = 'v'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_object("loader_ok:value") == "v"
    assert load_object(" loader_ok:Box.inner ") == 42
    assert split_ref("a.b:c.d") == ("a.b", "c.d")


@pytest.mark.parametrize("ref", ["loader_ok", ":app", "mod:", ""])
def test_a_malformed_reference_is_refused_before_importing(ref: str) -> None:
    with pytest.raises(LoadError) as info:
        load_object(ref)
    assert info.value.reason == "malformed"
    assert "expected package.module:attribute" in str(info.value)
    assert isinstance(info.value, ConfigurationError)


def test_a_missing_module_or_attribute_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "loader_partial", "present = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LoadError) as missing_module:
        load_object("loader_no_such_module:app")
    assert missing_module.value.reason == "no_module"
    assert str(missing_module.value) == (
        "cannot import 'loader_no_such_module': No module named 'loader_no_such_module'"
    )
    with pytest.raises(LoadError) as missing_attr:
        load_object("loader_partial:absent")
    assert missing_attr.value.reason == "no_attribute"
    assert "module 'loader_partial' has no attribute 'absent'" in str(missing_attr.value)


def test_a_module_that_raises_keeps_the_users_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An import *inside* the user's module that fails is the user's error, not a missing app.
    write(tmp_path, "loader_broken", "import loader_dependency_that_is_not_installed\n")
    write(tmp_path, "loader_raises", "raise KeyError('REGION')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for ref, cause in (("loader_broken:app", ModuleNotFoundError),
                       ("loader_raises:app", KeyError)):
        with pytest.raises(LoadError) as info:
            load_object(ref)
        assert info.value.reason == "raised"
        assert isinstance(info.value.error, cause)
        assert info.value.__cause__ is info.value.error
        assert f"cannot load {ref}: importing it raised {cause.__name__}" in str(info.value)


def test_the_current_directory_is_importable_as_under_python_m(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "loader_in_cwd", "here = True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    assert load_object("loader_in_cwd:here") is True
