"""The facade: `s3stream.__all__` is sorted, complete, and every public name is documented."""

from __future__ import annotations

import inspect
import types

import s3stream


def test_all_is_sorted_and_complete() -> None:
    assert s3stream.__all__ == sorted(s3stream.__all__)
    public = {
        name
        for name, value in vars(s3stream).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert set(s3stream.__all__) == public


def test_every_public_name_has_a_docstring() -> None:
    for name in s3stream.__all__:
        obj = getattr(s3stream, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"s3stream.{name} has no docstring"
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not callable(member):
                        continue
                    assert inspect.getdoc(member), f"s3stream.{name}.{attr} has no docstring"
