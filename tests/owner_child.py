"""Child process of tests/test_write_path.py: a node that appends, then waits to be killed.

``owner_child.py URL NODE_ID N [STORAGE_OPTIONS_JSON]`` opens the store as node NODE_ID (its
default WAL), creates one stream, appends N batches and waits for every acknowledgement, with
uploads held back (huge threshold and interval) so that the data is only in the WAL. Prints
``ACKED <stream_id> <count> <sha256 of all payloads>`` and then sleeps until killed.
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
threading.Event().wait()
