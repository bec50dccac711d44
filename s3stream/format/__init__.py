"""Byte formats: what s3stream writes to the WAL and to object storage.

Roles:

- `batch` — batch records, the unit of storage: a 40-byte header, msgpack properties and the
  payload; and WAL records, a batch record behind a version + stream epoch prefix.
- `objects` — object files: data blocks of one stream's batch records, a sorted block index and
  a fixed footer; `ObjectWriter` builds them, `read_index` reads and validates their index.
- `block` — one data block: its index entry (`BlockInfo`) and the checks and decoding of its
  stored bytes (`decode_block`).
- `block_reader` — ranged GETs of data blocks, the only ones in the library: `coalesce` (which
  blocks one GET fetches), `BlockReader` (GET, length check, decode) and `read_blocks`.

The framing of records inside a file WAL (magic, length, position, crc) belongs to the file-WAL
module (`s3stream.wal.file`). The byte layouts are specified in ``docs/format.md``.
"""

from .batch import (
    BATCH_HEADER,
    WAL_PREFIX,
    decode_batch_at,
    decode_batches,
    decode_wal_record,
    encode_batch,
    encode_wal_record,
)
from .block import BlockInfo, decode_block
from .block_reader import BlockReader, coalesce, read_blocks
from .objects import (
    DEFAULT_TAIL_READ_BYTES,
    FOOTER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    MAGIC,
    ObjectIndex,
    ObjectWriter,
    parse_tail,
    read_index,
)

__all__ = [
    "BATCH_HEADER",
    "DEFAULT_TAIL_READ_BYTES",
    "FOOTER_SIZE",
    "FORMAT_VERSION",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "WAL_PREFIX",
    "BlockInfo",
    "BlockReader",
    "ObjectIndex",
    "ObjectWriter",
    "coalesce",
    "decode_batch_at",
    "decode_batches",
    "decode_block",
    "decode_wal_record",
    "encode_batch",
    "encode_wal_record",
    "parse_tail",
    "read_blocks",
    "read_index",
]
