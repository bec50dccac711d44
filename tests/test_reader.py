"""`StreamReader` / `open_reader` and the read-only CLI tools never write to the store.

Real read-only media: a directory bind-mounted read-only (root only; skipped with the reason
elsewhere). As root, permission bits do not stop writes, so the mount is what proves it; the
file listing is also compared before and after on a writable directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    CompactionSettings,
    InvalidArgumentError,
    Record,
    RecordBatch,
)
from s3stream.cli import main as cli_main
from s3stream.reader import open_reader_store
from s3stream.testing import disk_faults


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )


def _make_store(root: Path) -> dict[int, list[bytes]]:
    settings = ClientSettings(
        upload_threshold_bytes=4096,
        compaction=CompactionSettings(stream_set_object_target_bytes=1 << 20),
    )
    model: dict[int, list[bytes]] = {}
    with s3stream.open(root, settings=settings) as client:
        for _ in range(3):
            s = client.create_stream({"topic": "t"})
            model[s.stream_id] = []
            for i in range(30):
                payload = f"{s.stream_id}:{i}".encode() * 40
                s.append(RecordBatch(payload))
                model[s.stream_id].append(payload)
                if i % 10 == 9:
                    client.flush()
        records = client.create_stream()
        records.append_records([Record(b"v1", key=b"k1"), Record(b"v2")])
        client.compact()  # replaces the small objects: some now await deletion
    return model


def _read_all(reader: s3stream.StreamReader, stream_id: int) -> list[bytes]:
    info = reader.stream_info(stream_id)
    out: list[bytes] = []
    pos = info.start_offset
    while pos < info.end_offset:
        res = reader.read(stream_id, pos)
        out += [b.payload for b in res.batches]
        pos = res.next_offset
    return out


def test_a_reader_reads_a_store_on_a_read_only_mount(tmp_path: Path) -> None:
    model = _make_store(tmp_path / "store")
    before = _listing(tmp_path / "store")
    with disk_faults.read_only_bind(tmp_path / "store", tmp_path / "ro") as ro:
        with s3stream.open_reader(ro) as reader:
            assert [i.stream_id for i in reader.list_streams({"topic": "t"})] == sorted(model)
            for sid, want in model.items():
                assert _read_all(reader, sid) == want
            recs = list(reader.read_records(3, 0))
            assert [(o, r.key, r.value) for o, r in recs] == [(0, b"k1", b"v1"), (1, None, b"v2")]
            objects = reader.objects()
            assert any(o.live for o in objects) and any(not o.live for o in objects)
        for command in ("inspect", "verify"):
            assert cli_main([command, str(ro)]) == 0
        assert cli_main(["dump", str(ro), "0"]) == 0
        # A client needs to write (it registers a node): on a read-only mount it fails cleanly.
        with pytest.raises(s3stream.S3StreamError):
            s3stream.open(ro, wal="memory://")
    assert _listing(tmp_path / "store") == before


def test_read_only_tools_write_nothing_and_inspect_counts_objects_awaiting_deletion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    _make_store(root)
    before = _listing(root)
    assert cli_main(["inspect", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with s3stream.open_reader(root) as reader:
        objects = reader.objects()
    live = [o for o in objects if o.live]
    doomed = [o for o in objects if not o.live]
    assert doomed, "the compaction should have left replaced objects awaiting deletion"
    assert out["objects"] == len(live) and out["object_bytes"] == sum(o.size for o in live)
    assert out["objects_awaiting_deletion"] == len(doomed)
    assert out["bytes_awaiting_deletion"] == sum(o.size for o in doomed)
    assert cli_main(["verify", str(root)]) == 0
    assert cli_main(["dump", str(root), "1"]) == 0
    assert _listing(root) == before


def test_open_reader_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(s3stream.InvalidArgumentError, match="not a directory"):
        s3stream.open_reader(tmp_path / "missing")
    with pytest.raises(s3stream.InvalidArgumentError, match="not a directory"):
        open_reader_store(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    with pytest.raises(s3stream.InvalidArgumentError):
        s3stream.open_reader(tmp_path, settings="fast")  # type: ignore[arg-type]


def test_a_snapshot_is_one_view_that_moves_on_only_when_refreshed(tmp_path: Path) -> None:
    """`snapshot` gives planners one immutable view: later commits show in the next refreshed
    snapshot, never in one already taken, nor with ``refresh=False``."""
    root = tmp_path / "store"
    with s3stream.open(root, wal="memory://") as client:
        first = client.create_stream()
        first.append(RecordBatch(b"one"))
        client.flush()
        with s3stream.open_reader(root) as reader:
            before = reader.snapshot(refresh=False)
            assert [m.stream_id for m in before.list_streams()] == [first.stream_id]
            assert before.get_stream(first.stream_id).end_offset == 1
            second = client.create_stream()
            first.append(RecordBatch(b"two"))
            client.flush()
            assert reader.snapshot(refresh=False) is before
            after = reader.snapshot()
            assert after.seq > before.seq
            assert [m.stream_id for m in after.list_streams()] == [
                first.stream_id,
                second.stream_id,
            ]
            assert after.get_stream(first.stream_id).end_offset == 2
            assert before.get_stream(first.stream_id).end_offset == 1
        with pytest.raises(s3stream.StreamClosedError):
            reader.snapshot()


def _verify_output(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["verify", str(root)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("damage", ["hole", "flipped", "checkpoint", "pointer"])
def test_verify_names_damaged_metadata_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """`verify` replays the log from entry 1: a hole in the middle, a damaged entry, a
    checkpoint that disagrees with the entries, a pointer to nothing each exit non-zero and
    are named; a healthy store exits 0. It writes nothing either way."""
    root = tmp_path / "store"
    settings = ClientSettings(metadata_checkpoint_interval=5)
    with s3stream.open(root, wal="memory://", settings=settings) as client:
        for _ in range(12):
            client.create_stream()
    code, out = _verify_output(root, capsys)
    assert code == 0, out
    assert "metadata: " in out and "problems" not in out
    log = root / "meta" / "log"
    if damage == "hole":
        (log / f"{4:020d}").unlink()
        expect = "missing (a hole)"
    elif damage == "flipped":
        entry = log / f"{3:020d}"
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 0x40
        entry.write_bytes(bytes(data))
        expect = "damaged entry"
    elif damage == "checkpoint":
        # A checkpoint that is well-formed but of another state: the one after entry 5
        # written where the one after entry 10 belongs.
        cps = root / "meta" / "checkpoints"
        (cps / f"{10:020d}").write_bytes((cps / f"{5:020d}").read_bytes())
        expect = "checkpoint"
    else:
        # The newest checkpoint, which the pointer names, is gone.
        max((root / "meta" / "checkpoints").iterdir()).unlink()
        expect = "pointer"
    before = _listing(root)
    code, out = _verify_output(root, capsys)
    assert code != 0, out
    assert expect in out, out
    assert _listing(root) == before


def test_committed_offsets_no_object_holds_are_corruption_not_the_end(tmp_path: Path) -> None:
    """The last object of a stream replaced by another valid object of the store (same size,
    so nothing but the ranges tells): every read of the missing tail raises `CorruptionError`
    instead of returning an empty page that callers read as the end of the stream."""
    import os

    root = tmp_path / "store"
    with s3stream.open(root, wal="memory://") as c:
        s = c.create_stream()
        for _ in range(2):
            for _i in range(10):
                s.append(RecordBatch(os.urandom(200), count=1))
            c.flush()
        sid = s.stream_id
    objects = sorted((root / "data").rglob("*.s3o"))
    assert len(objects) == 2 and objects[0].stat().st_size == objects[1].stat().st_size
    objects[1].write_bytes(objects[0].read_bytes())
    with s3stream.open_reader(root) as r:
        assert len(r.read(sid, 0).batches) > 0  # the first object is whole
        with pytest.raises(s3stream.CorruptionError, match=r"offsets 10\.\.20 missing"):
            r.read(sid, 10)
        with pytest.raises(s3stream.CorruptionError):
            list(r.read_records(sid, 0))
        with pytest.raises(s3stream.CorruptionError):
            for _ in r.tail(sid, 0, poll_s=0.01):
                pass


def test_a_hole_in_the_metadata_log_is_corruption_not_a_short_history(tmp_path: Path) -> None:
    """An entry deleted from the middle of the log: a reader (and a writer's catch-up) that
    finds later entries raises `CorruptionError` naming it, instead of showing the state
    before it as the whole store."""
    root = tmp_path / "store"
    with s3stream.open(root, wal="memory://") as c:
        s = c.create_stream()
        for i in range(8):
            s.append(RecordBatch(b"%d" % i))
            c.flush()
    log_dir = root / "meta" / "log"
    entries = sorted(p.name for p in log_dir.iterdir())
    assert len(entries) >= 9, entries
    (log_dir / entries[4]).unlink()  # entry 5
    with (
        pytest.raises(s3stream.CorruptionError, match=f"{entries[4]}.*missing while later"),
        s3stream.open_reader(root) as r,
    ):
        r.list_streams()


@pytest.mark.s3
def test_a_reader_of_a_remote_prefix_without_a_store_is_refused(seaweedfs: Any) -> None:
    """A local directory that is missing is refused; a remote prefix has no "missing" of its
    own, and a typo in it (or a sub-prefix of a store) opened as an empty store."""
    import uuid

    url = f"s3://{seaweedfs.bucket}/store-{uuid.uuid4().hex}"
    opts = seaweedfs.storage_options()
    with s3stream.open(url, storage_options=opts, wal="memory://") as client:
        client.create_stream().append(RecordBatch(b"x"))
    with s3stream.open_reader(url, storage_options=opts) as reader:
        assert len(reader.list_streams()) == 1
    for wrong in (url + "-typo", url + "/data"):
        with pytest.raises(s3stream.InvalidArgumentError, match="holds no s3stream store"):
            s3stream.open_reader(wrong, storage_options=opts)


def test_a_store_under_another_metadata_prefix_is_named(tmp_path: Path) -> None:
    """A wrong metadata prefix on a real store called the store's own objects somebody
    else's files ("holds no s3stream store but other files ('data/...')"); the error now
    names the prefix the store's log is under."""
    with s3stream.open(tmp_path, wal="memory://") as client:
        client.create_stream().append(RecordBatch(b"x"))
    # Folders no prefix can name, and a symlink loop, beside it: looked past.
    (tmp_path / "a\\b").mkdir()
    os.mkdir(os.fsencode(tmp_path) + b"/\xff")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for wrong in ("nope", "Meta"):
        with pytest.raises(InvalidArgumentError, match="metadata_prefix='meta'"):
            s3stream.open_reader(tmp_path, metadata_prefix=wrong)
    with s3stream.open_reader(tmp_path) as reader:
        assert len(reader.list_streams()) == 1
