"""Child of tests/test_tail.py: a writer process for a reader in another process to tail.

argv: url, count, storage options as JSON, optionally a file WAL path. Creates one stream,
prints its id, then appends `count` one-record batches (value = the decimal index), flushing
every 25 so that uploads commit as it goes, and closes.
"""

from __future__ import annotations

import json
import sys

import s3stream
from s3stream import ClientSettings, Record

url, count, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
wal = sys.argv[4] if len(sys.argv) > 4 else None
settings = ClientSettings(upload_interval_ms=0)
with s3stream.open(url, wal=wal, settings=settings, storage_options=options or None) as client:
    stream = client.create_stream()
    print(stream.stream_id, flush=True)
    for i in range(count):
        stream.append_records([Record(b"%d" % i)])
        if i % 25 == 24:
            client.flush()
