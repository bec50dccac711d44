"""Records inside batch payloads: a Kafka-like `Record` and its columnar codec.

Many records travel as one batch of kind `BatchKind.RECORDS`; the batch's `count` is the
number of records, so record *i* of a batch appended at `base_offset` has offset
``base_offset + i``. The payload is columnar (all lengths first, then all bytes), so a whole
batch decodes with a handful of numpy calls into arrays that map straight onto Arrow buffers;
the byte layout is specified in ``docs/records.md``.

Timestamps follow Kafka: a record either carries its own (``CreateTime``) or none, in which
case it takes the batch's base timestamp, stamped by the client at append time
(``LogAppendTime``).

Roles: `Record` (the value type), `encode_records` / `records_batch` (records → payload or
`RecordBatch`), `decode_columns` (payload → validated `RecordColumns`), `decode_records`
(payload → records) and `batch_records` (a fetched batch of either kind → ``(offset, record)``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import zstandard

from .errors import CorruptionError, InvalidArgumentError
from .types import MAX_BATCH_COUNT, BatchKind, FetchedBatch, FetchResult, RecordBatch
from .validation import check_choice, check_instance, check_int, check_text, check_zstd_level

__all__ = [
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "NO_TIMESTAMP",
    "RECORDS_FORMAT_VERSION",
    "RECORDS_HEADER",
    "Header",
    "Record",
    "RecordColumns",
    "batch_records",
    "decode_columns",
    "decode_records",
    "decode_timestamps",
    "encode_records",
    "records_batch",
]

#: ``timestampType`` of a record that carries its own timestamp (as in Kafka).
CREATE_TIME = 0
#: ``timestampType`` of a record that took the batch's append time (as in Kafka).
LOG_APPEND_TIME = 1
#: Marker in a 64-bit timestamp column for "this record has no timestamp of its own".
NO_TIMESTAMP = -(1 << 63)
#: Version byte written first in every records payload; decoders refuse any other.
RECORDS_FORMAT_VERSION = 1

#: version, flags, ts_mode, key/value/header-count/header-key/header-value size widths,
#: record count, body length (uncompressed), timestamp base.
RECORDS_HEADER = struct.Struct("<BBBBBBBBIIq")

#: A record header: a name and an optional value, as in Kafka.
Header = tuple[str, bytes | None]

_FLAG_ZSTD = 0x01
_KNOWN_FLAGS = _FLAG_ZSTD
_TS_NONE = 0  # no record has a timestamp: no column stored
_TS_DELTA32 = 1  # every record has one: u32 deltas from ts_base
_TS_ABS64 = 2  # i64 per record, NO_TIMESTAMP where a record has none
_TS_MODES = (_TS_NONE, _TS_DELTA32, _TS_ABS64)
_WIDTHS: dict[int, np.dtype[np.unsignedinteger]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
}
_U32_MAX = (1 << 32) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_COMPRESSIONS = ("none", "zstd")
_EMPTY_I64: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
_EMPTY_I64.setflags(write=False)

assert RECORDS_HEADER.size == 24


def _as_bytes(name: str, value: object, *, nullable: bool) -> bytes | None:
    if value is None:
        if nullable:
            return None
        raise InvalidArgumentError(f"{name} must be bytes, not None")
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgumentError(
        f"{name} must be bytes, bytearray or memoryview"
        f"{' or None' if nullable else ''}, not {type(value).__name__}"
    )


def _check_headers(headers: object) -> tuple[Header, ...]:
    if headers == ():
        return ()
    if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
        raise InvalidArgumentError(
            f"headers must be a sequence of (str, bytes | None) pairs, got {headers!r}"
        )
    out: list[Header] = []
    for i, item in enumerate(headers):
        if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
            raise InvalidArgumentError(
                f"headers[{i}] must be a (str, bytes | None) pair, got {item!r}"
            )
        name = check_text(f"headers[{i}] name", item[0])
        out.append((name, _as_bytes(f"headers[{i}] value", item[1], nullable=True)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka-like record: a value, an optional key, timestamp (ms) and headers.

    `value` may be None (a tombstone, as in Kafka). `timestamp` None means "stamp me with
    the batch's append time". `headers` is a sequence of ``(name, value)`` pairs; names may
    repeat. bytearray and memoryview inputs are copied to bytes; lists become tuples.
    """

    value: bytes | None
    key: bytes | None = None
    timestamp: int | None = None
    headers: tuple[Header, ...] = ()

    def __post_init__(self) -> None:
        if type(self.value) is not bytes:
            object.__setattr__(self, "value", _as_bytes("value", self.value, nullable=True))
        if self.key is not None and type(self.key) is not bytes:
            object.__setattr__(self, "key", _as_bytes("key", self.key, nullable=True))
        if self.timestamp is not None:
            # _I64_MIN itself is NO_TIMESTAMP, the column's marker for "none".
            check_int("timestamp", self.timestamp, minimum=_I64_MIN + 1, maximum=_I64_MAX)
        if self.headers != ():
            object.__setattr__(self, "headers", _check_headers(self.headers))


# ---------------------------------------------------------------------------------------------
# Encoding


def _width(max_size: int) -> int:
    """Narrowest width code for sizes stored as ``length + 1`` (0: every entry is null)."""
    if max_size == 0:
        return 0
    if max_size <= 0xFF:
        return 1
    if max_size <= 0xFFFF:
        return 2
    if max_size <= _U32_MAX:
        return 4
    raise InvalidArgumentError(f"a key, value or header of {max_size - 1} bytes is too large")


def _sizes(items: Sequence[bytes | None]) -> tuple[int, bytes, bytes]:
    """(width, size column, concatenated bytes) of a nullable bytes column."""
    sizes = [0 if b is None else len(b) + 1 for b in items]
    width = _width(max(sizes, default=0))
    if width == 0:
        return 0, b"", b""
    column = np.array(sizes, dtype=_WIDTHS[width]).tobytes()
    return width, column, b"".join([b for b in items if b])


def encode_records(
    records: Sequence[Record], *, compression: str = "none", zstd_level: int = 3
) -> bytes:
    """Pack `records` (at least one) into one records payload (see ``docs/records.md``).

    With ``compression="zstd"`` the body is stored zstd-compressed when that makes it
    smaller. The payload does not carry offsets: they come from the batch.
    """
    check_choice("compression", compression, _COMPRESSIONS)
    check_zstd_level("zstd_level", zstd_level)
    if isinstance(records, Record) or not isinstance(records, Sequence):
        raise InvalidArgumentError("records must be a sequence of Record")
    n = len(records)
    if not 1 <= n <= MAX_BATCH_COUNT:
        raise InvalidArgumentError(f"records must hold 1 to {MAX_BATCH_COUNT} records, got {n}")
    for i, r in enumerate(records):
        if not isinstance(r, Record):
            raise InvalidArgumentError(f"records[{i}] must be a Record, not {type(r).__name__}")

    stamps = [r.timestamp for r in records]
    given = [t for t in stamps if t is not None]
    ts_base = 0
    if not given:
        ts_mode, ts_column = _TS_NONE, b""
    elif len(given) == n and max(given) - min(given) <= _U32_MAX:
        ts_mode, ts_base = _TS_DELTA32, min(given)
        ts_column = (np.array(given, dtype=np.int64) - ts_base).astype("<u4").tobytes()
    else:
        ts_mode = _TS_ABS64
        ts_column = np.array(
            [NO_TIMESTAMP if t is None else t for t in stamps], dtype="<i8"
        ).tobytes()

    key_w, key_sizes, key_data = _sizes([r.key for r in records])
    value_w, value_sizes, value_data = _sizes([r.value for r in records])
    counts = [len(r.headers) for r in records]
    if any(counts):
        count_w = _width(max(counts) + 1)
        count_column = (np.array(counts, dtype=np.int64) + 1).astype(_WIDTHS[count_w]).tobytes()
        flat = [h for r in records for h in r.headers]
        hkey_w, hkey_sizes, hkey_data = _sizes([name.encode("utf-8") for name, _ in flat])
        hval_w, hval_sizes, hval_data = _sizes([value for _, value in flat])
    else:
        count_w = hkey_w = hval_w = 0
        count_column = hkey_sizes = hkey_data = hval_sizes = hval_data = b""

    body = b"".join(
        (
            ts_column,
            key_sizes,
            value_sizes,
            count_column,
            hkey_sizes,
            hval_sizes,
            key_data,
            value_data,
            hkey_data,
            hval_data,
        )
    )
    if len(body) > _U32_MAX:
        raise InvalidArgumentError(f"records of {len(body)} bytes do not fit in one batch")
    flags = 0
    stored = body
    if compression == "zstd":
        packed = zstandard.ZstdCompressor(level=zstd_level).compress(body)
        if len(packed) < len(body):
            flags, stored = _FLAG_ZSTD, packed
    header = RECORDS_HEADER.pack(
        RECORDS_FORMAT_VERSION,
        flags,
        ts_mode,
        key_w,
        value_w,
        count_w,
        hkey_w,
        hval_w,
        n,
        len(body),
        ts_base,
    )
    return header + stored


def records_batch(
    records: Sequence[Record], *, compression: str = "none", zstd_level: int = 3
) -> RecordBatch:
    """A `RecordBatch` of kind RECORDS holding `records`, ready for `Stream.append`.

    Its base timestamp is the largest record timestamp when every record has one (so the
    block index can find records by time); otherwise None, so that the client stamps the
    batch at append time and records without a timestamp take that time.
    """
    payload = encode_records(records, compression=compression, zstd_level=zstd_level)
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    base = max(stamps) if len(stamps) == len(records) else None
    return RecordBatch(
        payload,
        count=len(records),
        base_timestamp=base,
        kind=BatchKind.RECORDS,
        _verified=(payload, len(records)),
    )


# ---------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True, slots=True, eq=False)
class RecordColumns:
    """The decoded, validated columns of one records payload (numpy arrays, read-only views).

    Lengths are int64 with -1 for null. Data columns hold the non-null entries back to back
    in record order; offsets into them are the cumulative sums of the lengths. Header columns
    are flattened over all records: record *i* owns ``header_counts[i]`` consecutive headers.
    `timestamps` holds `NO_TIMESTAMP` where a record has none.
    """

    count: int
    timestamps: npt.NDArray[np.int64]
    key_lengths: npt.NDArray[np.int64]
    key_data: memoryview
    value_lengths: npt.NDArray[np.int64]
    value_data: memoryview
    header_counts: npt.NDArray[np.int64]
    header_key_lengths: npt.NDArray[np.int64]
    header_key_data: memoryview
    header_value_lengths: npt.NDArray[np.int64]
    header_value_data: memoryview
    #: Whether any record has headers (False: `header_counts` is all zeros).
    has_headers: bool

    def resolve_timestamps(
        self, base_timestamp: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """(timestamp, timestampType) per record: own timestamps are CREATE_TIME, missing
        ones take `base_timestamp` (the batch's append time) as LOG_APPEND_TIME."""
        own = self.timestamps != NO_TIMESTAMP
        ts = np.where(own, self.timestamps, np.int64(base_timestamp))
        kinds = np.where(own, np.int32(CREATE_TIME), np.int32(LOG_APPEND_TIME)).astype(np.int32)
        return ts, kinds


class _Cursor:
    """Walks the body of a payload, validating that every column fits."""

    __slots__ = ("body", "location", "pos")

    def __init__(self, body: memoryview, location: str) -> None:
        self.body = body
        self.pos = 0
        self.location = location

    def take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if end > len(self.body):
            raise _corrupt(
                self.location,
                f"{what} needs {size} bytes at body byte {self.pos}, "
                f"but the body has {len(self.body)}",
            )
        view = self.body[self.pos : end]
        self.pos = end
        return view

    def sizes(self, width: int, n: int, what: str) -> npt.NDArray[np.int64]:
        """Lengths stored as ``length + 1`` (0 = null) in `width`-byte integers."""
        if width == 0 or n == 0:
            return np.full(n, -1, dtype=np.int64)
        raw = np.frombuffer(self.take(width * n, what), dtype=_WIDTHS[width])
        return np.subtract(raw, 1, dtype=np.int64)


def _corrupt(location: str, what: str) -> CorruptionError:
    return CorruptionError(f"corrupt records payload in {location}: {what}", location=location)


def _data(cur: _Cursor, lengths: npt.NDArray[np.int64], what: str) -> memoryview:
    # Nulls are -1 and add nothing: sum plus the number of nulls.
    total = int(lengths.sum()) + int(np.count_nonzero(lengths < 0)) if len(lengths) else 0
    return cur.take(total, what)


def decode_columns(
    payload: bytes | memoryview, *, expected_count: int | None = None, location: str = "?"
) -> RecordColumns:
    """Decode and validate a records payload into columns.

    `expected_count` is the batch's record count, checked against the payload's. Raises
    `CorruptionError` naming `location` when anything is inconsistent: version, flags,
    widths, lengths, a body that does not decompress or does not add up exactly.
    """
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise InvalidArgumentError(
            f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
        )
    if expected_count is not None:
        check_int("expected_count", expected_count, minimum=1, maximum=MAX_BATCH_COUNT)
    check_text("location", location)
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if len(view) < RECORDS_HEADER.size:
        raise _corrupt(
            location, f"{len(view)} bytes cannot hold the {RECORDS_HEADER.size}-byte header"
        )
    (version, flags, ts_mode, key_w, value_w, count_w, hkey_w, hval_w, n, body_len, ts_base) = (
        RECORDS_HEADER.unpack_from(view, 0)
    )
    if version != RECORDS_FORMAT_VERSION:
        raise _corrupt(location, f"unsupported records format version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise _corrupt(location, f"unknown flags {flags:#x}")
    if ts_mode not in _TS_MODES:
        raise _corrupt(location, f"unknown timestamp mode {ts_mode}")
    for name, w in (
        ("key", key_w),
        ("value", value_w),
        ("header count", count_w),
        ("header key", hkey_w),
        ("header value", hval_w),
    ):
        if w != 0 and w not in _WIDTHS:
            raise _corrupt(location, f"invalid {name} size width {w}")
    if n < 1 or (expected_count is not None and n != expected_count):
        raise _corrupt(location, f"holds {n} records, the batch says {expected_count}")
    if count_w == 0 and (hkey_w or hval_w):
        raise _corrupt(location, "header columns without header counts")

    stored = view[RECORDS_HEADER.size :]
    body: memoryview
    if flags & _FLAG_ZSTD:
        try:
            body = memoryview(
                zstandard.ZstdDecompressor().decompress(stored, max_output_size=body_len)
            )
        except zstandard.ZstdError as exc:
            raise _corrupt(location, f"body does not decompress: {exc}") from exc
        if len(body) != body_len:
            raise _corrupt(location, f"body decompresses to {len(body)} bytes, not {body_len}")
    else:
        if len(stored) != body_len:
            raise _corrupt(location, f"body has {len(stored)} bytes, header says {body_len}")
        body = stored

    cur = _Cursor(body, location)
    if ts_mode == _TS_NONE:
        timestamps = np.full(n, NO_TIMESTAMP, dtype=np.int64)
    elif ts_mode == _TS_DELTA32:
        deltas = np.frombuffer(cur.take(4 * n, "timestamps"), dtype="<u4").astype(np.int64)
        if ts_base + int(deltas.max()) > _I64_MAX:
            raise _corrupt(location, "timestamp overflows i64")
        timestamps = deltas + np.int64(ts_base)
    else:
        timestamps = np.frombuffer(cur.take(8 * n, "timestamps"), dtype="<i8").astype(np.int64)
    key_lengths = cur.sizes(key_w, n, "key sizes")
    value_lengths = cur.sizes(value_w, n, "value sizes")
    if count_w:
        header_counts = cur.sizes(count_w, n, "header counts")
        if (header_counts < 0).any():
            raise _corrupt(location, "null header count")
        total_headers = int(header_counts.sum())
    else:
        header_counts = np.zeros(n, dtype=np.int64)
        total_headers = 0
    header_key_lengths = cur.sizes(hkey_w, total_headers, "header key sizes")
    header_value_lengths = cur.sizes(hval_w, total_headers, "header value sizes")
    if total_headers and (header_key_lengths < 0).any():
        raise _corrupt(location, "null header key")
    key_data = _data(cur, key_lengths, "keys")
    value_data = _data(cur, value_lengths, "values")
    header_key_data = _data(cur, header_key_lengths, "header keys")
    header_value_data = _data(cur, header_value_lengths, "header values")
    if cur.pos != len(body):
        raise _corrupt(location, f"{len(body) - cur.pos} trailing bytes in the body")
    return RecordColumns(
        count=n,
        timestamps=timestamps,
        key_lengths=key_lengths,
        key_data=key_data,
        value_lengths=value_lengths,
        value_data=value_data,
        header_counts=header_counts,
        header_key_lengths=header_key_lengths,
        header_key_data=header_key_data,
        header_value_lengths=header_value_lengths,
        header_value_data=header_value_data,
        has_headers=total_headers > 0,
    )


def decode_timestamps(
    payload: bytes | memoryview,
    *,
    expected_count: int,
    location: str = "?",
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> npt.NDArray[np.int64] | None:
    """The timestamp column of a records payload (`NO_TIMESTAMP` where a record has none;
    None when no record has one), reading only the header and that column.

    For object writers and seek by time, which need every record's time but none of its
    bytes: a zstd body is decompressed only as far as the column (it comes first), and the
    other columns are not checked (`decode_columns` does that). Raises `CorruptionError` when
    the header or the column is unreadable, the same way for the same bytes. A caller
    decoding many payloads on one thread may pass its `decompressor` (making one costs more
    than reading a small column).
    """
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if len(view) < RECORDS_HEADER.size:
        raise _corrupt(
            location, f"{len(view)} bytes cannot hold the {RECORDS_HEADER.size}-byte header"
        )
    version, flags, ts_mode, *_widths, n, body_len, ts_base = RECORDS_HEADER.unpack_from(view, 0)
    if version != RECORDS_FORMAT_VERSION:
        raise _corrupt(location, f"unsupported records format version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise _corrupt(location, f"unknown flags {flags:#x}")
    if ts_mode not in _TS_MODES:
        raise _corrupt(location, f"unknown timestamp mode {ts_mode}")
    if n != expected_count:
        raise _corrupt(location, f"holds {n} records, the batch says {expected_count}")
    if ts_mode == _TS_NONE:
        return None
    width = 4 if ts_mode == _TS_DELTA32 else 8
    need = width * n
    stored = view[RECORDS_HEADER.size :]
    if need > body_len:
        raise _corrupt(location, f"timestamps need {need} bytes, the body has {body_len}")
    column: bytes | memoryview
    if flags & _FLAG_ZSTD:
        try:
            dctx = decompressor if decompressor is not None else zstandard.ZstdDecompressor()
            reader = dctx.stream_reader(stored)
            parts: list[bytes] = []
            got = 0
            while got < need:
                chunk = reader.read(need - got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        except zstandard.ZstdError as exc:
            raise _corrupt(location, f"body does not decompress: {exc}") from exc
        column = b"".join(parts)
        if len(column) < need:
            raise _corrupt(location, f"body decompresses to fewer than {need} bytes")
    else:
        if len(stored) != body_len:
            raise _corrupt(location, f"body has {len(stored)} bytes, header says {body_len}")
        column = stored[:need]
    if ts_mode == _TS_DELTA32:
        deltas = np.frombuffer(column, dtype="<u4").astype(np.int64)
        # Only a base within 2**32 of the top can overflow: the common case skips the max.
        if ts_base > _I64_MAX - _U32_MAX and ts_base + int(deltas.max()) > _I64_MAX:
            raise _corrupt(location, "timestamp overflows i64")
        return deltas + np.int64(ts_base)
    return np.frombuffer(column, dtype="<i8").astype(np.int64)


def _split(data: memoryview, lengths: npt.NDArray[np.int64]) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos = 0
    for length in lengths.tolist():
        if length < 0:
            out.append(None)
        else:
            out.append(bytes(data[pos : pos + length]))
            pos += length
    return out


def decode_records(
    payload: bytes | memoryview,
    *,
    base_timestamp: int | None = None,
    expected_count: int | None = None,
    location: str = "?",
) -> list[Record]:
    """Decode a records payload into `Record`s.

    With `base_timestamp` given (the batch's), records without a timestamp get it, as a
    Kafka consumer sees LogAppendTime; with None they keep ``timestamp=None``.
    """
    if base_timestamp is not None:
        check_int("base_timestamp", base_timestamp, minimum=_I64_MIN)
    cols = decode_columns(payload, expected_count=expected_count, location=location)
    keys = _split(cols.key_data, cols.key_lengths)
    values = _split(cols.value_data, cols.value_lengths)
    if base_timestamp is None:
        stamps: list[int | None] = [
            None if t == NO_TIMESTAMP else t for t in cols.timestamps.tolist()
        ]
    else:
        stamps = list(cols.resolve_timestamps(base_timestamp)[0].tolist())
    headers: list[tuple[Header, ...]] = [()] * cols.count
    if cols.has_headers:
        hkeys = _split(cols.header_key_data, cols.header_key_lengths)
        hvals = _split(cols.header_value_data, cols.header_value_lengths)
        try:
            names = [b.decode("utf-8") for b in hkeys if b is not None]
        except UnicodeDecodeError as exc:
            raise _corrupt(location, "header key is not UTF-8") from exc
        at = 0
        for i, c in enumerate(cols.header_counts.tolist()):
            if c:
                headers[i] = tuple(zip(names[at : at + c], hvals[at : at + c], strict=True))
                at += c
    return [Record(values[i], keys[i], stamps[i], headers[i]) for i in range(cols.count)]


def records_in(
    fetch: Callable[[int], FetchResult], start: int, end: int
) -> Iterator[tuple[int, Record]]:
    """``(offset, record)`` for the records in ``[start, end)``, from the pages `fetch(offset)`
    returns, fetched lazily (`Stream.read_records`, `StreamReader.read_records`)."""
    pos = start
    while pos < end:
        result = fetch(pos)
        if not result.batches:
            return
        for batch in result.batches:
            yield from batch_records(batch, start, end)
        pos = result.next_offset


def batch_records(
    batch: FetchedBatch, start_offset: int = 0, end_offset: int | None = None
) -> Iterator[tuple[int, Record]]:
    """``(offset, record)`` for the records of `batch` within ``[start_offset, end_offset)``.

    A RECORDS batch yields its records in that range (timestamps resolved against the batch's
    base timestamp). A RAW batch is opaque: it yields one ``Record(value=payload,
    timestamp=base_timestamp)`` at its base offset, and only when its base offset lies in the
    range (a raw batch belongs to the range holding its first offset, so consecutive ranges
    see it exactly once).
    """
    check_instance("batch", batch, FetchedBatch)
    start = check_int("start_offset", start_offset)
    end = batch.next_offset if end_offset is None else check_int("end_offset", end_offset)
    # A generator of its own, so that the checks above run at the call, not at first next().
    return _batch_records(batch, start, end)


def _batch_records(
    batch: FetchedBatch, start_offset: int, end: int
) -> Iterator[tuple[int, Record]]:
    """`batch_records` after its checks."""
    if batch.kind is BatchKind.RAW:
        if start_offset <= batch.base_offset < end:
            yield batch.base_offset, Record(batch.payload, timestamp=batch.base_timestamp)
        return
    lo = max(start_offset - batch.base_offset, 0)
    hi = min(end - batch.base_offset, batch.count)
    if lo >= hi:
        return
    location = f"stream {batch.stream_id} batch at offset {batch.base_offset}"
    records = decode_records(
        batch.view,
        base_timestamp=batch.base_timestamp,
        expected_count=batch.count,
        location=location,
    )
    for i in range(lo, hi):
        yield batch.base_offset + i, records[i]
