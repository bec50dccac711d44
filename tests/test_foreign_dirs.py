"""s3stream touches nothing but its own files: a directory of somebody else's files, a WAL path
that is a directory or somebody's file, a typo in a take-over's WAL, a failed open: each is
refused with a library error (the CLI: one line, exit 2) before anything is written, and a
failed open deletes nothing (another process may be opening the same store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import s3stream
from s3stream import InvalidArgumentError, RecordBatch
from s3stream.cli import _DEMO_MAX_BATCH_BYTES
from s3stream.errors import CorruptionError, NodeInUseError
from s3stream.validation import check_int
from s3stream.wal.base import WalCapabilities

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"file_wal.capacity_bytes": "1MiB"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("S3STREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "s3stream", *args],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if not line.startswith((" ", "usage"))]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A user's directory: files of its own, no store."""
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    (other / "readme.txt").write_text("x\n")
    return other


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store whose node 'w' closed its streams (its WAL is in memory)."""
    root = tmp_path / "store"
    with s3stream.open(root, node_id="w", wal="memory://") as client:
        client.create_stream().append(RecordBatch(b"a"))
    return root


# -- 1. the CLI's commands that need a store ----------------------------------------------------


def test_commands_refuse_a_directory_without_a_store(foreign: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    before = tree(foreign)
    for where in (foreign, empty):
        for argv in (
            ["compact", str(where), "--nice", "0"],
            ["take-over", str(where), "n1"],
            ["inspect", str(where)],
            ["verify", str(where)],
            ["dump", str(where), "0"],
        ):
            one_line(run(*argv), 2, str(where), "holds no s3stream store")
    assert tree(foreign) == before
    assert tree(empty) == set()


def test_take_over_of_an_unknown_node_writes_nothing(store: Path) -> None:
    entries = tree(store / "meta" / "log")
    one_line(run("take-over", str(store), "nobody"), 2, "'nobody' is not registered")
    assert tree(store / "meta" / "log") == entries


# -- 2. open on somebody else's directory -------------------------------------------------------


def test_open_refuses_a_directory_of_other_files(foreign: Path) -> None:
    before = tree(foreign)
    with pytest.raises(InvalidArgumentError, match="empty or new directory") as info:
        s3stream.open(foreign)
    assert str(foreign) in str(info.value) and "readme.txt" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="holds no s3stream store"):
        s3stream.open_reader(foreign)
    # The same directory by a path through a directory that does not exist ("new/.."):
    with pytest.raises(InvalidArgumentError, match="empty or new directory"):
        s3stream.open(f"{foreign.parent}/not-there/../{foreign.name}")
    assert tree(foreign) == before
    assert not (foreign.parent / "not-there").exists()


def test_a_path_through_a_symlink_and_dotdot_is_judged_where_it_leads(
    foreign: Path, tmp_path: Path
) -> None:
    """``link/../victim`` is resolved by the kernel through the link's target: the check of
    the directory looked at the lexically normalised path instead (an empty or missing
    one) and the store then wrote meta/ and wal/ beside somebody's files."""
    deep = foreign / "deep"
    deep.mkdir()
    elsewhere = tmp_path / "x" / "y"  # lexically, link/../.. is x: empty, no files
    elsewhere.mkdir(parents=True)
    (elsewhere / "link").symlink_to(deep)
    before = tree(foreign)
    with pytest.raises(InvalidArgumentError, match="empty or new directory"):
        s3stream.open(f"{elsewhere}/link/../../{foreign.name}")
    assert tree(foreign) == before


def test_what_a_desktop_leaves_in_a_folder_is_not_somebodys_files(tmp_path: Path) -> None:
    for name in (".DS_Store", "Thumbs.db"):
        (tmp_path / name).write_bytes(b"\0")
    with s3stream.open(tmp_path, settings=SMALL) as client:
        client.create_stream()


def test_open_takes_an_empty_a_missing_and_a_store_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for where in (empty, tmp_path / "new" / "deeper"):
        with s3stream.open(where, settings=SMALL) as client:
            client.create_stream().append(RecordBatch(b"x"))
        with s3stream.open(where, settings=SMALL) as client:  # its own store, reopened
            assert len(client.list_streams()) == 1
        with s3stream.open_reader(where) as reader:
            assert len(reader.list_streams()) == 1


def test_what_an_interrupted_first_open_left_is_not_foreign(tmp_path: Path) -> None:
    """A first open killed before it registered its node leaves ``wal/`` (a lock file): that
    directory is still the store's."""
    root = tmp_path / "s"
    (root / "wal").mkdir(parents=True)
    (root / "wal" / "local.wal.lock").write_text("1\nlocal\n")
    with s3stream.open(root, settings=SMALL) as client:
        client.create_stream()


@pytest.mark.parametrize("wal_name", ["wal", "node.log"])
def test_a_wal_named_inside_the_store_directory_is_not_foreign(
    tmp_path: Path, wal_name: str
) -> None:
    """A WAL URL naming a file in the store directory itself: a first open killed before the
    store's first entry left the WAL's lock file there, and every later open refused the
    directory as somebody else's (until the user deleted the lock file). Another file beside
    it is still somebody's."""
    root = tmp_path / "s"
    root.mkdir()
    (root / f"{wal_name}.lock").write_text("1\nlocal\n")
    wal = f"file://{root}/{wal_name}?capacity_bytes=1MiB"
    with s3stream.open(root, wal=wal, settings=SMALL) as client:
        client.create_stream()
    other = tmp_path / "o"
    other.mkdir()
    (other / f"{wal_name}.lock").write_text("1\nlocal\n")
    (other / f"{wal_name}.lock.txt").write_text("mine")
    with pytest.raises(s3stream.InvalidArgumentError, match="holds other files"):
        s3stream.open(other, wal=f"file://{other}/{wal_name}?capacity_bytes=1MiB")
    assert sorted(os.listdir(other)) == [f"{wal_name}.lock", f"{wal_name}.lock.txt"]


def test_a_users_own_data_or_meta_folder_is_not_taken_for_a_store(tmp_path: Path) -> None:
    """``data`` is a common folder name: a directory whose only entry is the user's own
    ``data/`` (or ``meta/``) with files in it holds no store, and opening it writes nothing
    (before, the store put its objects beside the user's files). An empty ``data/`` and a
    local store's temporary files are still what an interrupted first open may leave."""
    for folder in ("data", "meta"):
        root = tmp_path / folder / "proj"
        (root / folder / "2024").mkdir(parents=True)
        (root / folder / "2024" / "photo.jpg").write_bytes(b"\xff\xd8")
        before = tree(root)
        with pytest.raises(InvalidArgumentError, match="empty or new directory") as info:
            s3stream.open(root, settings=SMALL)
        assert f"{folder}/2024/photo.jpg" in str(info.value)
        with pytest.raises(InvalidArgumentError, match="holds no s3stream store"):
            s3stream.open_reader(root)
        assert tree(root) == before
    fine = tmp_path / "fine"
    (fine / "data" / "sub").mkdir(parents=True)
    (fine / "meta" / "log").mkdir(parents=True)
    (fine / "meta" / "log" / ".tmp-123-0").write_bytes(b"x")
    with s3stream.open(fine, settings=SMALL) as client:
        client.create_stream().append(RecordBatch(b"x"))
    with s3stream.open(fine, settings=SMALL) as client:  # a store now: data/ holds objects
        assert len(client.list_streams()) == 1


# -- 3. an open checks before it writes, and a failed open deletes nothing -----------------------


@pytest.mark.parametrize("kind", ["scheme", "directory", "not-a-wal", "parent-is-a-file"])
def test_a_bad_wal_is_refused_before_anything_is_written(
    tmp_path: Path, foreign: Path, kind: str
) -> None:
    wal = {
        "scheme": "zzz://x",
        "directory": (tmp_path / "walsdir").as_uri(),
        "not-a-wal": (foreign / "readme.txt").as_uri(),
        "parent-is-a-file": f"{(foreign / 'readme.txt').as_uri()}/x.wal",
    }[kind]
    (tmp_path / "walsdir").mkdir()
    before = tree(tmp_path)
    with pytest.raises(InvalidArgumentError):
        s3stream.open(tmp_path / "store", wal=wal)
    assert tree(tmp_path) == before  # no store, no meta/log, no .lock anywhere
    assert (foreign / "readme.txt").read_text() == "x\n"


def test_a_failed_open_deletes_nothing(tmp_path: Path) -> None:
    """An open refused after it began writing deletes nothing: not the other node's WAL and
    lock (the WAL belongs to node 'a'), not a live client's store, WAL or lock (a second
    open of the same node, which loses with `NodeInUseError`)."""
    with s3stream.open(tmp_path / "s1", node_id="a", settings=SMALL):
        pass
    theirs = (tmp_path / "s1" / "wal" / "a.wal").as_uri()
    with pytest.raises(InvalidArgumentError, match="belongs to node 'a'"):
        s3stream.open(tmp_path / "new", node_id="b", wal=theirs, settings=SMALL)
    assert sorted(os.listdir(tmp_path / "s1" / "wal")) == ["a.wal", "a.wal.lock"]
    live = s3stream.open(tmp_path / "s2", settings=SMALL)
    s = live.create_stream()
    with pytest.raises(NodeInUseError):
        s3stream.open(tmp_path / "s2", settings=SMALL)
    assert sorted(os.listdir(tmp_path / "s2" / "wal")) == ["local.wal", "local.wal.lock"]
    s.append(RecordBatch(b"still the live client's"))
    live.close()
    with s3stream.open(tmp_path / "s2", settings=SMALL) as again:
        assert [b.payload for b in again.read(s.stream_id, 0).batches] == [
            b"still the live client's"
        ]


# -- 4. take-over with a WAL that is not there ---------------------------------------------------


def test_take_over_of_a_missing_named_wal_is_refused_and_creates_nothing(
    store: Path, tmp_path: Path
) -> None:
    typo = tmp_path / "x" / "typo.wal"
    entries = tree(store / "meta" / "log")
    with s3stream.open(store, node_id="n2", wal="memory://") as client:
        entries = tree(store / "meta" / "log")
        with pytest.raises(InvalidArgumentError, match="no WAL at"):
            client.take_over("w", wal=typo.as_uri())
        assert tree(store / "meta" / "log") == entries  # not even fenced
    assert not (tmp_path / "x").exists()
    one_line(run("take-over", str(store), "w", "--wal", str(typo)), 2, "no WAL at", str(typo))
    assert not (tmp_path / "x").exists()


def test_take_over_of_a_missing_wal_of_open_streams_is_still_damage(tmp_path: Path) -> None:
    root = tmp_path / "s"
    crashed = s3stream.open(root, node_id="w", settings=SMALL)
    crashed.create_stream().append(RecordBatch(b"acked"))
    crashed.abandon()
    gone = tmp_path / "gone.wal"
    with (
        s3stream.open(root, node_id="n2", wal="memory://") as client,
        pytest.raises(CorruptionError, match="still has streams open"),
    ):
        client.take_over("w", wal=gone.as_uri())
    assert not gone.exists()


def test_a_users_file_named_like_a_store_folder_is_foreign(tmp_path: Path) -> None:
    """A directory holding a user's *file* named ``data`` was taken for a store: the open
    wrote meta/ and a WAL beside it, acknowledged appends, and every upload then failed (a
    file where the objects' folder must be); with a file ``meta`` the open was refused only
    after it had made the WAL's lock file. Such a file makes the directory somebody else's."""
    for name in ("data", "meta", "wal"):
        root = tmp_path / name
        root.mkdir()
        (root / name).write_text("the user's\n")
        with pytest.raises(InvalidArgumentError, match="holds other files and no s3stream"):
            s3stream.open(root)
        assert tree(root) == {name}
        one_line(run("demo", str(root), "--reuse", "--batches", "1"), 2, "no s3stream store")
        assert tree(root) == {name}


def test_an_object_wal_url_typo_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A typo in an S3 WAL URL's query, or its ``client=``, was refused only after the open
    had made the store directory and registered the node (a file WAL's was refused first)."""
    for wal, why in (
        ("s3://bucket/wal?bogus=1", "unknown object WAL setting 'bogus'"),
        ("s3://bucket/wal?client=nope", "client must be one of"),
        ("s3://bucket/wal?wal_batch_interval_ms=abc", "wal_batch_interval_ms"),
        (f"object+file://{tmp_path}/w?bogus=1", "unknown object WAL setting 'bogus'"),
    ):
        with pytest.raises(InvalidArgumentError, match=why):
            s3stream.open(tmp_path / "s", wal=wal)
        assert not (tmp_path / "s").exists() and not (tmp_path / "w").exists()


def test_a_memory_wal_url_with_options_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """``wal="memory://?bogus=1"`` (or with a path) was accepted and its options ignored: the
    open passed a plain ``memory://`` on. Refused now, before the store is made."""
    for wal in ("memory://?bogus=1", "memory://x/y?capacity_bytes=notasize", "memory://x"):
        with pytest.raises(InvalidArgumentError, match="takes no path or options"):
            s3stream.open(tmp_path / "s", wal=wal)
        assert not (tmp_path / "s").exists()


# -- 5. demo --batch-bytes ------------------------------------------------------------------------


def test_demo_refuses_a_batch_larger_than_a_wal_record(tmp_path: Path) -> None:
    limit = next(
        f.default for f in WalCapabilities.__dataclass_fields__.values()
        if f.name == "max_record_bytes"
    )  # fmt: skip
    assert limit > _DEMO_MAX_BATCH_BYTES
    for size in ("99999999999999", str(_DEMO_MAX_BATCH_BYTES + 1)):
        result = run("demo", str(tmp_path / "d"), "--batch-bytes", size)
        assert result.returncode == 2 and "argument --batch-bytes" in result.stderr
        assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert not (tmp_path / "d").exists()


# -- 6. NUL in a path, a directory as --wal ------------------------------------------------------


def test_nul_paths_and_a_directory_as_verify_wal(tmp_path: Path, store: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="NUL"):
        s3stream.open(f"{tmp_path}/a\x00b")
    with pytest.raises(InvalidArgumentError):
        s3stream.open_reader(f"{tmp_path}/a\x00b")
    one_line(run("verify", str(store), "--wal", str(tmp_path)), 2, str(tmp_path), "directory")


# -- 7. integers of other types -------------------------------------------------------------------


def test_numpy_integers_are_refused_with_a_hint_and_huge_ones_too_large() -> None:
    """Only plain ints are taken (callers keep what they passed, and encoders take plain
    ints only): a numpy integer is refused, saying to convert it; 10**30 is "too large"."""
    for bad in (np.int64(5), np.uint8(3)):
        with pytest.raises(InvalidArgumentError, match=r"pass int\(\.\.\.\) of it"):
            check_int("stream_id", bad)
    for bad in (True, np.True_, 1.0, "1", None):
        with pytest.raises(InvalidArgumentError, match="must be an int >= 0"):
            check_int("n", bad)
    with pytest.raises(InvalidArgumentError, match="n is too large: it must be an int <= "):
        check_int("n", 10**30)
    with pytest.raises(InvalidArgumentError, match="must be an int >= 0") as info:
        check_int("n", -1)
    assert "pass int" not in str(info.value)  # a plain int needs no conversion hint
    assert check_int("n", 5) == 5


def test_a_users_wal_folder_or_a_symlinked_data_folder_is_not_taken_for_a_store(
    tmp_path: Path,
) -> None:
    """Two gaps in the rule above: a directory whose only entry is the user's own ``wal/``
    (archived PostgreSQL segments) got meta/, data/ and a WAL among them, and ``data`` or
    ``meta`` reached through a symlink were never looked into, so objects landed beside the
    user's files. A WAL and its lock file left by an interrupted first open still pass."""
    pg = tmp_path / "pgbackup"
    (pg / "wal").mkdir(parents=True)
    (pg / "wal" / "000000010000000000000001").write_bytes(b"segment")
    proj = tmp_path / "proj"
    proj.mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    (proj / "data").symlink_to(tmp_path / "notes")
    for root, shown in ((pg, "wal/000000010000000000000001"), (proj, "data/todo.txt")):
        before = tree(tmp_path)
        with pytest.raises(InvalidArgumentError, match="empty or new directory") as info:
            s3stream.open(root, settings=SMALL)
        assert shown in str(info.value)
        assert tree(tmp_path) == before
    left = tmp_path / "left"
    (left / "wal").mkdir(parents=True)
    (left / "wal" / "local.wal").write_bytes(b"")
    (left / "wal" / "local.wal.lock").write_text("1\nlocal\n")
    with s3stream.open(left, settings=SMALL) as client:
        client.create_stream()


def test_a_local_path_too_long_to_name_is_a_clear_error(tmp_path: Path) -> None:
    """A name over 255 bytes raised a bare ``OSError: File name too long`` from a path check
    deep inside `open`, `open_reader` and the CLI (which exited 1 instead of 2)."""
    long = str(tmp_path / ("a" * 300))
    for call in (
        lambda: s3stream.open(long),
        lambda: s3stream.open_reader(long),
        lambda: s3stream.open(str(tmp_path / "st"), wal=f"file://{tmp_path}/{'w' * 300}.wal"),
    ):
        with pytest.raises(InvalidArgumentError, match="too long"):
            call()
    for command in ("inspect", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "s3stream", command, long], capture_output=True, text=True
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_name_limit_counts_a_wal_urls_path_not_its_query(tmp_path: Path) -> None:
    """The 255-byte check counted a file:// WAL URL's ?query as part of the file's name and
    refused a 240-byte name that the file system takes (review)."""
    name = "w" * 236 + ".wal"
    wal = f"file://{tmp_path}/{name}?capacity_bytes=1MiB"
    with s3stream.open(str(tmp_path / "st"), wal=wal, settings=SMALL) as client:
        client.create_stream().append(RecordBatch(b"x"))
    assert (tmp_path / name).stat().st_size < 2 << 20
    # 255 bytes fit the WAL, not its lock file beside it: refused before anything is made.
    with pytest.raises(InvalidArgumentError, match="lock file"):
        s3stream.open(str(tmp_path / "st2"), wal=f"file://{tmp_path}/{'v' * 251}.wal")
    assert not (tmp_path / "st2").exists()


@pytest.fixture(params=["file", "object"])
def wal_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The WAL named `name` in `tmp_path`: a file WAL, or an object WAL on a local directory."""

    def at(name: str) -> str:
        if request.param == "file":
            # A small ring: the default preallocates 2 GiB, which `_contents` reads whole.
            return f"file://{tmp_path}/{name}.wal?capacity_bytes=1MiB"
        return f"object+file://{tmp_path}/{name}-wal"

    return at


def _contents(wal: str) -> dict[str, bytes]:
    """Every byte of a WAL: its file's, or its objects' by name."""
    if wal.startswith("object+file://"):
        root = Path(wal[len("object+file://") :])
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return {"": Path(wal.removeprefix("file://").split("?", 1)[0]).read_bytes()}


def _crash_after_appends(store: Path, wal: str, *payloads: str, node_id: str = "local") -> None:
    """A writer (node `node_id`) that creates a stream in `store`, appends `payloads` through
    `wal` (each acknowledged) and dies by SIGKILL before uploading any."""
    code = (
        "import os, signal, sys, s3stream\n"
        "c = s3stream.open(sys.argv[1], wal=sys.argv[2], node_id=sys.argv[3])\n"
        "s = c.create_stream()\n"
        "for p in sys.argv[4:]:\n"
        "    s.append(s3stream.RecordBatch(p.encode()))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("S3STREAM_")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(store), str(wal), node_id, *payloads],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


def _payloads(store: Path, wal: str, stream_id: int = 0) -> list[bytes]:
    with s3stream.open(str(store), wal=wal) as client:
        stream = client.open_stream(stream_id)
        return [bytes(b.payload) for b in stream.fetch(0, 1 << 20).batches]


@pytest.mark.parametrize("b_streams", ["open", "closed", "none"])
def test_another_stores_wal_is_never_replayed_into_this_store(
    tmp_path: Path, wal_at: Callable[[str], str], b_streams: str
) -> None:
    """Two stores named one WAL, one after the other (a copied setting): store A's writer
    died with acknowledged appends in it, then B was opened with it. B used to take it: into
    B's stream 0 when that was open at the same epoch (A's records read back as B's), else
    dropped as past the end of B's closed stream (A's appends lost, A fenced off its WAL). B
    is refused now before anything is written, and A recovers every append. The same for a
    file WAL and an object WAL (its prefix's identity object)."""
    shared = wal_at("shared")
    a, b = tmp_path / "a", tmp_path / "b"
    if b_streams == "open":
        _crash_after_appends(b, wal_at("b"))  # stream 0 left open, at epoch 1
    elif b_streams == "closed":
        with s3stream.open(str(b), wal=wal_at("b")) as client:
            client.create_stream().append(RecordBatch(b"B's own"))
    _crash_after_appends(a, shared, "A-0", "A-1", "A-2")
    before = _contents(shared)
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded") as info:
        s3stream.open(str(b), wal=shared)
    assert "holds records that are not uploaded" in str(info.value)
    assert _contents(shared) == before
    assert _payloads(a, shared) == [b"A-0", b"A-1", b"A-2"]
    if b_streams == "closed":
        assert _payloads(b, wal_at("b")) == [b"B's own"]


def test_another_stores_empty_wal_is_formatted_anew_and_then_not_its_own(
    tmp_path: Path, wal_at: Callable[[str], str]
) -> None:
    """A WAL another store closed cleanly holds nothing to lose: B takes it, formatted with a
    new identity. Once B's writer dies with appends in it, A (which recorded the old
    identity) is refused it, and B recovers them."""
    shared = wal_at("shared")
    a, b = tmp_path / "a", tmp_path / "b"
    with s3stream.open(str(a), wal=shared) as client:
        client.create_stream().append(RecordBatch(b"A's"))
        first = client.wal.identity
    assert first is not None
    with s3stream.open(str(b), wal=wal_at("b")) as client:
        client.create_stream()
    with s3stream.open(str(b), wal=shared) as client:
        assert client.wal.identity not in (None, first)
        client.open_stream(0).append(RecordBatch(b"B-0"))
    _crash_after_appends(b, shared, "B-1")
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        s3stream.open(str(a), wal=shared)
    assert _payloads(b, shared, 1) == [b"B-1"]  # the crashed writer's new stream
    assert _payloads(a, shared) == [b"A's"]  # clean again after B's close: A's once more


def test_an_empty_wal_not_the_nodes_own_is_a_loss_while_its_streams_are_open(
    tmp_path: Path, wal_at: Callable[[str], str]
) -> None:
    """A node whose last session died with streams open names an empty WAL of another store:
    its own WAL, elsewhere, may hold acknowledged appends, so taking the empty one would
    release them unseen. That is the loss a missing WAL is (`CorruptionError` unless
    `accept_wal_loss`), not a WAL to format."""
    a, other = tmp_path / "a", tmp_path / "other"
    _crash_after_appends(a, wal_at("a"), "A-0")
    with s3stream.open(str(other), wal=wal_at("other")) as client:
        client.create_stream().append(RecordBatch(b"other's"))
    before = _contents(wal_at("other"))
    with pytest.raises(CorruptionError, match="not the one the store recorded"):
        s3stream.open(str(a), wal=wal_at("other"))
    assert _contents(wal_at("other")) == before
    assert _payloads(other, wal_at("other")) == [b"other's"]
    assert _payloads(a, wal_at("a")) == [b"A-0"]


def _crash_after_open(store: Path, wal: str) -> None:
    """A client that opens `store` with `wal` and dies by SIGKILL before opening a stream."""
    code = (
        "import os, signal, sys, s3stream\n"
        "c = s3stream.open(sys.argv[1], wal=sys.argv[2])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("S3STREAM_")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(store), str(wal)],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


def test_a_new_wal_of_the_node_that_died_before_any_stream_opens_again(
    tmp_path: Path, wal_at: Callable[[str], str]
) -> None:
    """The node recorded one WAL, then opened with a new one (its old disk gone) and was
    killed before it opened a stream: the new WAL's identity was never recorded, and its
    header, claimed at the open, said it was not shut down cleanly. It was refused for good
    as another store's WAL holding records; it holds none, and opens."""
    store = tmp_path / "store"
    with s3stream.open(str(store), wal=wal_at("old")) as client:
        client.create_stream().append(RecordBatch(b"uploaded"))
    _crash_after_open(store, wal_at("new"))
    assert _payloads(store, wal_at("new")) == [b"uploaded"]


def test_a_truncated_wal_of_another_store_is_refused_without_a_write(tmp_path: Path) -> None:
    """Store A's WAL was cut short with records in it; store B named it by mistake. B's open
    put the file back to its full size before it refused it, so A's next open no longer saw
    the cut (its CorruptionError) and recovered part of its records without a word."""
    a, shared = tmp_path / "a", tmp_path / "shared.wal"
    _crash_after_appends(a, str(shared), *(f"A-{i}" for i in range(50)))
    cut = shared.stat().st_size // 2
    with open(shared, "r+b") as f:
        f.truncate(cut)
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        s3stream.open(str(tmp_path / "b"), wal=str(shared), accept_wal_loss=True)
    assert shared.stat().st_size == cut
    with pytest.raises(CorruptionError, match="truncated"):
        s3stream.open(str(a), wal=str(shared))


def test_a_node_without_a_recorded_wal_and_no_open_streams_takes_no_records(
    tmp_path: Path, wal_at: Callable[[str], str]
) -> None:
    """Store B's node is registered but recorded no WAL (it never opened a stream), and has
    no streams open, so no record in any WAL can be of use to it: a WAL holding another
    store's records is refused (it was taken, and those records dropped)."""
    b, a, shared = tmp_path / "b", tmp_path / "a", wal_at("shared")
    s3stream.open(str(b), wal=wal_at("b")).close()
    _crash_after_appends(a, shared, "A-0", "A-1")
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        s3stream.open(str(b), wal=shared)
    assert _payloads(a, shared) == [b"A-0", b"A-1"]


def test_a_take_over_of_a_node_without_a_recorded_wal_takes_no_records(
    tmp_path: Path, wal_at: Callable[[str], str]
) -> None:
    """The take-over's side of the same rule: store B's node n1 is registered, recorded no
    WAL and has no stream open; taking it over with a WAL that holds store A's records
    trimmed them away (A's acknowledged appends lost). Refused now, and A recovers them."""
    b, a, shared = tmp_path / "b", tmp_path / "a", wal_at("shared")
    s3stream.open(str(b), node_id="n1", wal=wal_at("b-n1")).close()
    _crash_after_appends(a, shared, "A-0", "A-1", node_id="n1")
    with (
        s3stream.open(str(b), node_id="n2", wal=wal_at("b-n2")) as taker,
        pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"),
    ):
        taker.take_over("n1", wal=shared)
    with s3stream.open(str(a), wal=shared, node_id="n1") as client:
        got = [bytes(b.payload) for b in client.open_stream(0).fetch(0, 1 << 20).batches]
    assert got == [b"A-0", b"A-1"]
