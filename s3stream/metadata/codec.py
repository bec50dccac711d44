"""Byte encoding of metadata records: a small checksummed frame around msgpack.

Frame (little-endian, 10 bytes, then the body)::

    0  4s   magic      b"S3ML" log entry, b"S3MC" checkpoint, b"S3MP" checkpoint pointer
    4  u16  version    FORMAT_VERSION of the body
    6  u32  crc32c     of the body
    10 ...  body       msgpack of the struct

Decoding checks all three before trusting the body, and names the object key in every
`CorruptionError`, so a bad record is reported where it lies, never misread.
"""

from __future__ import annotations

import struct
from typing import TypeVar

import crc32c
import msgspec

from ..errors import CorruptionError, InvalidArgumentError
from .model import FORMAT_VERSION, Checkpoint, CheckpointPointer, LogEntry

__all__ = [
    "decode_checkpoint",
    "decode_entry",
    "decode_pointer",
    "encode_checkpoint",
    "encode_entry",
    "encode_pointer",
    "validate_entry",
]

_FRAME = struct.Struct("<4sHI")
_ENTRY_MAGIC = b"S3ML"
_CHECKPOINT_MAGIC = b"S3MC"
_POINTER_MAGIC = b"S3MP"

_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(LogEntry)
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)
_pointer_decoder = msgspec.msgpack.Decoder(CheckpointPointer)

T = TypeVar("T")


def _frame(magic: bytes, body: bytes) -> bytes:
    return _FRAME.pack(magic, FORMAT_VERSION, crc32c.crc32c(body)) + body


def _unframe(magic: bytes, data: bytes, key: str) -> memoryview:
    if len(data) < _FRAME.size:
        raise CorruptionError(
            f"metadata object {key!r} is truncated ({len(data)} bytes)", location=key, position=0
        )
    found_magic, version, crc = _FRAME.unpack_from(data)
    if found_magic != magic:
        raise CorruptionError(
            f"metadata object {key!r} has magic {found_magic!r}, expected {magic!r}",
            location=key,
            position=0,
        )
    if version > FORMAT_VERSION:
        raise CorruptionError(
            f"metadata object {key!r} has format version {version}; this s3stream reads up to "
            f"{FORMAT_VERSION} (written by a newer release?)",
            location=key,
            position=4,
        )
    body = memoryview(data)[_FRAME.size :]
    if crc32c.crc32c(body) != crc:
        raise CorruptionError(
            f"metadata object {key!r} failed its crc32c check", location=key, position=_FRAME.size
        )
    return body


def _decode(decoder: msgspec.msgpack.Decoder[T], body: memoryview, key: str) -> T:
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # A string that is not UTF-8 raises the latter: damage all the same.
        raise CorruptionError(
            f"metadata object {key!r} does not decode: {exc}", location=key, position=_FRAME.size
        ) from exc


def encode_entry(entry: LogEntry) -> bytes:
    """The framed bytes of a log entry; `InvalidArgumentError` for a value the format cannot
    hold (a str that is not UTF-8, an int past 64 bits, an unknown type)."""
    try:
        body = _encoder.encode(entry)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
        # (UnicodeEncodeError is a ValueError.)
        raise InvalidArgumentError(f"invalid metadata op: {exc}") from exc
    return _frame(_ENTRY_MAGIC, body)


def validate_entry(payload: bytes) -> LogEntry:
    """Decode freshly encoded entry bytes, so that only what reads back is ever written.

    Ops built in code are not type-checked by msgspec at construction; this round trip is
    where a bad field (a negative offset, a str for an int) is caught: `InvalidArgumentError`.
    """
    try:
        return _entry_decoder.decode(memoryview(payload)[_FRAME.size :])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"invalid metadata op: {exc}") from exc


def decode_entry(data: bytes, key: str) -> LogEntry:
    """Parse and validate a log entry read from `key`; `CorruptionError` if it is bad."""
    return _decode(_entry_decoder, _unframe(_ENTRY_MAGIC, data, key), key)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The framed bytes of a checkpoint."""
    return _frame(_CHECKPOINT_MAGIC, _encoder.encode(checkpoint))


def decode_checkpoint(data: bytes, key: str) -> Checkpoint:
    """Parse and validate a checkpoint read from `key`; `CorruptionError` if it is bad."""
    return _decode(_checkpoint_decoder, _unframe(_CHECKPOINT_MAGIC, data, key), key)


def encode_pointer(seq: int) -> bytes:
    """The framed bytes of the checkpoint pointer."""
    return _frame(_POINTER_MAGIC, _encoder.encode(CheckpointPointer(seq)))


def decode_pointer(data: bytes, key: str) -> int:
    """The checkpoint seq held by the pointer read from `key`."""
    return _decode(_pointer_decoder, _unframe(_POINTER_MAGIC, data, key), key).seq
