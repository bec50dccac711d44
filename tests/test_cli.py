"""The ``s3stream`` command, as a newcomer meets it: run for real, ``python -m s3stream``.

Every command runs in a subprocess against one small store built once for the module (two
closed streams, objects awaiting deletion, and a stream left open by a writer killed with
SIGKILL, so that there is a node to take over); commands that change a store work on a copy.
Checked: exit statuses (0, 1 failure, 2 bad input, 130 Ctrl-C, quiet broken pipes), one-line
errors without tracebacks, ``-o`` and the environment on every command, help everywhere,
tables and ``--json``, progress bars that move within a compaction task, and URL typos
(``s3:/x``, ``memory:/``, ``~``) in the library and the command alike.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import s3stream
from s3stream import ClientSettings, InvalidArgumentError, RecordBatch
from s3stream.cli import _parser
from s3stream.opening import default_wal_url
from s3stream.testing.s3_servers import LoopbackS3Server

ROOT = Path(__file__).resolve().parents[1]
#: The environment of every command: this checkout, and none of the variables the command
#: reads unless a test sets them.
ENV = {
    **{
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("S3STREAM_", "AWS_ENDPOINT_URL", "TQDM_"))
        and k not in ("AWS_REGION", "AWS_DEFAULT_REGION")
    },
    "PYTHONPATH": str(ROOT),
}
#: Batches of stream 0 ("orders"): enough JSON from `dump` to overflow a pipe.
ORDERS = 1500
COMMANDS = ("demo", "inspect", "verify", "dump", "compact", "take-over")

WRITER = textwrap.dedent(
    """
    import sys, time
    import s3stream
    from s3stream import ClientSettings, RecordBatch

    settings = ClientSettings(upload_threshold_bytes=256 << 20, upload_interval_ms=3_600_000)
    client = s3stream.open(sys.argv[1], node_id="writer", wal=sys.argv[2], settings=settings)
    stream = client.create_stream(tags={"topic": "live"})
    stream.append(RecordBatch(b"uploaded"))
    client.flush()
    stream.append(RecordBatch(b"only in the WAL"))
    print("acked", flush=True)
    time.sleep(3600)
    """
)


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "s3stream", *args],
        capture_output=True,
        text=True,
        env=ENV if env is None else env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def run_all(*commands: Sequence[str], **kw: object) -> list[subprocess.CompletedProcess[str]]:
    """`run` each command, side by side (each pays for its own interpreter start)."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda argv: run(*argv, **kw), commands))  # type: ignore[arg-type]


def one_line_error(result: subprocess.CompletedProcess[str], status: int, *needles: str) -> str:
    """The single stderr line of a command that failed with `status`, naming `needles`."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert re.match(r"s3stream [a-z-]+: ", lines[0]), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (100 columns: tqdm draws nothing without a
    width); the status, stdout and what the terminal showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "s3stream", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        env=ENV,
    )
    os.close(slave)
    shown = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        reader.join(timeout=30)
        os.close(master)
    return proc.returncode, out, shown.decode(errors="replace")


def percents(shown: str) -> list[int]:
    return sorted({int(p) for p in re.findall(r"(\d+)%\|", shown)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Store:
    root: Path
    #: The WAL of the killed writer, which still owns stream 2.
    writer_wal: str

    def copy(self, to: Path) -> tuple[Path, str]:
        """A copy to change, and its writer's WAL."""
        shutil.copytree(self.root, to)
        return to, self.writer_wal.replace(str(self.root), str(to))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("cli") / "store"
    with s3stream.open(root, wal="memory://") as client:
        orders = client.create_stream(tags={"topic": "orders", "partition": "0"})
        audit = client.create_stream(tags={"topic": "audit"})
        for part in range(3):
            acks = [
                orders.append_async(RecordBatch(b"o" * 40, properties={"i": str(i)}))
                for i in range(part * ORDERS // 3, (part + 1) * ORDERS // 3)
            ]
            audit.append(RecordBatch(b"a" * 100, count=3))
            for ack in acks:
                ack.result()
            client.flush()
        client.compact()  # the small objects now await deletion
    wal = f"{(root / 'wal' / 'writer.wal').as_uri()}?capacity=1MiB"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), wal], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "acked"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    return Store(root, wal)


# ---------------------------------------------------------------------------------------------
# demo


def test_demo_appends_reopens_and_reads_back(tmp_path: Path) -> None:
    where = tmp_path / "demo"
    first = run("demo", str(where), "--batches", "200", "--streams", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "demo OK"
    assert "read back all 200 batches byte-identical" in first.stdout
    assert not re.search(r"(?<![\w/.-])-\d", first.stdout), "a negative count or rate"
    assert first.stderr == ""  # no progress bar off a terminal
    again = run("demo", str(where), "--batches", "10")
    one_line_error(again, 2, "not empty", "--reuse")
    reused = run("demo", str(where), "--batches", "10", "--streams", "1", "--reuse")
    assert reused.returncode == 0, reused.stderr


def test_demo_of_many_streams_writes_a_few_metadata_entries(tmp_path: Path) -> None:
    """`demo --streams N` made one metadata entry per stream as it created them and one
    more per stream as it read them back (opening each), with a checkpoint of every stream
    every 64 entries: 100,000 streams wrote 19 GB of metadata in 4 minutes. It creates them
    in one call now and reads back through a read-only reader."""
    where = tmp_path / "demo"
    done = run("demo", str(where), "--batches", "100", "--streams", "5000")
    assert done.returncode == 0, done.stderr
    assert "read back all 100 batches byte-identical" in done.stdout
    entries = [p for p in (where / "meta" / "log").iterdir() if not p.name.startswith(".")]
    assert len(entries) < 10, sorted(p.name for p in entries)


def test_demo_checks_its_arguments_before_touching_anything(tmp_path: Path) -> None:
    where = tmp_path / "never"
    a_file = tmp_path / "afile.txt"
    a_file.write_text("not a directory\n")
    bad_numbers = [
        ("--streams", "0"),
        ("--streams", "100001"),  # one create_streams call's most
        ("--batches", "-5"),
        ("--batch-bytes", "0"),
        ("--batches", "lots"),
    ]
    results = run_all(
        *(["demo", str(where), *flag] for flag in bad_numbers),
        ["demo", str(a_file), "--batches", "10"],
        ["demo", "memory://", "--batches", "10"],
    )
    for (flag, value), result in zip(bad_numbers, results, strict=False):
        assert result.returncode == 2, (flag, result.stderr)
        assert f"error: argument {flag}" in result.stderr and value in result.stderr
        assert "Traceback" not in result.stderr
    one_line_error(results[-2], 2, "afile.txt", "not a directory")
    one_line_error(results[-1], 2, "memory://")
    assert not where.exists()
    assert a_file.read_text() == "not a directory\n"


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5])
def test_ctrl_c_exits_130_with_one_line(tmp_path: Path, delay: float) -> None:
    """At any moment (creating streams, appending): a Ctrl-C raised into the library's own
    bookkeeping once left an append counted in flight forever, and the demo hung in close()
    about one time in ten on a loaded machine."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "s3stream", "demo", str(tmp_path / "d"), "--batches", "10000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("s3stream demo: ")
        time.sleep(delay)  # 0.5 s: appending by now
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == "s3stream demo: interrupted\n"
    assert "demo OK" not in out


# ---------------------------------------------------------------------------------------------
# Arguments, options, environment


def test_every_argument_has_help_and_every_command_an_example() -> None:
    parser = _parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, command in sub.choices.items():
        assert command.epilog and "examples:" in command.epilog
        assert f"s3stream {name}" in command.epilog
        for action in command._actions:
            if action.help == argparse.SUPPRESS:
                continue  # --node-id of the read-only tools: accepted, does nothing
            assert action.help and len(action.help) > 10, (name, action.option_strings)
    helps = run_all(["--help"], *([name, "--help"] for name in COMMANDS))
    for result in helps:
        assert result.returncode == 0 and "examples:" in result.stdout, result.stdout
    assert "S3STREAM_ENDPOINT_URL" in helps[0].stdout and "docs/cli.md" in helps[0].stdout


def test_every_command_takes_storage_options(store: Store, tmp_path: Path) -> None:
    """``-o`` reaches the store of every command: an option a local store does not know is
    named (exit 2, nothing created), and ``fsync=false`` arrives as the bool it needs."""
    url = str(store.root)
    argvs = {
        "demo": ["demo", str(tmp_path / "d")],
        "inspect": ["inspect", url],
        "verify": ["verify", url],
        "dump": ["dump", url, "0"],
        "compact": ["compact", url, "--nice", "0"],
        "take-over": ["take-over", url, "writer"],
    }
    results = run_all(
        *([*argv, "-o", "bogus=1"] for argv in argvs.values()),
        ["inspect", url, "-o", "fsync=false", "--json"],
        ["inspect", url, "--storage-option", "oops"],
    )
    for name, result in zip(argvs, results, strict=False):
        assert one_line_error(result, 2, "bogus").startswith(f"s3stream {name}: error: ")
    assert not (tmp_path / "d").exists()
    assert results[-2].returncode == 0, results[-2].stderr
    one_line_error(results[-1], 2, "KEY=VALUE", "oops")


def test_the_environment_names_the_store_and_its_endpoint(store: Store) -> None:
    """S3STREAM_URL stands in for a missing URL; S3STREAM_ENDPOINT_URL (or boto3's
    AWS_ENDPOINT_URL) reaches an s3:// store, and ``-o`` wins over both. The endpoints are
    closed ports: each run fails as a store out of reach does, exit 1, naming it."""
    pytest.importorskip("boto3")
    env_port, aws_port, option_port = free_port(), free_port(), free_port()
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    s3 = ["inspect", "s3://bucket/prefix", "--store-timeout", "1"]
    ours = {**ENV, **creds, "S3STREAM_ENDPOINT_URL": f"http://127.0.0.1:{env_port}"}
    theirs = {**ENV, **creds, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{aws_port}"}
    with ThreadPoolExecutor(4) as pool:
        by_url = pool.submit(run, "inspect", "--json", env={**ENV, "S3STREAM_URL": str(store.root)})
        by_ours = pool.submit(run, *s3, env=ours)
        by_theirs = pool.submit(run, *s3, env=theirs)
        by_option = pool.submit(
            run, *s3, "-o", f"endpoint_url=http://127.0.0.1:{option_port}", env=ours
        )
    assert by_url.result().returncode == 0, by_url.result().stderr
    assert json.loads(by_url.result().stdout)["url"] == str(store.root)
    # A store out of reach: the flag that sets how long to keep trying is named.
    one_line_error(by_ours.result(), 1, f"127.0.0.1:{env_port}", "--store-timeout")
    one_line_error(by_theirs.result(), 1, f"127.0.0.1:{aws_port}")
    line = one_line_error(by_option.result(), 1, f"127.0.0.1:{option_port}")
    assert str(env_port) not in line
    one_line_error(run("inspect"), 2, "no store URL", "S3STREAM_URL")
    one_line_error(run("take-over", str(store.root)), 2, "s3stream take-over URL NODE")


def test_a_missing_directory_is_named_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    results = run_all(
        ["inspect", str(missing)],
        ["verify", str(missing)],
        ["dump", str(missing), "0"],
        ["compact", str(missing), "--nice", "0"],
        ["take-over", str(missing), "n1"],
    )
    for result in results:
        one_line_error(result, 2, str(missing), "does not exist")
    assert not missing.exists()


def test_url_typos_are_named_by_the_command(tmp_path: Path) -> None:
    results = run_all(
        ["verify", "s3:/oops"],
        ["inspect", "memory:/"],
        ["dump", "file:/tmp/x", "0"],
        ["compact", "~no_such_user_s3stream/x", "--nice", "0"],
        cwd=tmp_path,
    )
    one_line_error(results[0], 2, "'s3://oops'")
    one_line_error(results[1], 2, "'memory://'")
    one_line_error(results[2], 2, "'file:///tmp/x'")
    one_line_error(results[3], 2, "no_such_user_s3stream")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# URLs in the library: typos rejected, ``~`` expanded for the objects and the WAL alike


@pytest.mark.parametrize("url", ["s3:/bucket", "s3:bucket", "memory:/", "memory:", "file:/tmp/x"])
def test_a_url_without_its_slashes_is_refused_not_made_a_directory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match="did you mean"):
        s3stream.open(url)
    with pytest.raises(InvalidArgumentError, match="did you mean"):
        s3stream.open_reader(url)
    assert list(tmp_path.iterdir()) == []
    # The way to a directory of that odd name stays open.
    with s3stream.open(f"./{url}", wal="memory://") as client:
        client.create_stream()
    assert (tmp_path / url).is_dir()


def test_home_is_expanded_for_the_objects_and_the_wal_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    for url in ("~/x", "file://~/x"):
        with s3stream.open(url) as client:
            client.create_stream().append(RecordBatch(b"at home"))
        wal = default_wal_url(url, "local")
        assert wal is not None and wal.startswith((home / "x" / "wal").as_uri())
    assert (home / "x" / "wal" / "local.wal").is_file()
    assert any((home / "x" / "data").rglob("*.s3o"))
    assert list(cwd.iterdir()) == []
    with pytest.raises(InvalidArgumentError, match="no home directory"):
        s3stream.open("~no_such_user_s3stream/x")


# ---------------------------------------------------------------------------------------------
# inspect, dump, verify


def test_inspect_shows_streams_and_objects_as_tables_and_json(store: Store) -> None:
    human, with_objects, as_json = run_all(
        ["inspect", str(store.root)],
        ["inspect", str(store.root), "--objects"],
        ["inspect", str(store.root), "--json", "--objects"],
    )
    assert human.returncode == 0 and human.stderr == "", human.stderr
    facts = json.loads(as_json.stdout)
    assert set(facts) == {
        "url", "metadata_seq", "streams", "objects", "object_bytes",
        "objects_awaiting_deletion", "bytes_awaiting_deletion", "object_list",
    }  # fmt: skip
    with s3stream.open_reader(store.root) as reader:
        objects = reader.objects()
        infos = reader.list_streams()
    live = [o for o in objects if o.live]
    doomed = [o for o in objects if not o.live]
    assert doomed, "the fixture's compaction left objects awaiting deletion"
    assert (facts["objects"], facts["object_bytes"]) == (len(live), sum(o.size for o in live))
    assert facts["objects_awaiting_deletion"] == len(doomed)
    assert facts["bytes_awaiting_deletion"] == sum(o.size for o in doomed)
    assert [s["id"] for s in facts["streams"]] == [i.stream_id for i in infos] == [0, 1, 2]
    orders, audit, live_stream = facts["streams"]
    assert (orders["start"], orders["end"], orders["state"]) == (0, ORDERS, "closed")
    assert orders["tags"] == {"topic": "orders", "partition": "0"} and orders["owner"] is None
    assert (audit["end"], audit["tags"]) == (9, {"topic": "audit"})  # 3 batches of 3 records
    assert (live_stream["state"], live_stream["owner"]) == ("open", "writer")
    assert all(s["bytes"] > 0 for s in facts["streams"])
    assert sum(s["bytes"] for s in facts["streams"]) <= facts["object_bytes"]
    assert {o["key"] for o in facts["object_list"]} == {o.key for o in objects}

    lines = human.stdout.splitlines()
    objects_said = f"{len(live)} live object{'' if len(live) == 1 else 's'}"
    assert lines[0] == (
        f"{store.root}: 3 streams (1 open), {objects_said}, metadata log entry "
        f"{facts['metadata_seq']}"
    )
    assert lines[2].split() == ["STREAM", "STATE", "OWNER", "EPOCH", "START", "END", "SIZE",
                                "TAGS"]  # fmt: skip
    rows = {int(line.split()[0]): line.split() for line in lines[3:6]}
    assert rows[0][1:6] == ["closed", "-", str(orders["epoch"]), "0", str(ORDERS)]
    assert rows[0][-2:] == ["partition=0,", "topic=orders"]
    assert rows[2][1:3] == ["open", "writer"]
    objects_table = "\n".join(lines[6:])
    assert re.search(rf"^live\s+{len(live)}\s", objects_table, re.M)
    assert re.search(rf"^awaiting deletion\s+{len(doomed)}\s", objects_table, re.M)
    assert all(o.key in with_objects.stdout for o in objects)
    assert not any(o.key in human.stdout for o in objects)


def test_dump_honours_limit_and_start(store: Store) -> None:
    url = str(store.root)
    three, table, tail, past, nowhere = run_all(
        # Options between the positionals (the URL is optional: "0" was refused as extra).
        ["dump", url, "--limit", "3", "-o", "fsync=false", "0", "--json"],
        ["dump", url, "0", "--limit", "3"],
        ["dump", url, "0", "--start", "1000", "--limit", "0", "--json"],
        ["dump", url, "0", "--start", "99999"],
        ["dump", url, "42"],
    )
    batches = [json.loads(line) for line in three.stdout.splitlines()]
    assert [b["base_offset"] for b in batches] == [0, 1, 2]
    assert set(batches[0]) == {"base_offset", "count", "timestamp", "bytes", "properties"}
    assert batches[0]["properties"] == {"i": "0"} and batches[0]["bytes"] == 40
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["OFFSET", "RECORDS"] and len(lines) == 5
    assert [line.split()[0] for line in lines[1:4]] == ["0", "1", "2"]
    assert "--start 3" in lines[4]
    offsets = [json.loads(line)["base_offset"] for line in tail.stdout.splitlines()]
    assert offsets == list(range(1000, ORDERS))
    one_line_error(past, 2, "past the end", str(ORDERS))
    one_line_error(nowhere, 2, "42")


def test_verify_reports_as_text_or_json_and_fails_on_damage(store: Store, tmp_path: Path) -> None:
    copy, _ = store.copy(tmp_path / "damaged")
    with s3stream.open_reader(copy) as reader:
        (victim,) = [o for o in reader.objects() if o.live and o.ranges[0][0] == 0][:1]
    data = bytearray((copy / victim.key).read_bytes())
    data[100] ^= 0xFF  # inside the first data block of stream 0
    (copy / victim.key).write_bytes(bytes(data))
    healthy, healthy_json, damaged, damaged_json = run_all(
        ["verify", str(store.root)],
        ["verify", str(store.root), "--json"],
        ["verify", str(copy)],
        ["verify", str(copy), "--json"],
    )
    assert healthy.returncode == 0 and healthy.stderr == "", healthy.stdout + healthy.stderr
    assert healthy.stdout.splitlines()[-1].startswith("verify: OK (3 streams")
    facts = json.loads(healthy_json.stdout)
    assert (facts["ok"], facts["problems"], facts["wal_problems"]) == (True, 0, 0)
    assert facts["metadata"]["loaded"] and facts["metadata"]["problems"] == []
    assert [(s["id"], s["ok"]) for s in facts["streams"]] == [(0, True), (1, True), (2, True)]
    assert facts["streams"][0]["batches"] == ORDERS
    assert any("writer.wal" in line for line in facts["wals"])
    assert damaged.returncode == 1, damaged.stdout
    assert "stream 0: FAILED" in damaged.stdout and "Traceback" not in damaged.stderr
    assert damaged.stdout.splitlines()[-1] == "verify: FAILED: 1 problem (see above)"
    bad = json.loads(damaged_json.stdout)
    assert damaged_json.returncode == 1 and not bad["ok"] and bad["problems"] == 1
    assert [s["ok"] for s in bad["streams"]] == [False, True, True]


def test_a_closed_pipe_ends_the_output_quietly(store: Store) -> None:
    """``| head -1`` mid-output (the JSON of 1,500 batches overflows the pipe), and a reader
    gone before anything is written (``verify`` and ``inspect`` write at the end): no
    traceback, exit 0 or 141 as other UNIX tools."""
    url = str(store.root)
    writer = subprocess.Popen(
        [sys.executable, "-m", "s3stream", "dump", url, "0", "--limit", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    head = subprocess.Popen(["head", "-1"], stdin=writer.stdout, stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()  # head is the only reader: when it exits, the pipe has none
    first, _ = head.communicate(timeout=120)
    err = writer.stderr.read()
    writer.stderr.close()
    assert writer.wait(timeout=120) in (0, 141)
    assert err == b""
    assert json.loads(first)["base_offset"] == 0

    def into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            return subprocess.run(
                [sys.executable, "-m", "s3stream", *args],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
                timeout=120,
                check=False,
            )
        finally:
            os.close(write_end)

    with ThreadPoolExecutor(3) as pool:
        results = list(
            pool.map(
                lambda argv: into_closed_pipe(*argv),
                [["verify", url], ["inspect", url, "--objects"], ["dump", url, "1"]],
            )
        )
    for result in results:
        assert result.returncode in (0, 141) and result.stderr == "", result.stderr


# ---------------------------------------------------------------------------------------------
# compact, take-over


def test_compact_reports_as_json(store: Store, tmp_path: Path) -> None:
    copy, _ = store.copy(tmp_path / "copy")
    result = run("compact", str(copy), "--json", "--nice", "0", "--deletion-delay-ms", "0")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert {"objects_before", "objects_after", "bytes_read", "bytes_written", "tasks",
            "objects_purged", "orphans_deleted", "duration_s"} <= set(report)  # fmt: skip
    assert report["objects_purged"] >= 1  # those awaiting deletion, with no delay left


def test_take_over_commits_the_wal_of_a_killed_writer(store: Store, tmp_path: Path) -> None:
    copy, wal = store.copy(tmp_path / "copy")
    lost, _ = store.copy(tmp_path / "lost")
    accepted, _ = store.copy(tmp_path / "accepted")
    gone = f"{(lost / 'wal' / 'gone.wal').as_uri()}?capacity=1MiB"
    also_gone = f"{(accepted / 'wal' / 'gone.wal').as_uri()}?capacity=1MiB"
    taken, failed, accepting, odd, own = run_all(
        ["take-over", str(copy), "writer", "--wal", wal],
        ["take-over", str(lost), "writer", "--wal", gone],
        ["take-over", str(accepted), "writer", "--wal", also_gone, "--accept-wal-loss"],
        ["take-over", str(lost), "../writer"],
        ["take-over", str(lost), "failover"],
    )
    # The flag its loss error names (it named only accept_wal_loss=True, which no flag took).
    assert accepting.returncode == 0, accepting.stderr
    assert json.loads(accepting.stdout)["released_streams"] == [2]
    # An odd node id is told as such (it was "not registered"); the tool's own id too.
    one_line_error(odd, 2, "NODE must be", "'../writer'")
    one_line_error(own, 2, "this tool's own node id", "--node-id")
    assert taken.returncode == 0 and taken.stderr == "", taken.stderr
    report = json.loads(taken.stdout)
    assert report["released_streams"] == [2] and report["uploaded_batches"] == 1
    dumped = run("dump", str(copy), "2", "--json")
    assert [json.loads(line)["base_offset"] for line in dumped.stdout.splitlines()] == [0, 1]
    # A WAL that is gone while its node has streams open: damage, exit 1, one line.
    one_line_error(failed, 1, "gone.wal", "still has streams open", "--accept-wal-loss")


# ---------------------------------------------------------------------------------------------
# Progress bars: on a terminal, moving within a task; never off one


def _one_task_store(root: Path) -> None:
    """Two stream-set objects of 2 MiB that one compaction task merges."""
    rng = random.Random(0)
    with s3stream.open(root, wal="memory://", settings=ClientSettings()) as client:
        streams = [client.create_stream() for _ in range(4)]
        for _ in range(2):
            for s in streams:
                for _ in range(8):
                    s.append(RecordBatch(rng.randbytes(64 << 10)))
            client.flush()


def test_compaction_progress_moves_within_a_task(tmp_path: Path) -> None:
    _one_task_store(tmp_path / "lib")
    calls: list[tuple[int, int, str]] = []
    with s3stream.open(tmp_path / "lib", wal="memory://") as client:
        report = client.compact(lambda done, total, what: calls.append((done, total, what)))
    assert sum(report.tasks.values()) == 1
    merging = [(d, t) for d, t, what in calls if what == "stream-set compaction"]
    assert merging[0][0] == 0 and merging[-1][0] == merging[-1][1] > 0
    within = {d for d, t in merging if 0 < d < t}
    assert len(within) >= 4, merging  # every GET and every MiB copied
    assert [d for d, _ in merging] == sorted(d for d, _ in merging)


def test_progress_bars_show_on_a_terminal_only(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    _one_task_store(tmp_path / "cli")
    copy, wal = store.copy(tmp_path / "copy")
    # 8 MiB of work (4 read, 4 written) at 8 MiB/s: the bar is drawn at each step of it.
    status, out, shown = on_a_terminal(
        "compact", str(tmp_path / "cli"), "--nice", "0", "--bytes-per-s", str(8 << 20), "--json"
    )
    assert status == 0, shown
    assert sum(json.loads(out)["tasks"].values()) == 1
    assert len([p for p in percents(shown) if 0 < p < 100]) >= 3, shown
    assert "stream-set compaction" in shown
    status, out, shown = on_a_terminal("verify", str(store.root))
    assert status == 0 and "verifying" in shown and "stream 0:" in out
    status, out, shown = on_a_terminal("verify", str(store.root), "--no-progress")
    assert status == 0 and shown == ""
    status, out, shown = on_a_terminal("demo", str(tmp_path / "d"), "--batches", "200")
    assert status == 0 and "appending" in shown and "demo OK" in out
    status, out, shown = on_a_terminal("take-over", str(copy), "writer", "--wal", wal)
    assert status == 0 and "taking over writer" in shown


def test_inspect_cost_prices_what_the_store_holds(store: Store) -> None:
    human, as_json = run_all(
        ["inspect", str(store.root), "--cost"], ["inspect", str(store.root), "--cost", "--json"]
    )
    assert human.returncode == 0 and "per month at aws-s3-standard-us-east-1" in human.stdout
    cost = json.loads(as_json.stdout)["cost"]
    on_disk = [p for p in store.root.rglob("*") if p.is_file()]
    assert cost["stored_bytes"] == sum(p.stat().st_size for p in on_disk)
    with s3stream.open_reader(store.root) as reader:
        objects = reader.objects()
    assert cost["live_bytes"] == sum(o.size for o in objects if o.live)
    assert cost["deleting_bytes"] == sum(o.size for o in objects if not o.live)
    gib_month = cost["stored_bytes"] / (1 << 30) * 0.023
    assert cost["storage_usd_per_month"] == pytest.approx(gib_month, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Settings from the environment and the flags; units; what a URL must hold; live nodes


def _four_objects(root: Path) -> None:
    """One stream of four objects of about 100 KB: retention by bytes has some to drop."""
    with s3stream.open(root, wal="memory://", environ={}) as client:
        stream = client.create_stream()
        for _ in range(4):
            stream.append(RecordBatch(b"x" * 100_000))
            client.flush()


def test_settings_come_from_flags_then_the_environment(store: Store, tmp_path: Path) -> None:
    """Every command reads S3STREAM_* as `s3stream.open` does, and a flag wins over it: the
    commands once gave every setting themselves, so the environment was checked and lost."""
    _four_objects(tmp_path / "retained")
    first, second = store.copy(tmp_path / "a")[0], store.copy(tmp_path / "b")[0]
    compact = ["compact", "--json", "--nice", "0"]
    retained, by_env, by_flag = run_all(
        [*compact, str(tmp_path / "retained"), "--deletion-delay-ms", "0"],
        [*compact, str(first)],
        [*compact, str(second), "--deletion-delay-ms", "0"],
        env={
            **ENV,
            "S3STREAM_COMPACTION__RETENTION_BYTES": "150KiB",
            "S3STREAM_COMPACTION__DELETION_DELAY_MS": "0",
        },
    )
    assert json.loads(retained.stdout)["streams_trimmed"] == 1, retained.stderr
    # The objects awaiting deletion go with the environment's delay of 0.
    assert json.loads(by_env.stdout)["objects_purged"] >= 1, by_env.stderr
    assert json.loads(by_flag.stdout)["objects_purged"] >= 1, by_flag.stderr
    third = store.copy(tmp_path / "c")[0]
    kept = run(
        *compact, str(third), "--deletion-delay-ms", "1h",
        env={**ENV, "S3STREAM_COMPACTION__DELETION_DELAY_MS": "0"},
    )  # fmt: skip
    assert json.loads(kept.stdout)["objects_purged"] == 0, kept.stderr  # the flag won
    # A bad value is refused by every command that opens a store, the read-only ones too.
    url = str(store.root)
    bad = {**ENV, "S3STREAM_STORE_TIMEOUT_MS": "banana", "S3STREAM_METADATA": ""}
    for result in run_all(["inspect", url], ["verify", url], ["dump", url, "0"], env=bad):
        one_line_error(result, 2, "S3STREAM_STORE_TIMEOUT_MS", "banana")
    # The environment's store timeout bounds a call to an endpoint out of reach.
    pytest.importorskip("boto3")
    closed = {
        **ENV,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "S3STREAM_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "S3STREAM_STORE_TIMEOUT_MS": "1s",
    }
    one_line_error(run("inspect", "s3://bucket/prefix", env=closed), 1, "deadline_s=1.0")


def test_numeric_options_take_the_units_of_the_settings(store: Store, tmp_path: Path) -> None:
    copy, _ = store.copy(tmp_path / "copy")
    compacted, demo, inspected, ambiguous, fraction = run_all(
        ["compact", str(copy), "--json", "--nice", "0", "--bytes-per-s", "1MiB",
         "--deletion-delay-ms", "0s", "--orphan-grace-ms", "1h", "--store-timeout", "2s"],
        ["demo", str(tmp_path / "d"), "--batches", "4", "--batch-bytes", "2KiB"],
        ["inspect", str(store.root), "--store-timeout", "0.5"],  # seconds, as it always took
        ["compact", str(copy), "--bytes-per-s", "8MB"],
        ["compact", str(copy), "--deletion-delay-ms", "1.5s"],
    )  # fmt: skip
    assert compacted.returncode == 0, compacted.stderr
    assert json.loads(compacted.stdout)["objects_purged"] >= 1
    assert demo.returncode == 0 and "of 2,048 B" in demo.stdout, demo.stderr
    assert inspected.returncode == 0, inspected.stderr
    assert ambiguous.returncode == 2 and "8MiB" in ambiguous.stderr, ambiguous.stderr
    assert fraction.returncode == 2 and "1.5s" in fraction.stderr, fraction.stderr
    # A number of seconds too large for milliseconds was an OverflowError traceback.
    huge = run("inspect", str(store.root), "--store-timeout", "1e308")
    assert huge.returncode == 2 and "must be > 0 and finite" in huge.stderr, huge.stderr
    # Its own rule (a bare number is seconds), not the settings' (milliseconds: "30000").
    word, nostream = run_all(
        ["inspect", str(store.root), "--store-timeout", "abc"], ["dump", str(store.root)]
    )
    assert word.returncode == 2 and "bare number of seconds" in word.stderr, word.stderr
    assert "milliseconds" not in word.stderr
    assert nostream.returncode == 2 and "is the stream id missing?" in nostream.stderr


def test_ctrl_c_while_the_demo_probes_an_unreachable_store_exits_130(tmp_path: Path) -> None:
    """The demo defers its first Ctrl-C to its own checks, and its look at the target (a
    store probe retrying a refused endpoint for ~20 s) had none: the Ctrl-C waited for it,
    and the command then exited 1 with the endpoint's error."""
    env = {
        **ENV,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "S3STREAM_ENDPOINT_URL": "http://127.0.0.1:9",  # the discard port: refused
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "s3stream", "demo", "s3://bucket/demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(2.0)  # imported, and retrying the refused endpoint
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert took < 5, took


def test_a_prefix_or_memory_url_without_a_store_is_refused(
    moto_s3: LoopbackS3Server, tmp_path: Path
) -> None:
    """A typo in an S3 prefix is refused as a missing directory is (exit 2), and nothing is
    written there; memory:// never holds a store for a command to look at."""
    creds = {"AWS_ACCESS_KEY_ID": moto_s3.access_key, "AWS_SECRET_ACCESS_KEY": moto_s3.secret_key}
    env = {**ENV, **creds, "S3STREAM_ENDPOINT_URL": moto_s3.endpoint_url}
    prefix = f"nothing-here-{random.randrange(1 << 30)}"
    url = f"s3://{moto_s3.bucket}/{prefix}"
    for result in run_all(
        ["inspect", url], ["verify", url], ["dump", url, "0"],
        ["compact", url, "--nice", "0"], ["take-over", url, "n1"], env=env,
    ):  # fmt: skip
        one_line_error(result, 2, url, "holds no s3stream store")
    listed = moto_s3.client().list_objects_v2(Bucket=moto_s3.bucket, Prefix=prefix)
    assert listed.get("KeyCount", 0) == 0, listed
    for result in run_all(["inspect", "memory://"], ["compact", "memory://", "--nice", "0"]):
        one_line_error(result, 2, "memory://", "lives only as long as")
    # A prefix that holds a store is opened as before.
    there = f"s3://{moto_s3.bucket}/store-{random.randrange(1 << 30)}"
    with s3stream.open(there, wal="memory://", storage_options=moto_s3.storage_options()) as c:
        c.create_stream().append(RecordBatch(b"here"))
    inspected = run("inspect", there, "--json", env=env)
    assert inspected.returncode == 0, inspected.stderr
    assert len(json.loads(inspected.stdout)["streams"]) == 1
    # The demo does not make its store beside somebody else's objects (it did, exit 0; a
    # directory holding them was refused).
    theirs = f"theirs-{random.randrange(1 << 30)}"
    moto_s3.client().put_object(Bucket=moto_s3.bucket, Key=f"{theirs}/important.csv", Body=b"1")
    beside = run("demo", f"s3://{moto_s3.bucket}/{theirs}", env=env)
    one_line_error(beside, 2, "important.csv", "not an s3stream store")
    listed = moto_s3.client().list_objects_v2(Bucket=moto_s3.bucket, Prefix=theirs)
    assert [o["Key"] for o in listed["Contents"]] == [f"{theirs}/important.csv"]


def test_take_over_refuses_a_live_node_unless_forced(tmp_path: Path) -> None:
    root = tmp_path / "store"
    wal = f"{(root / 'wal' / 'writer.wal').as_uri()}?capacity=1MiB"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), wal], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "acked"
        log = sorted((root / "meta" / "log").rglob("*"))
        refused = run("take-over", str(root), "writer", "--wal", wal)
        one_line_error(refused, 2, "'writer' is alive", f"process {child.pid}", "--force")
        assert sorted((root / "meta" / "log").rglob("*")) == log  # nothing fenced, no entry
        forced = run("take-over", str(root), "writer", "--wal", wal, "--force")
        assert forced.returncode == 0, forced.stderr
        assert json.loads(forced.stdout)["released_streams"] == [0]
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_version_and_counts_read_as_english(store: Store) -> None:
    version, dumped, verified = run_all(
        ["--version"], ["dump", str(store.root), "1", "--limit", "1"], ["verify", str(store.root)]
    )
    assert version.returncode == 0 and version.stdout == f"s3stream {s3stream.__version__}\n"
    assert "(first 1 batch;" in dumped.stdout, dumped.stdout
    assert verified.returncode == 0, verified.stdout
    assert "stream 1: 3 batches OK" in verified.stdout and " entries and " in verified.stdout
    assert not re.search(r"\b1 (batches|streams|objects|entries|records)\b", verified.stdout)


def test_an_ascii_terminal_and_a_huge_nice_give_no_traceback(tmp_path: Path) -> None:
    """A tag outside ASCII printed to an ASCII stdout raised UnicodeEncodeError, and
    ``--nice`` past a C int raised OverflowError: both tracebacks."""
    root = tmp_path / "store"
    with s3stream.open(root, wal="memory://") as client:
        client.create_stream(tags={"topic": "récords"})
    shown = run("inspect", str(root), env={**ENV, "PYTHONIOENCODING": "ascii"})
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "r\\xe9cords" in shown.stdout
    compacted = run("compact", str(root), "--nice", "99999999999999999999999")
    assert compacted.returncode == 0 and "Traceback" not in compacted.stderr, compacted.stderr


def test_control_characters_in_tags_and_properties_are_printed_escaped(tmp_path: Path) -> None:
    """Tags and batch properties are anybody's strings: printed raw, an escape sequence in
    one could clear the screen or fake a line of output. Tables and dumps show them as
    escapes; JSON output escapes them already."""
    root = tmp_path / "store"
    evil = "a\x1b[2J\nfake line\u202eb"
    with s3stream.open(root, wal="memory://") as client:
        s = client.create_stream(tags={"topic": evil})
        s.append(RecordBatch(b"x", properties={"k": evil}))
    shown, dumped, as_json = run_all(
        ["inspect", str(root)],
        ["dump", str(root), str(s.stream_id)],
        ["inspect", str(root), "--json"],
    )
    for out in (shown, dumped):
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\u202e" not in out.stdout
        assert "\n" + "fake line" not in out.stdout
        assert "a\\x1b[2J\\nfake line\\u202eb" in out.stdout, out.stdout
    assert json.loads(as_json.stdout)["streams"][0]["tags"] == {"topic": evil}


BUSY_WRITER = textwrap.dedent(
    """
    import sys, time
    import s3stream
    from s3stream import RecordBatch

    settings = {
        "file_wal.capacity_bytes": "4MiB",
        "upload_interval_ms": "200ms",
        "compaction.background": True,
        "compaction.interval_ms": "1s",
        "compaction.deletion_delay_ms": "0",
        "compaction.stream_set_min_objects": 2,
    }
    with s3stream.open(sys.argv[1], node_id="busy", settings=settings) as client:
        streams = [client.create_stream(tags={"topic": "live"}) for _ in range(3)]
        started, n = time.monotonic(), 0
        while time.monotonic() - started < float(sys.argv[2]):
            for s in streams:
                s.append(RecordBatch(b"x" * 300, count=2))
            n += 1
            if n == 6_000:
                print("ready", flush=True)  # the ring has wrapped: ~6 MB written
            if n % 50 == 0:
                for s in streams:
                    s.trim(max(s.start_offset, s.confirm_offset - 40))
    """
)


def test_verify_of_a_store_being_written_reports_no_damage(tmp_path: Path) -> None:
    """A live writer's WAL changes under `verify`'s scan, and its trims move streams' starts
    past `verify`'s reads: verify called a healthy store damaged in 24 of 25 runs. It now
    scans a live WAL again (and says when the writer kept it from judging) and follows a
    trimmed stream's new start."""
    root = tmp_path / "store"
    # Runs until killed below (the limit is a backstop): on a loaded machine its 60,000
    # appends before "ready" took more than the 40 s it had, and it ended without a word.
    writer = subprocess.Popen(
        [sys.executable, "-c", BUSY_WRITER, str(root), "600"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        for _ in range(4):
            result = run("verify", str(root), "--no-progress")
            assert result.returncode == 0, (result.stdout, result.stderr)
            assert "DAMAGED" not in result.stdout and "FAILED" not in result.stdout
    finally:
        writer.kill()
        writer.wait(10)


@pytest.mark.s3
def test_verify_names_a_file_wal_holding_another_stores_records(
    store: Store, tmp_path: Path
) -> None:
    """`verify --wal` of another store's WAL, holding records an open or a take-over of this
    store refuses: it said "OK" (exit 0), while `take-over` refused the same file."""
    wal_path = store.writer_wal.removeprefix("file://").partition("?")[0]
    unknown = tmp_path / "unknown"  # no node 'writer' at all
    with s3stream.open(unknown, wal="memory://") as c:
        c.create_stream()
    other = tmp_path / "other"  # a node 'writer' of its own, with another WAL
    own_wal = f"{(tmp_path / 'own.wal').as_uri()}?capacity_bytes=1MiB"
    with s3stream.open(other, node_id="writer", wal=own_wal) as c:
        c.create_stream()
    quiet = tmp_path / "quiet"  # a node 'writer' that never opened a stream: no WAL recorded
    s3stream.open(quiet, node_id="writer", wal="memory://").close()
    for root, why in (
        (unknown, "does not know"),
        (other, "is not the WAL this store"),
        (quiet, "no stream open and no WAL recorded"),
    ):
        verified = run("verify", str(root), "--wal", wal_path)
        assert verified.returncode == 1, (verified.stdout, verified.stderr)
        assert "NOT THIS STORE'S" in verified.stdout and why in verified.stdout, verified.stdout
    # Its own store finds it healthy, with records for the node's next open or a take-over.
    copy, wal = store.copy(tmp_path / "copy")
    own = run("verify", str(copy), "--wal", wal.removeprefix("file://").partition("?")[0])
    assert own.returncode == 0, own.stdout
    assert "OK, not closed; its records are uploaded by the node's next open" in own.stdout


def test_an_extra_argument_is_refused_with_the_commands_usage(tmp_path: Path) -> None:
    """`inspect DIR extra` printed the top-level usage (the list of commands)."""
    for argv in (["inspect", str(tmp_path), "extra"], ["dump", str(tmp_path), "0", "--bogus"]):
        done = run(*argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"usage: s3stream {argv[0]} "), done.stderr
        assert f"s3stream {argv[0]}: error: unrecognized arguments: {argv[-1]}" in done.stderr


def test_the_advice_of_errors_can_be_followed(store: Store, tmp_path: Path) -> None:
    """Errors whose advice led nowhere: a query on a local store's URL read as a missing
    directory; `demo` on a folder of other files advised --reuse, which it then refused;
    `verify --wal` took a file:// URL (which `take-over --wal` takes) for a relative path;
    `take-over` with no --wal advised leaving the WAL out."""
    copy, wal = store.copy(tmp_path / "copy")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    query, demo, verified, taken = run_all(
        ["inspect", f"{copy.as_uri()}?x=1"],
        ["demo", str(other), "--batches", "1"],
        ["verify", str(copy), "--wal", wal],
        ["take-over", str(copy), "local"],  # a node whose default WAL place holds nothing
    )
    one_line_error(query, 2, "takes no query")
    assert "--reuse" not in one_line_error(demo, 2, "holds other files", "'notes.txt'")
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    assert f"wal {wal.removeprefix('file://').partition('?')[0]} (node 'writer')" in (
        verified.stdout
    )
    assert "leave the WAL out" not in one_line_error(taken, 2, "name the node's WAL")
    assert sorted(os.listdir(other)) == ["notes.txt"]


def test_verify_names_an_object_wal_holding_another_stores_records(
    seaweedfs: LoopbackS3Server,
) -> None:
    """Store B was given store S's default object WAL and died with appends in it: S's
    `verify` said OK, and S's node then failed to open. It reports the WAL as not S's now."""
    opts = seaweedfs.storage_options()
    run_id = random.randrange(1 << 30)
    s_url, b_url = (f"s3://{seaweedfs.bucket}/{name}-{run_id}" for name in ("s", "b"))
    with s3stream.open(s_url, node_id="n1", storage_options=opts) as c:
        c.create_stream().append(RecordBatch(b"S's"))
    b = s3stream.open(b_url, node_id="n1", wal=f"{s_url}/wal", storage_options=opts)
    b.create_stream().append(RecordBatch(b"B's"))
    b._storage.abandon()  # crash before any upload
    b._wal._abandon()  # type: ignore[attr-defined]
    creds = {
        "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key,
    }
    env = {**ENV, **creds, "S3STREAM_ENDPOINT_URL": seaweedfs.endpoint_url}
    verified = run("verify", s_url, env=env)
    assert verified.returncode == 1, (verified.stdout, verified.stderr)
    assert "NOT THIS STORE'S" in verified.stdout and "1 record" in verified.stdout
