"""Retention: per-stream limits by age and by size, as Kafka's ``retention.ms`` and
``retention.bytes``, turned into new start offsets.

A stream's policy lives in its tags (``retention.ms``, ``retention.bytes``; ``-1`` or absent
means no limit there), so every process sharing the bucket sees the same policy through the
metadata log; `CompactionSettings.retention_ms` / `retention_bytes` are the defaults for
streams without such a tag. Retention works on whole blocks (about `block_target_bytes`
each), in offset order: it stops at the first block that must be kept, as Kafka stops at the
first segment that must be kept. Trimming only moves the start offset; the compaction that
follows drops the data below it, and deletion of whole objects waits out the deletion delay.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..format.objects import ObjectIndex
from ..metadata import MetadataState, ObjectMeta, StreamMeta
from ..validation import check_int

__all__ = ["TAG_BYTES", "TAG_MS", "RetentionPolicy", "retention_start"]

#: Stream tag holding the retention by age, in milliseconds.
TAG_MS = "retention.ms"
#: Stream tag holding the retention by size, in bytes.
TAG_BYTES = "retention.bytes"

IndexOf = Callable[[ObjectMeta], ObjectIndex]

_INTEGER = re.compile(r"-?[0-9]{1,19}")


def _parse_limit(tags: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = tags.get(name)
    if raw is None:
        return default
    # Exactly what Kafka writes: optional minus, ASCII digits (int() would also take " 5",
    # "1_000" and non-ASCII digits, which another reader of the tag may not).
    if not isinstance(raw, str) or _INTEGER.fullmatch(raw) is None:
        raise InvalidArgumentError(f"tag {name!r} must be an integer, got {raw!r}")
    value = int(raw)
    if value < 0:
        return None
    return value


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How much of a stream to keep: data older than `retention_ms` milliseconds (by batch
    timestamp) and data beyond the newest `retention_bytes` bytes may go. None: no limit."""

    retention_ms: int | None = None
    retention_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value)

    @property
    def unlimited(self) -> bool:
        """True if the policy keeps everything."""
        return self.retention_ms is None and self.retention_bytes is None

    def to_tags(self) -> dict[str, str]:
        """The stream tags that carry this policy (pass them to `create_stream`)."""
        return {
            TAG_MS: str(-1 if self.retention_ms is None else self.retention_ms),
            TAG_BYTES: str(-1 if self.retention_bytes is None else self.retention_bytes),
        }

    @classmethod
    def from_tags(
        cls, tags: Mapping[str, str], default: RetentionPolicy | None = None
    ) -> RetentionPolicy:
        """The policy a stream's tags set, falling back to `default` for absent tags."""
        base = default or cls()
        return cls(
            retention_ms=_parse_limit(tags, TAG_MS, base.retention_ms),
            retention_bytes=_parse_limit(tags, TAG_BYTES, base.retention_bytes),
        )


def retention_start(
    state: MetadataState,
    stream: StreamMeta,
    policy: RetentionPolicy,
    index_of: IndexOf,
    now_ms: int,
) -> int:
    """The start offset `policy` asks for `stream` (at least its current one).

    Looks only at committed data (objects); reads object indexes through `index_of`.
    """
    start = stream.start_offset
    if policy.unlimited or start >= stream.end_offset:
        return start
    # (end_offset, stored bytes, newest timestamp) of every block at or above the start. The
    # newest is the record timestamps' where the index has them (as Kafka judges a segment by
    # its largest record timestamp): a batch stamped with its append time may hold records of
    # later times of their own, which must not go before those are old.
    blocks: list[tuple[int, int, int]] = []
    for obj in state.objects_for(stream.stream_id, start):
        for blk in index_of(obj).find(stream.stream_id, start):
            newest = blk.max_timestamp
            if blk.time_range is not None:
                newest = max(newest, blk.time_range[1])
            blocks.append((blk.end_offset, blk.stored_size, newest))
    total = sum(size for _, size, _ in blocks)
    cutoff = None if policy.retention_ms is None else now_ms - policy.retention_ms
    new_start = start
    for end, size, newest in blocks:
        too_big = policy.retention_bytes is not None and total - size >= policy.retention_bytes
        too_old = cutoff is not None and newest < cutoff
        if not (too_big or too_old):
            break
        total -= size
        new_start = end
    return min(new_start, stream.end_offset)
