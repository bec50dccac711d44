"""Child process of tests/test_write_path.py: a node that appends, then waits to be killed.

``owner_child.py URL NODE_ID N [STORAGE_OPTIONS_JSON]`` opens the store as node NODE_ID (its
default WAL), creates one stream, appends N batches and waits for every acknowledgement, with
uploads held back (huge threshold and interval) so that the data is only in the WAL. Prints
``ACKED <stream_id> <count> <sha256 of all payloads>``, then answers commands on stdin until
killed: ``APPEND`` appends one more batch and prints ``OK <offset>`` or ``ERR <error class>``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading

import s3stream
from s3stream import ClientSettings, RecordBatch

url, node_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
settings = ClientSettings(
    upload_threshold_bytes=256 << 20, max_pending_bytes=512 << 20, upload_interval_ms=0
)
client = s3stream.open(url, node_id=node_id, settings=settings, storage_options=options)
stream = client.create_stream(tags={"owner": node_id})
digest = hashlib.sha256()
futures = []
for i in range(n):
    data = f"{node_id}:{i}:".encode() * (1 + i % 7)
    digest.update(data)
    futures.append(stream.append_async(RecordBatch(data)))
for f in futures:
    f.result()
print(f"ACKED {stream.stream_id} {n} {digest.hexdigest()}", flush=True)
for command in sys.stdin:
    if command.strip() == "APPEND":
        try:
            offset = stream.append(RecordBatch(b"one more"), timeout_s=10).base_offset
            print(f"OK {offset}", flush=True)
        except s3stream.S3StreamError as exc:
            print(f"ERR {type(exc).__name__}", flush=True)
threading.Event().wait()
