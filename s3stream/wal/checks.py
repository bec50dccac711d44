"""The refusals every WAL shares, so that each is worded and typed the same way everywhere.

Roles:

- `record_error`: why `append` refuses a record (not bytes, or larger than the WAL takes);
  `record_size_error` for a record given in parts (`append_parts`).
- `check_trim_position`: `trim` takes an int only; `trim_past_acked_error`: nor a position
  above the last acknowledged one.
- `closed_error` and `not_ready_error`: a WAL used after `close()`, or before `recover()` or
  `reset()` made it ready.
- `check_wal_medium`: a file WAL lives in a regular file or on a block device, nothing else
  (a directory, a FIFO, a character device).

The record check is split in two on purpose: an append tests ``type(data) is not bytes or
len(data) > limit`` inline (it is the hot path) and calls `record_error` only to build the
error.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ..errors import InvalidArgumentError, S3StreamError, StreamClosedError

__all__ = [
    "check_trim_position",
    "check_wal_medium",
    "closed_error",
    "not_ready_error",
    "record_error",
    "record_size_error",
    "trim_past_acked_error",
]


def record_error(data: object, max_record: int, wal: str) -> InvalidArgumentError:
    """The error refusing `data` as a record of the WAL `wal` (described), whose records
    may be up to `max_record` bytes; call it only for data that is refused."""
    if type(data) is not bytes:
        return InvalidArgumentError(f"WAL records must be bytes, not {type(data).__name__}")
    return record_size_error(len(data), max_record, wal)


def record_size_error(size: int, max_record: int, wal: str) -> InvalidArgumentError:
    """The error refusing a record of `size` bytes (a record given in parts, say) as one of
    the WAL `wal`, whose records may be up to `max_record` bytes."""
    return InvalidArgumentError(
        f"a WAL record of {size} bytes exceeds the largest {wal} takes "
        f"(max_record_bytes={max_record})"
    )


def check_trim_position(position: object) -> None:
    """Refuse a trim position that is not an int (a bool is not one here)."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise InvalidArgumentError(f"trim position must be an int, got {position!r}")


def trim_past_acked_error(wal: str, position: int, acked: int) -> InvalidArgumentError:
    """The error refusing a trim of `wal` to `position`, above the last acknowledged
    position `acked`: nothing trims a record that may yet fail."""
    return InvalidArgumentError(
        f"cannot trim {wal} to {position}: the last acknowledged position is {acked}"
    )


def closed_error(wal: str) -> StreamClosedError:
    """The error of any call on the WAL `wal` after `close()` began."""
    return StreamClosedError(f"{wal} is closed")


def not_ready_error(wal: str, what: str) -> S3StreamError:
    """The error of `what` (``"append()"``, ``"trim()"``) on the WAL `wal` before it is
    ready."""
    return S3StreamError(f"{wal}: recover() or reset() must run before {what}")


def check_wal_medium(path: Path, mode: int) -> bool:
    """Whether the file WAL at `path`, of `st_mode` `mode`, is on a block device (else a
    regular file); `InvalidArgumentError` if it is neither (nothing is opened or written
    beside it then: a FIFO's open would wait for a writer)."""
    if stat.S_ISBLK(mode):
        return True
    if not stat.S_ISREG(mode):
        raise InvalidArgumentError(
            f"WAL {path} is neither a regular file nor a block device: it cannot be a WAL"
        )
    return False
