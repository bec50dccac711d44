"""Child of tests/test_producer.py: an idempotent producer appending until it is killed.

argv: store root, node id. Creates one stream and appends one-record batches with
``producer_id="p"`` and sequences 0, 1, 2, ... (value = the sequence), printing
``A <sequence> <base_offset>`` after each acknowledgement, flushed at once.
"""

from __future__ import annotations

import sys

import s3stream
from s3stream import ClientSettings, RecordBatch

root, node_id = sys.argv[1], sys.argv[2]
settings = ClientSettings(upload_threshold_bytes=64 * 1024, upload_interval_ms=100)
client = s3stream.open(root, node_id=node_id, settings=settings)
stream = client.create_stream()
seq = 0
while True:
    r = stream.append(RecordBatch(b"%d" % seq), producer_id="p", sequence=seq)
    sys.stdout.write(f"A {seq} {r.base_offset}\n")
    sys.stdout.flush()
    seq += 1
