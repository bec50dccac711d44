"""`os_error`: an `OSError` of a file WAL's medium as the library's error, naming the path.

One classification for the WAL file and its holder lock: what no retry can fix (permissions,
a path that is no file, a size past the file system's limit) is `InvalidArgumentError`; the
rest (no space, I/O errors) `UnavailableError`, retryable.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ..errors import InvalidArgumentError, S3StreamError, UnavailableError

__all__ = ["os_error"]


def os_error(action: str, path: Path, exc: OSError) -> S3StreamError:
    """Translate an OSError into the library's errors, naming the path."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UnavailableError(f"{action} {path}: no space left on the device ({reason})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InvalidArgumentError(f"{action} {path}: permission denied ({reason})")
    if exc.errno in (
        errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG,
        errno.ELOOP,  # a symlink loop on the way: no retry can fix it
    ):  # fmt: skip
        return InvalidArgumentError(f"{action} {path}: {reason}")
    if exc.errno == errno.EFBIG:
        # Larger than the file system allows: no retry can help.
        return InvalidArgumentError(f"{action} {path}: {reason}")
    return UnavailableError(f"{action} {path}: {reason}")
