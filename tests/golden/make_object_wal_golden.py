"""Generate a golden object-WAL prefix (run by hand, never by the test suite).

    .venv/bin/python tests/golden/make_object_wal_golden.py

Writes ``object_wal_v<N>.json``, N being the WAL object header version the current
`ObjectWal` writes: every object a short history of node ``n1`` left under ``wal/n1/`` (two
sessions, a trim, a crash), in hex, and the records a later owner must recover from them.
`tests/test_object_wal.py` loads each committed file into a store and recovers it, so objects
written by every past version keep recovering. Like the object-format golden files
(`make_golden.py`), a committed file is never regenerated: a new header version gets a new
file next to the old ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.settings import ObjectWalSettings
from s3stream.wal import object as object_wal

HERE = Path(__file__).parent
SETTINGS = ObjectWalSettings(wal_batch_interval_ms=1, max_hedged_puts=0)


def history() -> dict[str, object]:
    store = MemoryObjectStore()

    def wal(epoch: int) -> object_wal.ObjectWal:
        return object_wal.ObjectWal(
            store, node_id="n1", node_epoch=epoch, prefix="wal", settings=SETTINGS
        )

    # Session 1: one record per object (each append waits), a trim, a clean close.
    first = wal(1)
    assert list(first.recover()) == []
    data = [b"session 1 record %d" % i for i in range(4)]
    positions = [first.append(d).result(5) for d in data]
    first.trim(positions[0])
    first.close()
    # Session 2 recovers session 1, appends, and crashes.
    second = wal(2)
    kept = [(r.position, r.data) for r in second.recover()]
    assert kept == list(zip(positions[1:], data[1:], strict=True))
    for d in [b"session 2 record %d" % i for i in range(3)]:
        kept.append((second.append(d).result(5), d))
    second._abandon()
    return {
        "version": object_wal._VERSION,
        "node_id": "n1",
        "prefix": "wal",
        "objects": [
            {"key": info.key, "hex": store.get(info.key).hex()} for info in store.list("wal/")
        ],
        "recovered": [{"position": p, "data_hex": d.hex()} for p, d in kept],
    }


def main() -> None:
    content = history()
    path = HERE / f"object_wal_v{content['version']}.json"
    if path.exists():
        raise SystemExit(f"{path} exists: golden files are never regenerated")
    path.write_text(json.dumps(content, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
