"""Fetched batches → Kafka-like rows, as Arrow record batches or tuples (extra ``arrow``).

The one decoder behind the Spark source (`s3stream.spark`, whose executors feed it the blocks
they fetched) and `StreamReader.read_arrow` (which feeds it pages of committed batches): both
give the same columns and the same values, so a query means the same in Spark, DuckDB or
Polars. It lives outside `s3stream.spark` so that it imports without pyspark.

The Arrow path never loops over records in Python: each records payload is decoded into
numpy columns (`s3stream.records.decode_columns`), the columns of many batches are
concatenated, and lengths become Arrow offsets with one cumulative sum; the bytes are joined
once per column. `arrow_batches` emits `pyarrow.RecordBatch`es of about `batch_rows` rows.
The tuple path (`tuple_rows`) yields one Python tuple per row; it exists for comparison and
for environments without Arrow, and is an order of magnitude slower.

Row rules: records of a RECORDS batch appear at their own offsets, filtered to the slice's
range; a RAW batch is one row (key null, value = payload, timestampType 0, ``record_count``
= its record count) in the slice that holds its base offset (as `Stream.read_records`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

try:
    import pyarrow as pa
except ModuleNotFoundError as exc:
    if exc.name != "pyarrow":
        raise
    raise ModuleNotFoundError(
        "Arrow output (StreamReader.read_arrow, the Spark source) needs pyarrow: "
        "pip install 's3stream[arrow]'",
        name="pyarrow",
    ) from exc

from .errors import CorruptionError, InvalidArgumentError
from .metadata import MetadataState
from .records import CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP, decode_columns
from .types import BatchKind, FetchedBatch, FetchResult
from .validation import check_int

__all__ = [
    "COLUMNS",
    "MAX_TIMESTAMP_MS",
    "MIN_TIMESTAMP_MS",
    "RangeSlice",
    "RowSlice",
    "arrow_batches",
    "arrow_schema",
    "range_slices",
    "record_batch_reader",
    "stream_labels",
    "tuple_rows",
]

#: Column names, in order; ``headers`` only with ``includeHeaders``.
COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
    "stream_id",
    "record_count",
)
#: The timestamps (ms since the epoch) every reader of the rows can hold: Python's `datetime`
#: range (years 1 to 9999, which Spark's tuple rows and pyarrow's ``to_pylist`` need; Spark's
#: own microseconds in an i64 reach further). Outside it the ``timestamp`` column is null, in
#: the Arrow and the tuple rows alike.
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999
_MAX_ARROW_BYTES = (1 << 31) - 1
_DEFAULT_MAX_BATCH_BYTES = 64 << 20
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_HEADERS_TYPE = pa.list_(pa.field("element", _HEADER_TYPE))
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_NULL_LENGTH = np.array([-1], dtype=np.int64)
_NULL_LENGTH.flags.writeable = False
_NO_HEADERS = np.zeros(1, dtype=np.int64)
_NO_HEADERS.flags.writeable = False

I64 = npt.NDArray[np.int64]
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class RowSlice(Protocol):
    """Offsets ``[start_offset, end_offset)`` of one stream, with the labels of its rows.

    What the decoder needs of a slice: the Spark source's planned `ReadSlice` (blocks of one
    object) and the reader's `RangeSlice` both have it. `key` names where the rows come from,
    in error messages.
    """

    @property
    def stream_id(self) -> int: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def partition(self) -> int | None: ...
    @property
    def key(self) -> str: ...
    @property
    def start_offset(self) -> int: ...
    @property
    def end_offset(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RangeSlice:
    """A `RowSlice` of committed data read by offsets (`StreamReader.read_arrow`)."""

    stream_id: int
    topic: str | None
    partition: int | None
    key: str
    start_offset: int
    end_offset: int


def stream_labels(
    tags: Mapping[str, str], topic_tag: str, partition_tag: str
) -> tuple[str | None, int | None]:
    """The ``topic`` and ``partition`` columns of a stream with `tags`, as the Spark source
    labels them: the tags' values, the partition as an int32 (None when absent or not one)."""
    raw = tags.get(partition_tag)
    partition: int | None = None
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is not None and _INT32_MIN <= value <= _INT32_MAX:
            partition = value
    return tags.get(topic_tag), partition


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of the rows (what Spark's ``to_arrow_schema`` makes of ours)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_TYPE))
    fields += [pa.field("stream_id", pa.int64()), pa.field("record_count", pa.int32())]
    return pa.schema(fields)


class _Chunk:
    """Columns of the rows gathered for the next Arrow batch (one stream at a time).

    Per appended batch only views and a few numbers are kept; offsets, timestamps, kinds
    and counts are computed once per chunk in `build`, because per-batch numpy calls
    (microseconds each, ten thousand batches per GiB of 100-byte records) would otherwise
    cost more than decoding itself.
    """

    def __init__(self, include_headers: bool) -> None:
        self.headers = include_headers
        self.rows = 0
        self.bytes = 0
        #: (first offset, rows) per added piece, and whether each starts where the last ended.
        self.runs: list[tuple[int, int]] = []
        self.contiguous = True
        #: Own timestamps (`NO_TIMESTAMP` where a record has none), and per piece the base
        #: timestamp that replaces them.
        self.stamps: list[I64] = []
        self.bases: list[int] = []
        #: (row index, record count) of RAW rows; every other row counts one record.
        self.raw_rows: list[tuple[int, int]] = []
        self.key_lens: list[I64] = []
        self.key_data: list[memoryview | bytes] = []
        self.value_lens: list[I64] = []
        self.value_data: list[memoryview | bytes] = []
        self.h_counts: list[I64] = []
        self.hkey_lens: list[I64] = []
        self.hkey_data: list[memoryview | bytes] = []
        self.hval_lens: list[I64] = []
        self.hval_data: list[memoryview | bytes] = []

    def _run(self, first: int, n: int, base_timestamp: int) -> None:
        if self.runs:
            last_first, last_n = self.runs[-1]
            if last_first + last_n != first:
                self.contiguous = False
        self.runs.append((first, n))
        self.bases.append(base_timestamp)
        self.rows += n

    def add_raw(self, batch: FetchedBatch) -> None:
        self.raw_rows.append((self.rows, batch.count))
        self._run(batch.base_offset, 1, batch.base_timestamp)
        self.bytes += batch.size
        # A raw batch's own time is its append time, reported as CREATE_TIME.
        self.stamps.append(np.array([batch.base_timestamp], dtype=np.int64))
        self.key_lens.append(_NULL_LENGTH)
        self.value_lens.append(np.array([batch.size], dtype=np.int64))
        self.value_data.append(batch.view)
        if self.headers:
            self.h_counts.append(_NO_HEADERS)

    def add_records(self, batch: FetchedBatch, lo: int, hi: int, location: str) -> None:
        cols = decode_columns(batch.view, expected_count=batch.count, location=location)
        whole = lo == 0 and hi == cols.count
        self._run(batch.base_offset + lo, hi - lo, batch.base_timestamp)
        self.stamps.append(cols.timestamps if whole else cols.timestamps[lo:hi])
        for lens, data, out_lens, out_data in (
            (cols.key_lengths, cols.key_data, self.key_lens, self.key_data),
            (cols.value_lengths, cols.value_data, self.value_lens, self.value_data),
        ):
            if whole:
                out_lens.append(lens)
                out_data.append(data)
                self.bytes += len(data)
            else:
                part = _slice_data(data, lens, lo, hi)
                out_lens.append(lens[lo:hi])
                out_data.append(part)
                self.bytes += len(part)
        if self.headers:
            counts = cols.header_counts
            self.h_counts.append(counts if whole else counts[lo:hi])
            if cols.has_headers:
                h0 = int(counts[:lo].sum())
                h1 = h0 + int(counts[lo:hi].sum())
                for lens, data, out_lens, out_data in (
                    (cols.header_key_lengths, cols.header_key_data, self.hkey_lens, self.hkey_data),
                    (
                        cols.header_value_lengths,
                        cols.header_value_data,
                        self.hval_lens,
                        self.hval_data,
                    ),
                ):
                    out_lens.append(lens[h0:h1])
                    part = _slice_data(data, lens, h0, h1)
                    out_data.append(part)
                    # Counted too: a chunk's header column must stay under Arrow's 2 GiB.
                    self.bytes += len(part)

    def _offsets(self) -> I64:
        if self.contiguous:
            first = self.runs[0][0]
            return np.arange(first, first + self.rows, dtype=np.int64)
        return np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in self.runs])

    def _times(self) -> tuple[I64, npt.NDArray[np.int32]]:
        """(timestamp, timestampType): own times are CREATE_TIME, missing ones take the
        batch's append time as LOG_APPEND_TIME."""
        stamps = np.concatenate(self.stamps)
        missing = stamps == NO_TIMESTAMP
        if not missing.any():
            return stamps, np.full(self.rows, CREATE_TIME, dtype=np.int32)
        lengths = np.fromiter((n for _, n in self.runs), dtype=np.int64, count=len(self.runs))
        bases = np.repeat(np.array(self.bases, dtype=np.int64), lengths)
        stamps = np.where(missing, bases, stamps)
        kinds = np.where(missing, np.int32(LOG_APPEND_TIME), np.int32(CREATE_TIME))
        return stamps, kinds.astype(np.int32, copy=False)

    def build(self, s: RowSlice, schema: pa.Schema) -> pa.RecordBatch:
        n = self.rows
        stamps, kinds = self._times()
        ok = (stamps >= MIN_TIMESTAMP_MS) & (stamps <= MAX_TIMESTAMP_MS)
        ts_nulls = n - int(np.count_nonzero(ok))
        micros = (np.where(ok, stamps, 0) if ts_nulls else stamps) * 1000
        counts = np.ones(n, dtype=np.int32)
        for row, count in self.raw_rows:
            counts[row] = count
        arrays: list[pa.Array] = [
            _binary(pa.binary(), self.key_lens, self.key_data),
            _binary(pa.binary(), self.value_lens, self.value_data),
            pa.nulls(n, pa.string()) if s.topic is None else pa.repeat(pa.scalar(s.topic), n),
            pa.nulls(n, pa.int32())
            if s.partition is None
            else pa.repeat(pa.scalar(s.partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self._offsets())]),
            pa.Array.from_buffers(
                _TIMESTAMP_TYPE,
                n,
                [_validity(ok, ts_nulls), pa.py_buffer(micros)],
                null_count=ts_nulls,
            ),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(kinds)]),
        ]
        if self.headers:
            arrays.append(self._headers(n, s))
        arrays.append(pa.repeat(pa.scalar(s.stream_id, pa.int64()), n))
        arrays.append(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(counts)]))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _headers(self, n: int, s: RowSlice) -> pa.Array:
        counts = np.concatenate(self.h_counts)
        total = int(counts.sum())
        keys = _binary(pa.string(), self.hkey_lens, self.hkey_data, rows=total)
        try:
            keys.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise CorruptionError(
                f"header key of stream {s.stream_id} in {s.key} is not UTF-8", location=s.key
            ) from exc
        values = _binary(pa.binary(), self.hval_lens, self.hval_data, rows=total)
        structs = pa.StructArray.from_arrays([keys, values], fields=list(_HEADER_TYPE))
        # As in Spark's Kafka source, a record without headers has null, not [].
        has = counts > 0
        nulls = n - int(has.sum())
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:], dtype=np.int32)
        return pa.Array.from_buffers(
            _HEADERS_TYPE,
            n,
            [_validity(has, nulls), pa.py_buffer(offsets)],
            null_count=nulls,
            children=[structs],
        )


def _slice_data(data: memoryview | bytes, lens: I64, lo: int, hi: int) -> memoryview | bytes:
    if lo == 0 and hi == len(lens):
        return data
    sizes = np.maximum(lens, 0)
    a = int(sizes[:lo].sum())
    return data[a : a + int(sizes[lo:hi].sum())]


def _validity(valid: npt.NDArray[np.bool_], nulls: int) -> pa.Buffer | None:
    if nulls == 0:
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _binary(
    typ: pa.DataType,
    lens_parts: list[I64],
    data_parts: list[memoryview | bytes],
    *,
    rows: int | None = None,
) -> pa.Array:
    lens = np.concatenate(lens_parts) if lens_parts else np.zeros(0, dtype=np.int64)
    n = len(lens) if rows is None else rows
    valid = lens >= 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(valid, lens, 0), out=offsets[1:])
    if offsets[-1] > _MAX_ARROW_BYTES:
        raise CorruptionError(f"{offsets[-1]} bytes in one Arrow column chunk exceed 2 GiB")
    nulls = n - int(valid.sum())
    data = b"".join(data_parts)
    return pa.Array.from_buffers(
        typ,
        n,
        [_validity(valid, nulls), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=nulls,
    )


def _pieces(
    fetched: Iterable[tuple[RowSlice, list[FetchedBatch]]],
) -> Iterator[tuple[RowSlice, FetchedBatch, int, int]]:
    """``(slice, batch, lo, hi)``: the record indexes of each batch that the slice owns."""
    for s, batches in fetched:
        for b in batches:
            if b.kind is BatchKind.RAW:
                if s.start_offset <= b.base_offset < s.end_offset:
                    yield s, b, 0, 1
                continue
            lo = max(s.start_offset - b.base_offset, 0)
            hi = min(s.end_offset - b.base_offset, b.count)
            if lo < hi:
                yield s, b, lo, hi


def arrow_batches(
    fetched: Iterable[tuple[RowSlice, list[FetchedBatch]]],
    *,
    include_headers: bool,
    batch_rows: int = 65536,
    max_batch_bytes: int = _DEFAULT_MAX_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Rows of the fetched batches as Arrow record batches of about `batch_rows` rows.

    A batch closes early when its keys and values pass `max_batch_bytes`, or when the next
    row belongs to another stream (topic, partition and stream id are per-batch constants).
    """
    schema = arrow_schema(include_headers)
    chunk = _Chunk(include_headers)
    current: RowSlice | None = None
    for s, b, lo, hi in _pieces(fetched):
        if current is not None and (
            s.stream_id != current.stream_id
            or chunk.rows >= batch_rows
            or chunk.bytes >= max_batch_bytes
        ):
            yield chunk.build(current, schema)
            chunk = _Chunk(include_headers)
        current = s
        if b.kind is BatchKind.RAW:
            chunk.add_raw(b)
        else:
            chunk.add_records(b, lo, hi, f"{s.key} (stream {s.stream_id})")
    if current is not None and chunk.rows:
        yield chunk.build(current, schema)


def _split(data: memoryview | bytes, lens: list[int]) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos = 0
    for n in lens:
        if n < 0:
            out.append(None)
        else:
            out.append(bytes(data[pos : pos + n]))
            pos += n
    return out


def _datetime(ms: int) -> datetime | None:
    if not MIN_TIMESTAMP_MS <= ms <= MAX_TIMESTAMP_MS:
        return None
    return _EPOCH + timedelta(milliseconds=ms)


def tuple_rows(
    fetched: Iterable[tuple[RowSlice, list[FetchedBatch]]], *, include_headers: bool
) -> Iterator[tuple[Any, ...]]:
    """The same rows as `arrow_batches`, one Python tuple each (the slow path)."""
    for s, b, lo, hi in _pieces(fetched):
        if b.kind is BatchKind.RAW:
            row: list[Any] = [
                None,
                b.payload,
                s.topic,
                s.partition,
                b.base_offset,
                _datetime(b.base_timestamp),
                CREATE_TIME,
            ]
            if include_headers:
                row.append(None)
            yield (*row, s.stream_id, b.count)
            continue
        cols = decode_columns(
            b.view, expected_count=b.count, location=f"{s.key} (stream {s.stream_id})"
        )
        stamps, kinds = cols.resolve_timestamps(b.base_timestamp)
        keys = _split(cols.key_data, cols.key_lengths.tolist())
        values = _split(cols.value_data, cols.value_lengths.tolist())
        headers: list[list[tuple[str, bytes | None]] | None] = [None] * cols.count
        if include_headers and cols.has_headers:
            hkeys = _split(cols.header_key_data, cols.header_key_lengths.tolist())
            hvals = _split(cols.header_value_data, cols.header_value_lengths.tolist())
            at = 0
            for i, c in enumerate(cols.header_counts.tolist()):
                if c:
                    try:
                        names = [bytes(k or b"").decode("utf-8") for k in hkeys[at : at + c]]
                    except UnicodeDecodeError as exc:
                        raise CorruptionError(
                            f"header key of stream {s.stream_id} in {s.key} is not UTF-8",
                            location=s.key,
                        ) from exc
                    headers[i] = list(zip(names, hvals[at : at + c], strict=True))
                    at += c
        stamp_list = stamps.tolist()
        kind_list = kinds.tolist()
        for i in range(lo, hi):
            row = [
                keys[i],
                values[i],
                s.topic,
                s.partition,
                b.base_offset + i,
                _datetime(stamp_list[i]),
                kind_list[i],
            ]
            if include_headers:
                row.append(headers[i])
            yield (*row, s.stream_id, 1)


def _pages(
    slices: Iterable[RangeSlice], read: Callable[[int, int, int], FetchResult]
) -> Iterator[tuple[RangeSlice, list[FetchedBatch]]]:
    """``(slice, batches)`` page by page: ``read(stream_id, start, end)`` from each slice's
    start until a page comes back empty or the slice's end is reached."""
    for s in slices:
        pos = s.start_offset
        while pos < s.end_offset:
            page = read(s.stream_id, pos, s.end_offset)
            if not page.batches:
                break
            yield s, page.batches
            pos = page.next_offset


def record_batch_reader(
    slices: Iterable[RangeSlice],
    read: Callable[[int, int, int], FetchResult],
    *,
    include_headers: bool,
    batch_rows: int = 65536,
) -> pa.RecordBatchReader:
    """The rows of `slices` as a `pyarrow.RecordBatchReader` (lazy: a page is read when the
    consumer asks for the rows it holds), decoded by `arrow_batches` as in the Spark source."""
    batches = arrow_batches(
        _pages(slices, read), include_headers=include_headers, batch_rows=batch_rows
    )
    return pa.RecordBatchReader.from_batches(arrow_schema(include_headers), batches)


def _offsets(name: str, value: object) -> tuple[int | None, dict[int, int]]:
    """(the offset for every stream, per-stream offsets) of a `start` or `end` argument."""
    if value is None or type(value) is int:
        return (None if value is None else check_int(name, value)), {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"{name} must be an offset, a mapping of stream id to offset, or None, "
            f"not {type(value).__name__}"
        )
    return None, {
        check_int(f"{name} key", sid): check_int(f"{name}[{sid}]", off)
        for sid, off in value.items()
    }


def _stream_ids(value: object) -> list[int] | None:
    if value is None:
        return None
    if type(value) is int:
        return [check_int("stream_ids", value)]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"stream_ids must be a stream id, an iterable of them, or None, "
            f"not {type(value).__name__}"
        )
    return sorted({check_int("stream_ids item", sid) for sid in value})


def range_slices(
    state: MetadataState,
    stream_ids: object,
    start: object,
    end: object,
    *,
    start_timestamp: int | None = None,
    end_timestamp: int | None = None,
    seek: Callable[[int, int], int | None],
    tags: Mapping[str, str] | None,
    topic_tag: str,
    partition_tag: str,
    location: str,
) -> list[RangeSlice]:
    """What `StreamReader.read_arrow` reads, from one metadata snapshot: for each selected
    stream (those `stream_ids` names, else every stream with `tags`; by id), the offsets
    ``[start, end)`` clipped to what the stream holds committed, then narrowed by the
    timestamps: ``seek(stream_id, ts)`` is the stream's first offset whose timestamp is
    >= `ts` (None if there is none). Streams left with nothing are left out. `location`
    names the store in error messages."""
    default_start, starts = _offsets("start", start)
    default_end, ends = _offsets("end", end)
    ids = _stream_ids(stream_ids)
    wanted = dict(tags or {})
    streams = (
        state.list_streams(wanted)
        if ids is None
        else [
            m
            for m in map(state.get_stream, ids)
            if all(m.tags.get(k) == v for k, v in wanted.items())
        ]
    )
    selected = {m.stream_id for m in streams}
    for name, per in (("start", starts), ("end", ends)):
        unknown = sorted(set(per) - selected)
        if unknown:
            raise InvalidArgumentError(f"{name} names streams {unknown} that are not read")
    out = []
    for m in streams:
        first = starts.get(m.stream_id, default_start)
        last = ends.get(m.stream_id, default_end)
        lo = m.start_offset if first is None else max(first, m.start_offset)
        hi = m.end_offset if last is None else min(last, m.end_offset)
        if start_timestamp is not None and lo < hi:
            at = seek(m.stream_id, start_timestamp)
            lo = hi if at is None else max(lo, at)
        if end_timestamp is not None and lo < hi:
            at = seek(m.stream_id, end_timestamp)
            hi = hi if at is None else min(hi, at)
        if lo < hi:
            topic, partition = stream_labels(m.tags, topic_tag, partition_tag)
            out.append(RangeSlice(m.stream_id, topic, partition, location, lo, hi))
    return out
