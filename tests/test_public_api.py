"""The public API is exactly what ``streamq.__all__`` lists."""

from __future__ import annotations

import types

import streamq


def test_all_lists_exactly_the_public_names_of_the_package() -> None:
    public = {
        name
        for name, value in vars(streamq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(streamq.__all__) - {"__version__"} == public


def test_all_is_sorted_and_has_no_duplicates() -> None:
    assert list(streamq.__all__) == sorted(set(streamq.__all__))


def test_every_public_callable_has_a_docstring() -> None:
    missing = [
        name
        for name in streamq.__all__
        if callable(getattr(streamq, name)) and not (getattr(streamq, name).__doc__ or "").strip()
    ]
    assert missing == []
