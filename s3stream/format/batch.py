"""Batch records: how one appended batch is laid out in WAL records and in object blocks.

Little-endian, 40-byte header, then the properties (msgpack map of str to str, absent when
empty), then the payload::

    0   u64  stream_id
    8   i64  base_offset
    16  u32  count
    20  u8   kind          (BatchKind: 0 raw, 1 records)
    21  u8   flags         (reserved, 0)
    22  u16  reserved      (0)
    24  i64  base_timestamp (ms)
    32  u32  properties_len
    36  u32  payload_len

A WAL record is a 9-byte prefix (u8 version, u64 stream epoch) followed by one batch record,
so recovery knows which epoch wrote it and can drop what a newer owner fenced off.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import msgspec

from ..errors import CorruptionError
from ..types import BatchKind, FetchedBatch

__all__ = [
    "BATCH_HEADER",
    "WAL_PREFIX",
    "decode_batch_at",
    "decode_batches",
    "decode_wal_record",
    "encode_batch",
    "encode_batch_head",
    "encode_wal_record",
]

BATCH_HEADER = struct.Struct("<QqIBBHqII")
WAL_PREFIX = struct.Struct("<BQ")
WAL_RECORD_VERSION = 1
_EMPTY: Mapping[str, str] = MappingProxyType({})
_props_encoder = msgspec.msgpack.Encoder()
_props_decoder = msgspec.msgpack.Decoder(dict[str, str])
_KINDS = {int(k): k for k in BatchKind}


def encode_batch(
    stream_id: int,
    base_offset: int,
    count: int,
    kind: int,
    base_timestamp: int,
    properties: Mapping[str, str],
    payload: bytes | memoryview,
    *,
    prefix: bytes = b"",
) -> bytes:
    """Encode one batch record, optionally behind `prefix` (the WAL record prefix)."""
    return _encode(
        stream_id, base_offset, count, kind, base_timestamp, properties, len(payload),
        prefix, payload,
    )  # fmt: skip


def encode_batch_head(
    stream_id: int,
    base_offset: int,
    count: int,
    kind: int,
    base_timestamp: int,
    properties: Mapping[str, str],
    payload_len: int,
    *,
    prefix: bytes = b"",
) -> bytes:
    """What `encode_batch` puts before a payload of `payload_len` bytes: the record is this
    followed by the payload. For a large payload kept apart instead of copied behind it."""
    return _encode(
        stream_id, base_offset, count, kind, base_timestamp, properties, payload_len,
        prefix, b"",
    )  # fmt: skip


def _encode(
    stream_id: int,
    base_offset: int,
    count: int,
    kind: int,
    base_timestamp: int,
    properties: Mapping[str, str],
    payload_len: int,
    prefix: bytes,
    payload: bytes | memoryview,
) -> bytes:
    """`prefix`, the batch header and properties, then `payload` (empty for a head alone),
    joined once: a whole record is one copy of its payload, not a head and then a second
    concatenation."""
    props = _props_encoder.encode(dict(properties)) if properties else b""
    header = BATCH_HEADER.pack(
        stream_id, base_offset, count, kind, 0, 0, base_timestamp, len(props), payload_len
    )
    return b"".join((prefix, header, props, payload))


def decode_batch_at(
    buf: bytes | memoryview, pos: int, location: str = "?"
) -> tuple[FetchedBatch, int]:
    """Decode the batch record at `pos` of `buf`; returns it and the position after it."""
    end_header = pos + BATCH_HEADER.size
    if end_header > len(buf):
        raise CorruptionError(
            f"truncated batch header in {location} at {pos}", location=location, position=pos
        )
    (stream_id, base_offset, count, kind, _flags, _res, ts, props_len, payload_len) = (
        BATCH_HEADER.unpack_from(buf, pos)
    )
    end = end_header + props_len + payload_len
    if end > len(buf) or count < 1 or kind not in _KINDS or base_offset < 0:
        raise CorruptionError(
            f"invalid batch record in {location} at {pos}", location=location, position=pos
        )
    if props_len:
        try:
            props: Mapping[str, str] = MappingProxyType(
                _props_decoder.decode(buf[end_header : end_header + props_len])
            )
        except msgspec.DecodeError as exc:
            raise CorruptionError(
                f"invalid batch properties in {location} at {pos}", location=location, position=pos
            ) from exc
    else:
        props = _EMPTY
    # A slice of a memoryview is zero-copy: payloads read from objects share the GET buffer.
    payload = buf[end_header + props_len : end]
    return FetchedBatch(stream_id, base_offset, count, payload, ts, props, _KINDS[kind]), end


def decode_batches(buf: bytes | memoryview, location: str = "?") -> Iterator[FetchedBatch]:
    """Decode consecutive batch records filling all of `buf`."""
    pos = 0
    n = len(buf)
    while pos < n:
        batch, pos = decode_batch_at(buf, pos, location)
        yield batch


def encode_wal_record(epoch: int, batch_record: bytes) -> bytes:
    """Prefix an encoded batch record with the WAL record version and the stream epoch."""
    return WAL_PREFIX.pack(WAL_RECORD_VERSION, epoch) + batch_record


def decode_wal_record(data: bytes, location: str = "WAL") -> tuple[int, FetchedBatch, bytes]:
    """Split a WAL record into (epoch, batch, encoded batch record)."""
    if len(data) < WAL_PREFIX.size:
        raise CorruptionError(f"WAL record too short in {location}", location=location)
    version, epoch = WAL_PREFIX.unpack_from(data, 0)
    if version != WAL_RECORD_VERSION:
        raise CorruptionError(
            f"unknown WAL record version {version} in {location}", location=location
        )
    batch, end = decode_batch_at(data, WAL_PREFIX.size, location)
    if end != len(data):
        raise CorruptionError(f"trailing bytes in WAL record in {location}", location=location)
    return epoch, batch, data[WAL_PREFIX.size :]
