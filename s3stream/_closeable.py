"""`Closeable`: the context-manager protocol shared by clients, streams, WALs and stores."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Closeable"]


class Closeable(ABC):
    """Something with a `close` method that a ``with`` block closes on exit."""

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
