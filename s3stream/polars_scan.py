"""A lazy Polars scan of a `StreamReader` that reads only what a query's filter keeps
(extra ``polars``; docs/arrow.md).

`scan(reader)` is a `polars.LazyFrame` over every stream the reader sees, with the columns of
`StreamReader.read_arrow` (without ``headers``). Polars hands the source the query's filter
(``polars.io.plugins.register_io_source``); `pruning` reads from it what no other row can
match, and the source asks `read_arrow` for only that, which reads only the objects holding
it:

- ``stream_id``: ``==`` and ``is_in``; ``topic`` (the ``topic`` tag): ``==`` and ``is_in``
  with strings: which streams are read (from the metadata: no data is read to decide);
- ``offset``: ``==``, ``<``, ``<=``, ``>``, ``>=``, ``is_between``: the offsets read;
- ``timestamp``: the same comparisons with a time-zone-aware datetime (a ``datetime`` with a
  ``tzinfo``, or a literal of Polars type ``Datetime("ms"|"us", tz)``): a lower bound moves
  each stream's start up to its first offset at or past it (`read_arrow`'s
  ``start_timestamp``); an upper bound stops each stream after its last object holding a
  timestamp at or below it (the metadata's per-object smallest timestamp). Both are safe when
  timestamps do not grow with offsets.

Conditions combine with ``&`` (each narrows) and ``|`` (the union of what each side reads).
Anything else (other columns, ``!=``, ``~``, integers compared with ``timestamp``, which
Polars compares as microseconds, casts of the column...) prunes nothing. Polars' serialized
form of an expression is not a stable interface: on any surprise in it the scan prunes
nothing, and the source always applies the whole predicate to the rows it read, so results
are right whatever was pruned. Each ``collect`` reads what is committed at that time.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

try:
    import polars as pl
    from polars.io.plugins import register_io_source
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] != "polars":
        raise
    raise ModuleNotFoundError(
        "The Polars scan (s3stream.polars_scan) needs polars: pip install 's3stream[polars]'",
        name="polars",
    ) from exc

import pyarrow as pa

from .arrow import arrow_schema, stream_labels
from .errors import StreamNotFoundError
from .metadata import MetadataState, StreamMeta
from .reader import StreamReader
from .validation import check_instance, check_int

__all__ = ["Pruning", "pruning", "scan"]

#: `read_arrow` attempts when a stream chosen from one snapshot is deleted before the next.
_ATTEMPTS = 3
#: Microseconds of the units a timestamp literal may have (others prune nothing).
_MICROS = {"ms": 1000, "us": 1}
#: A comparison with its sides swapped (``5 > offset`` is ``offset < 5``).
_FLIPPED = {"Eq": "Eq", "Lt": "Gt", "LtEq": "GtEq", "Gt": "Lt", "GtEq": "LtEq"}


@dataclass(frozen=True, slots=True)
class Pruning:
    """What a predicate leaves to read: no row outside these bounds can match it.

    None means no bound. Bounds are inclusive: offsets ``min_offset..max_offset``, timestamps
    (ms since the epoch) ``min_timestamp..max_timestamp``. `stream_ids` and `topics` (values
    of the ``topic`` column) limit the streams read.
    """

    stream_ids: frozenset[int] | None = None
    topics: frozenset[str] | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None

    @property
    def empty(self) -> bool:
        """Whether the bounds contradict each other: no row can match."""
        return (
            self.stream_ids == frozenset()
            or self.topics == frozenset()
            or _below(self.max_offset, self.min_offset)
            or _below(self.max_timestamp, self.min_timestamp)
        )


#: Reads everything.
_ALL = Pruning()


def _below(hi: int | None, lo: int | None) -> bool:
    return hi is not None and lo is not None and hi < lo


def _tighter(a: int | None, b: int | None, pick: Any) -> int | None:
    return b if a is None else a if b is None else pick(a, b)


def _looser(a: int | None, b: int | None, pick: Any) -> int | None:
    return None if a is None or b is None else pick(a, b)


def _both(a: Pruning, b: Pruning) -> Pruning:
    """Rows that can match ``a & b``."""

    def common(x: frozenset[Any] | None, y: frozenset[Any] | None) -> frozenset[Any] | None:
        return y if x is None else x if y is None else x & y

    return Pruning(
        common(a.stream_ids, b.stream_ids),
        common(a.topics, b.topics),
        _tighter(a.min_offset, b.min_offset, max),
        _tighter(a.max_offset, b.max_offset, min),
        _tighter(a.min_timestamp, b.min_timestamp, max),
        _tighter(a.max_timestamp, b.max_timestamp, min),
    )


def _either(a: Pruning, b: Pruning) -> Pruning:
    """Rows that can match ``a | b``."""
    if a.empty:
        return b
    if b.empty:
        return a

    def union(x: frozenset[Any] | None, y: frozenset[Any] | None) -> frozenset[Any] | None:
        return None if x is None or y is None else x | y

    return Pruning(
        union(a.stream_ids, b.stream_ids),
        union(a.topics, b.topics),
        _looser(a.min_offset, b.min_offset, min),
        _looser(a.max_offset, b.max_offset, max),
        _looser(a.min_timestamp, b.min_timestamp, min),
        _looser(a.max_timestamp, b.max_timestamp, max),
    )


def pruning(predicate: pl.Expr | None) -> Pruning:
    """What `predicate` (a filter on `scan`'s columns) leaves to read; see the module
    docstring for what it understands. Never raises: what it cannot read prunes nothing."""
    if predicate is None:
        return _ALL
    try:
        tree = json.loads(predicate.meta.serialize(format="json"))
        return _prune(tree)
    except Exception:  # the serialized form surprised us: read everything
        return _ALL


def _prune(node: object) -> Pruning:
    """What the serialized expression `node` leaves to read; no pruning on any surprise."""
    try:
        return _walk(node)
    except Exception:
        return _ALL


def _walk(node: object) -> Pruning:
    if not isinstance(node, dict) or len(node) != 1:
        return _ALL
    if "BinaryExpr" in node:
        expr = node["BinaryExpr"]
        op = expr.get("op") if isinstance(expr, dict) else None
        if op in ("And", "LogicalAnd"):
            return _both(_prune(expr["left"]), _prune(expr["right"]))
        if op in ("Or", "LogicalOr"):
            return _either(_prune(expr["left"]), _prune(expr["right"]))
        if op in _FLIPPED:
            return _guarded(_comparison, expr["left"], op, expr["right"])
        return _ALL
    if "Function" in node:
        return _guarded(_function, node["Function"])
    return _ALL


def _guarded(fn: Any, *args: Any) -> Pruning:
    """`fn(*args)`, or no pruning if it meets a shape it does not know."""
    try:
        result = fn(*args)
    except Exception:
        return _ALL
    return result if isinstance(result, Pruning) else _ALL


def _column(node: object) -> str | None:
    if isinstance(node, dict) and len(node) == 1 and isinstance(node.get("Column"), str):
        name: str = node["Column"]
        return name
    return None


def _comparison(left: object, op: str, right: object) -> Pruning:
    column, value = _column(left), right
    if column is None:  # 5 > offset
        column, op, value = _column(right), _FLIPPED[op], left
    if column in ("stream_id", "topic"):
        if op != "Eq":
            return _ALL
        values = _values(value, pl.String if column == "topic" else None, single=True)
        if values is None:
            return _ALL
        if column == "topic":
            return Pruning(topics=values)
        return Pruning(stream_ids=values)
    if column == "offset":
        n = _integer(value)
        if n is None:
            return _ALL
        lo = {"Eq": n, "GtEq": n, "Gt": n + 1}.get(op)
        hi = {"Eq": n, "LtEq": n, "Lt": n - 1}.get(op)
        return Pruning(min_offset=lo, max_offset=hi)
    if column == "timestamp":
        us = _micros(value)
        if us is None:
            return _ALL
        # Rows hold whole milliseconds: the column's microseconds are ts * 1000.
        ceil, floor = -(-us // 1000), us // 1000
        lo = {"Eq": ceil, "GtEq": ceil, "Gt": floor + 1}.get(op)
        hi = {"Eq": floor, "LtEq": floor, "Lt": ceil - 1}.get(op)
        return Pruning(min_timestamp=lo, max_timestamp=hi)
    return _ALL


def _function(fn: dict[str, Any]) -> Pruning:
    inputs, kind = fn["input"], fn["function"]
    boolean = kind.get("Boolean") if isinstance(kind, dict) else None
    if not isinstance(boolean, dict) or not isinstance(inputs, list):
        return _ALL
    column = _column(inputs[0]) if inputs else None
    if "IsIn" in boolean and len(inputs) == 2 and column in ("stream_id", "topic"):
        values = _values(inputs[1], pl.String if column == "topic" else None, single=False)
        if values is None:
            return _ALL
        return Pruning(topics=values) if column == "topic" else Pruning(stream_ids=values)
    if "IsBetween" in boolean and len(inputs) == 3 and column is not None:
        closed = boolean["IsBetween"].get("closed")
        if closed not in ("Both", "Left", "Right", "None"):
            return _ALL
        lo_op = "GtEq" if closed in ("Both", "Left") else "Gt"
        hi_op = "LtEq" if closed in ("Both", "Right") else "Lt"
        return _both(
            _guarded(_comparison, inputs[0], lo_op, inputs[1]),
            _guarded(_comparison, inputs[0], hi_op, inputs[2]),
        )
    return _ALL


def _is_literal(node: object) -> bool:
    """A literal, possibly cast or aliased: what Polars leaves of a constant."""
    if not isinstance(node, dict) or len(node) != 1:
        return False
    if "Literal" in node:
        return True
    if "Cast" in node:
        cast = node["Cast"]
        return isinstance(cast, dict) and _is_literal(cast.get("expr"))
    if "Alias" in node:
        alias = node["Alias"]
        return isinstance(alias, list) and bool(alias) and _is_literal(alias[0])
    return False


def _constant(node: object) -> pl.Series | None:
    """The value of a literal node, as Polars computes it (a Series), or None."""
    if not _is_literal(node):
        return None
    expr = pl.Expr.deserialize(io.StringIO(json.dumps(node)), format="json")
    if expr.meta.root_names():
        return None
    return pl.select(expr).to_series()


def _integer(node: object) -> int | None:
    s = _constant(node)
    if s is None or s.len() != 1 or not s.dtype.is_integer():
        return None
    value = s.item()
    return value if type(value) is int else None


def _values(node: object, dtype: Any, *, single: bool) -> frozenset[Any] | None:
    """The values a literal holds (a list's items too): integers, or strings if `dtype` is
    ``pl.String``; None if it holds anything else, or a null."""
    s = _constant(node)
    if s is None or (single and s.len() != 1):
        return None
    if isinstance(s.dtype, pl.List | pl.Array):
        s = s.explode()
    if s.null_count():
        return None  # is_in(..., nulls_equal=True) would match null rows
    if dtype is pl.String:
        if s.dtype != pl.String:
            return None
    elif not s.dtype.is_integer():
        return None
    values = s.to_list()
    if not all(type(v) is (str if dtype is pl.String else int) for v in values):
        return None
    return frozenset(values)


def _micros(node: object) -> int | None:
    """Microseconds since the epoch of a time-zone-aware datetime literal in ms or us."""
    s = _constant(node)
    if s is None or s.len() != 1 or not isinstance(s.dtype, pl.Datetime):
        return None
    unit, tz = s.dtype.time_unit, s.dtype.time_zone
    if tz is None or unit not in _MICROS:
        return None  # Polars refuses naive ones against a UTC column; ns may round
    value = s.cast(pl.Int64).item()
    return value * _MICROS[unit] if type(value) is int else None


#: The largest end offset a stream can have (an int64, as the metadata stores it).
_OFFSET_END_LIMIT = (1 << 63) - 1


def _time_end(state: MetadataState, m: StreamMeta, max_ts: int) -> int:
    """An end for stream `m` past which no offset has a timestamp <= `max_ts`: the end of
    its last object whose smallest timestamp is at most that (or unknown)."""
    end = m.start_offset
    covered = m.start_offset
    for obj in state.objects_for(m.stream_id, m.start_offset):
        r = obj.range_of(m.stream_id)
        if r is None:
            return m.end_offset
        covered = max(covered, r.end_offset)
        if r.min_timestamp is None or r.min_timestamp <= max_ts:
            end = max(end, r.end_offset)
    return m.end_offset if covered < m.end_offset else end


def _read(reader: StreamReader, p: Pruning, batch_rows: int) -> pa.RecordBatchReader | None:
    """`read_arrow` of what `p` leaves, or None if nothing."""
    if p.empty or (p.min_offset is not None and p.min_offset >= _OFFSET_END_LIMIT):
        return None  # no record's offset is that large (ends are at most 2**63 - 1)
    start = None if p.min_offset is None else max(0, p.min_offset)
    end = None if p.max_offset is None else min(max(0, p.max_offset + 1), _OFFSET_END_LIMIT)
    for attempt in range(_ATTEMPTS):
        state = reader.snapshot()
        streams = [
            m
            for m in state.list_streams()
            if (p.stream_ids is None or m.stream_id in p.stream_ids)
            and (p.topics is None or stream_labels(m.tags, "topic", "partition")[0] in p.topics)
        ]
        ends: int | Mapping[int, int] | None = end
        if p.max_timestamp is not None:
            ends = {
                m.stream_id: min(
                    _time_end(state, m, p.max_timestamp), m.end_offset if end is None else end
                )
                for m in streams
            }
        whole = p.stream_ids is None and p.topics is None and p.max_timestamp is None
        try:
            return reader.read_arrow(
                stream_ids=None if whole else [m.stream_id for m in streams],
                start=start,
                end=ends,
                start_timestamp=p.min_timestamp,
                batch_rows=batch_rows,
            )
        except StreamNotFoundError:  # deleted since the snapshot above
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def scan(reader: StreamReader, *, batch_rows: int = 65536) -> pl.LazyFrame:
    """Every stream `reader` sees as a `polars.LazyFrame` with `StreamReader.read_arrow`'s
    columns (no ``headers``), reading only what a query's filter can keep (module docstring).

    Each ``collect`` reads what is committed then, through `reader` (which must stay open).
    Frames hold at most about `batch_rows` rows, fewer if Polars asks for smaller batches.
    """
    check_instance("reader", reader, StreamReader)
    check_int("batch_rows", batch_rows, minimum=1)
    empty = pl.from_arrow(arrow_schema(False).empty_table())
    assert isinstance(empty, pl.DataFrame)
    schema = empty.schema

    def source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        if n_rows is not None and n_rows <= 0:
            return
        rows = batch_rows if batch_size is None else max(1, min(batch_rows, batch_size))
        batches = _read(reader, pruning(predicate), rows)
        if batches is None:
            return
        left = n_rows
        for batch in batches:
            frame = pl.from_arrow(batch)
            assert isinstance(frame, pl.DataFrame)
            if predicate is not None:
                frame = frame.filter(predicate)
            if with_columns is not None:
                frame = frame.select(with_columns)
            if left is not None:
                frame = frame.head(left)
                left -= frame.height
            if frame.height:
                yield frame
            if left == 0:
                return

    return register_io_source(source, schema=schema)
