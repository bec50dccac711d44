"""WAL recovery: replay what a previous run of this node acknowledged but did not commit.

Each record the WAL returns is checked against the metadata: already committed → dropped;
a stream taken over, closed or deleted since → dropped as fenced (never acknowledged, or
no longer this node's); otherwise it must
continue its stream's offsets exactly (a gap means acknowledged data is missing: corruption).
What remains is uploaded and committed, then the WAL is reset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..cache.log_cache import LogCache
from ..errors import CorruptionError, S3StreamError
from ..format.batch import WAL_PREFIX, decode_wal_record
from ..metadata import MetadataState
from ..types import StreamState
from ..wal.base import WriteAheadLog

__all__ = ["RecoveryReport", "recover_wal"]

_log = logging.getLogger("s3stream.storage")


@dataclass(slots=True)
class RecoveryReport:
    """What `Storage.recover` found in the WAL and did with it."""

    records: int = 0
    bytes: int = 0
    already_committed: int = 0
    fenced: int = 0
    uploaded_batches: int = 0


def recover_wal(
    wal: WriteAheadLog,
    state: MetadataState,
    cache: LogCache,
    upload_threshold_bytes: int,
    upload: Callable[[], None],
) -> RecoveryReport:
    """Replay `wal` against `state` into `cache`, calling `upload` (which uploads and commits
    what is pending, trimming nothing) whenever `upload_threshold_bytes` are pending and at
    the end; then reset the WAL. Raises what `upload` raises, leaving the WAL as it was."""
    report = RecoveryReport()
    expected: dict[int, int] = {}
    closed: dict[int, int] = {}
    for pos, data in wal.recover():
        report.records += 1
        report.bytes += len(data)
        epoch, batch, _ = decode_wal_record(data, f"{wal.describe()}@{pos}")
        sid = batch.stream_id
        try:
            s = state.get_stream(sid)
        except S3StreamError:
            report.fenced += 1
            continue
        if batch.next_offset <= s.end_offset:
            report.already_committed += 1
            continue
        if epoch != s.epoch:
            report.fenced += 1
            continue
        if s.state is not StreamState.OPEN:
            # Closed since at this epoch: its release uploaded everything acknowledged
            # first, so records past its end were refused (appends completing after the
            # close), never acknowledged; replayed, they failed every commit ("closed") and
            # every reopen and take-over of this WAL with it. (The other way here: a
            # take-over or open that accepted the loss of this WAL, accept_wal_loss.)
            report.fenced += 1
            closed[sid] = closed.get(sid, 0) + 1
            continue
        want = expected.get(sid, s.end_offset)
        if batch.base_offset != want:
            raise CorruptionError(
                f"WAL record at {pos} holds stream {sid} offsets from {batch.base_offset}, "
                f"expected {want}: acknowledged data is missing",
                location=wal.describe(),
                position=pos,
            )
        expected[sid] = batch.next_offset
        cache.put(
            sid, batch.base_offset, batch.count, batch.base_timestamp, batch.kind,
            batch.properties, batch.payload, data, WAL_PREFIX.size, pos, epoch,
        )  # fmt: skip
        report.uploaded_batches += 1
        if cache.pending_bytes >= upload_threshold_bytes:
            upload()
    if closed:
        _log.warning(
            "dropped %d WAL records past the end of closed streams %s: appends their close "
            "refused (or, after a take-over or open with accept_wal_loss, appends given up)",
            sum(closed.values()),
            sorted(closed),
        )
    # Uploads made while replaying trim nothing (a WAL takes no trim before its recovery
    # ends); the reset drops everything at once.
    upload()
    wal.reset()
    return report
