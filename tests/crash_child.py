"""Child process of tests/test_crash.py: append forever through the file WAL, report acks.

Prints one line per acknowledged batch, ``A <stream_id> <base_offset> <count> <sha256>``, and
``U+``/``U-`` when an upload starts/commits, flushing each line, until it is killed.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections import deque
from concurrent.futures import Future

import s3stream
from s3stream import ClientSettings, RecordBatch

root, seed = sys.argv[1], int(sys.argv[2])
out = sys.stdout


class UploadMarks(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("upload start"):
            out.write("U+\n")
        elif msg.startswith("upload committed"):
            out.write("U-\n")
        out.flush()


logging.getLogger("s3stream.storage").addHandler(UploadMarks())
logging.getLogger("s3stream.storage").setLevel(logging.DEBUG)

settings = ClientSettings(
    upload_threshold_bytes=256 * 1024, stream_split_bytes=128 * 1024, upload_interval_ms=200
)
client = s3stream.open(
    root, settings=settings, file_wal_settings=s3stream.FileWalSettings(capacity_bytes=8 << 20)
)
infos = client.list_streams()
streams = [client.open_stream(i.stream_id) for i in infos] or [
    client.create_stream(tags={"p": str(i)}) for i in range(3)
]
window: deque[tuple[Future[s3stream.AppendResult], str]] = deque()
n = 0
while True:
    s = streams[n % len(streams)]
    payload = hashlib.sha256(f"{seed}:{n}".encode()).digest() * (1 + (n * 7) % 200)
    fut = s.append_async(RecordBatch(payload, count=1 + n % 4))
    window.append((fut, hashlib.sha256(payload).hexdigest()))
    n += 1
    while window and (len(window) > 64 or window[0][0].done()):
        f, digest = window.popleft()
        r = f.result()
        out.write(f"A {r.stream_id} {r.base_offset} {r.count} {digest}\n")
        out.flush()
