"""Streaming offsets: their JSON form and admission control (``maxOffsetsPerTrigger``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["StreamOffsets", "admit"]


@dataclass(frozen=True, slots=True)
class StreamOffsets:
    """Per-stream offsets as of metadata-log entry `seq`.

    JSON form (what Spark checkpoints): ``{"seq": 17, "streams": {"0": 1200, "3": 88}}``.
    """

    seq: int
    streams: Mapping[int, int]

    def to_json(self) -> dict[str, Any]:
        """The dict Spark stores; stream ids become strings, in ascending order."""
        return {
            "seq": self.seq,
            "streams": {str(sid): off for sid, off in sorted(self.streams.items())},
        }

    @classmethod
    def from_json(cls, data: object, what: str = "offset") -> StreamOffsets:
        """Parse and validate the dict form; `InvalidArgumentError` names `what`."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"{what} must be a JSON object, got {data!r}")
        seq = data.get("seq")
        streams = data.get("streams")
        if type(seq) is not int or seq < 0 or not isinstance(streams, Mapping):
            raise InvalidArgumentError(
                f'{what} must look like {{"seq": 3, "streams": {{"0": 42}}}}, got {data!r}'
            )
        out: dict[int, int] = {}
        for key, value in streams.items():
            try:
                sid = int(key)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"{what}: {key!r} is not a stream id") from None
            if sid < 0 or type(value) is not int or value < 0:
                raise InvalidArgumentError(f"{what}: bad offset {value!r} for stream {key!r}")
            out[sid] = value
        return cls(seq, out)


def admit(begin: StreamOffsets, latest: Mapping[int, int], max_rows: int | None) -> StreamOffsets:
    """End offsets of the next micro-batch from `begin` towards `latest`.

    Streams missing from `begin` are new and start at 0; streams missing from `latest` keep
    their offset. With `max_rows`, at most that many offsets are admitted in all, shared in
    proportion to each stream's backlog (as Kafka's ``maxOffsetsPerTrigger``), the remainder
    going to the largest backlogs, ties to the lowest stream id. The result's `seq` is
    `begin`'s; the caller sets the entry the latest offsets came from.
    """
    ends = dict(begin.streams)
    lag: dict[int, int] = {}
    for sid, end in latest.items():
        first = begin.streams.get(sid, 0)
        if end > first:
            lag[sid] = end - first
    total = sum(lag.values())
    if max_rows is None or total <= max_rows:
        for sid in lag:
            ends[sid] = latest[sid]
        return StreamOffsets(begin.seq, ends)
    if max_rows < 1:
        raise InvalidArgumentError(f"max_rows must be >= 1, got {max_rows}")
    share = {sid: lag[sid] * max_rows // total for sid in lag}
    left = max_rows - sum(share.values())
    for sid in sorted(lag, key=lambda s: (-(lag[s] - share[s]), s)):
        if left == 0:
            break
        if share[sid] < lag[sid]:
            share[sid] += 1
            left -= 1
    for sid, n in share.items():
        if n:
            ends[sid] = begin.streams.get(sid, 0) + n
    return StreamOffsets(begin.seq, ends)
