"""Every path the library derives stays inside the store's root, for any directory name.

A local store's default file WAL lives in ``<root>/wal/<node_id>.wal``; its URL is built from
the path, so a directory name with ``%``, ``?``, ``#``, newlines or tabs must not change which
file that URL names (``inner/%2e%2e%2fESCAPED`` once put the WAL in ``inner/../ESCAPED``, and
``st%41`` and ``stA`` shared one WAL).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import s3stream
from s3stream import RecordBatch

#: Pieces of directory names: the characters URLs and shells treat specially, escapes that
#: decode to ``.``, ``/`` and ``A``, unicode, and plain letters.
_PIECES = [
    "a", "Z", "0", "%", "%2e", "%2f", "%2E%2E%2F", "%41", "..", ".", "-", "_", " ", "\t",
    "\n", "?", "#", "&", "=", "+", ";", "~", "ü", "€", "\\", ":", "@", "'", '"',
]
names = (
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6)
    .map("".join)
    .filter(lambda n: n not in (".", ".."))
)


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@settings(max_examples=30, deadline=None)
@given(name=names)
def test_every_file_stays_inside_the_store_root(
    tmp_path_factory: object, name: str
) -> None:
    import pytest

    assert isinstance(tmp_path_factory, pytest.TempPathFactory)
    root = tmp_path_factory.mktemp("root")
    store = root / name
    with s3stream.open(store) as client:
        stream = client.create_stream()
        stream.append(RecordBatch(b"acknowledged"))
    outside = [p for p in _files_under(root) if store.resolve() not in p.resolve().parents]
    assert not outside, f"files outside {store!r}: {outside}"
    assert (store / "wal" / "local.wal").is_file()
    with s3stream.open(store) as again:
        assert [b.payload for b in again.read(stream.stream_id, 0).batches] == [b"acknowledged"]


def test_stores_whose_names_decode_alike_never_share_a_wal(tmp_path: Path) -> None:
    """``st%41`` and ``stA`` are two stores with two WALs: a crash of one leaves its
    acknowledged appends for its own next open, untouched by the other's recovery."""
    escaped, plain = tmp_path / "st%41", tmp_path / "stA"
    crashed = s3stream.open(escaped)
    stream = crashed.create_stream()
    for i in range(100):
        stream.append(RecordBatch(f"escaped {i}".encode()))
    crashed.abandon()  # the 100 are in its WAL only
    with s3stream.open(plain) as other:
        other.create_stream().append(RecordBatch(b"plain"))
    with s3stream.open(escaped) as again:
        got = [b.payload for b in again.read(stream.stream_id, 0, max_bytes=1 << 20).batches]
        assert got == [f"escaped {i}".encode() for i in range(100)]
    assert (escaped / "wal" / "local.wal").is_file() and (plain / "wal" / "local.wal").is_file()


def test_namespaces_in_one_store_are_isolated(tmp_path: Path) -> None:
    """Two metadata prefixes on one store: data keys live under each namespace, each reads
    only its own bytes, and one namespace's orphan sweep never deletes the other's objects."""
    from s3stream import ClientSettings, CompactionSettings, ManualClock, StreamClient
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.settings import MIN_ORPHAN_GRACE_MS
    from s3stream.wal.memory import MemoryWal

    clock = ManualClock()
    settings = ClientSettings(compaction=CompactionSettings(orphan_grace_ms=MIN_ORPHAN_GRACE_MS))

    def client(prefix: str) -> StreamClient:
        return StreamClient(LocalObjectStore(tmp_path), MemoryWal(), clock=clock,
                            settings=settings, metadata_prefix=prefix)

    payloads = {"meta": b"tenant A", "tenantB/meta": b"tenant B"}
    for prefix, payload in payloads.items():
        with client(prefix) as c:  # same node id, same epoch, same stream id in both
            c.create_stream().append(RecordBatch(payload))
    keys = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.s3o"))
    assert len(keys) == 2 and keys[0].startswith("data/local/")
    assert keys[1].startswith("tenantB/meta/data/local/")
    for prefix, payload in payloads.items():
        with client(prefix) as c:
            assert [b.payload for b in c.read(0, 0).batches] == [payload]
            c.compact(sweep_orphans=True)
            clock.advance(MIN_ORPHAN_GRACE_MS / 1000 + 1)
            assert c.compact(sweep_orphans=True).orphans_deleted == 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.s3o")) == keys
