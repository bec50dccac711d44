"""Hypothesis strategies for the values a WAL or an object store is fed.

Sizes favour the edges where storage code breaks: empty, one byte, and either side of the
4 KiB alignment of block devices. Object keys are built so that no key is a directory prefix
of another (leaves carry a ``.`` that directory segments never do), because a local-directory
store cannot hold both ``a`` and ``a/b``, and S3 can: the kit tests what both share.
"""

from __future__ import annotations

import random

from ..errors import InvalidArgumentError
from . import MISSING_DEPENDENCIES_MESSAGE

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

__all__ = [
    "EDGE_SIZES",
    "INVALID_KEYS",
    "byte_ranges",
    "filler",
    "object_data",
    "object_keys",
    "wal_records",
]

#: Sizes around which length and alignment arithmetic tends to go wrong.
EDGE_SIZES = (0, 1, 2, 7, 8, 511, 512, 513, 4095, 4096, 4097, 8191, 8192, 65535, 65536)

#: Keys every store must refuse with `InvalidArgumentError`.
INVALID_KEYS: tuple[object, ...] = (
    "",
    "/a",
    "a//b",
    "a/./b",
    "a/../b",
    "a/",
    ".",
    "..",
    None,
    7,
    b"a",
)

_DIR_SEGMENTS = ("a", "b", "a-b", "ab", "z", "\u00fc")
_LEAF_NAMES = ("x", "y", "x-1", "a", "b", "\u00fc")


def filler(size: int, seed: int) -> bytes:
    """`size` pseudo-random bytes determined by `seed` (cheap to make, hard to confuse)."""
    if size <= 0:
        return b""
    return random.Random(seed).randbytes(size)


def wal_records(max_size: int = 16 << 10) -> st.SearchStrategy[bytes]:
    """WAL record payloads up to `max_size` bytes: short ones mostly, edge sizes often."""
    if max_size < 0:
        raise InvalidArgumentError(f"max_size must be >= 0, got {max_size}")
    edges = [s for s in EDGE_SIZES if s <= max_size]
    return st.one_of(
        st.binary(max_size=min(64, max_size)),
        st.builds(filler, st.sampled_from(edges), st.integers(0, 1 << 32)),
        st.builds(filler, st.integers(0, max_size), st.integers(0, 1 << 32)),
    )


def object_data(max_size: int = 64 << 10) -> st.SearchStrategy[bytes]:
    """Object contents up to `max_size` bytes, the empty object included."""
    return wal_records(max_size)


def object_keys(max_depth: int = 3) -> st.SearchStrategy[str]:
    """Valid object keys of 1 to `max_depth` segments, none a directory prefix of another."""
    if max_depth < 1:
        raise InvalidArgumentError(f"max_depth must be >= 1, got {max_depth}")
    dirs = st.lists(st.sampled_from(_DIR_SEGMENTS), max_size=max_depth - 1)
    leaf = st.builds(lambda name, n: f"{name}.{n}", st.sampled_from(_LEAF_NAMES), st.integers(0, 3))
    return st.builds(lambda d, name: "/".join([*d, name]), dirs, leaf)


def byte_ranges(size: int) -> st.SearchStrategy[tuple[int, int | None]]:
    """``(start, end)`` arguments for a ranged get of an object of `size` bytes, past-the-end
    and open-ended ranges included."""
    starts = st.integers(0, size + 8)
    return starts.flatmap(
        lambda start: st.tuples(st.just(start), st.none() | st.integers(start, size + 16))
    )
