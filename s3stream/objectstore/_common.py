"""Small argument checks shared by the object-store implementations."""

from __future__ import annotations

from ..errors import InvalidArgumentError

__all__ = ["as_bytes", "check_prefix", "check_suffix_length"]


def as_bytes(data: bytes) -> bytes:
    """`data` as immutable bytes; bytearray and memoryview are copied (callers may reuse them)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise InvalidArgumentError(f"data must be bytes, got {type(data).__name__}")


def check_prefix(prefix: str) -> str:
    """Validate a `list` prefix: any str (it need not end at a ``/``)."""
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, got {prefix!r}")
    return prefix


def check_suffix_length(length: int) -> int:
    """Validate the `length` argument of `get_suffix`."""
    if type(length) is not int or length <= 0:
        raise InvalidArgumentError(f"suffix length must be an int > 0, got {length!r}")
    return length
