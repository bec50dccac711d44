"""Binding a kit state machine to the hooks of a test-suite instance (WAL or object store)."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["bind_state_machine"]

M = TypeVar("M", bound=type)


def bind_state_machine(base: M, hooks: Any, directory: Path | None, prefix: str) -> M:
    """A subclass of `base` whose runs use `hooks` and get a fresh directory each: below
    `directory` if given, else a new temporary directory named with `prefix`."""
    counter = itertools.count()

    def new_directory() -> Path:
        if directory is None:
            return Path(tempfile.mkdtemp(prefix=prefix))
        path = directory / f"example-{next(counter)}"
        path.mkdir(parents=True)
        return path

    namespace = {"hooks": hooks, "new_directory": staticmethod(new_directory)}
    bound: M = type(f"{type(hooks).__name__}StateMachine", (base,), namespace)  # type: ignore[assignment]
    return bound
