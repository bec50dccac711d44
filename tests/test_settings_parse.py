"""One way to give settings: `s3stream.settings_parse` reads mappings, WAL URL queries and
``S3STREAM_*`` variables by the same names and rules; `s3stream.open` layers them (URL query >
explicit arguments > environment > defaults) and a take-over opens a WAL with the client's WAL
settings. Also: validators, units and scheme checks defined once."""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    CompactionSettings,
    FileWalSettings,
    InvalidArgumentError,
    ObjectWalSettings,
    RecordBatch,
    StreamClient,
)
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.registry import register_object_store
from s3stream.opening import resolve_settings
from s3stream.settings_parse import (
    env_var,
    parse_bool,
    parse_duration_ms,
    parse_int,
    parse_size,
    setting_names,
    settings_from_environ,
    settings_from_mapping,
    settings_from_query,
)
from s3stream.units import GiB, KiB, MiB, TiB
from s3stream.validation import check_number
from s3stream.wal import registry as wal_registry
from s3stream.wal.memory import MemoryWal
from s3stream.wal.object import ObjectWal
from s3stream.wal.registry import open_wal, register_wal

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- value rules


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("65536", 65536),
        ("64KiB", 64 * KiB),
        ("64kib", 64 * KiB),
        (" 8 MiB ", 8 * MiB),
        ("2GiB", 2 * GiB),
        ("1TiB", TiB),
    ],
)
def test_sizes_are_bytes_or_1024_based_units(text: str, expected: int) -> None:
    assert parse_size(text, name="x") == expected


@pytest.mark.parametrize("text", ["1k", "64K", "8MB", "2G", "1 GB", "3t"])
def test_decimal_looking_size_units_are_refused_as_ambiguous(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"max_group_bytes: .* is ambiguous.*iB"):
        parse_size(text, name="max_group_bytes")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1",
        "1.5GiB",
        "lots",
        "1e6",
        "1_000",
        "0x10",
        "9" * 40,
        "\u0661\u0662",
        "\uff11\uff12",
        "1\u0662KiB",
    ],
)
def test_malformed_sizes_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="capacity_bytes must be a size"):
        parse_size(text, name="capacity_bytes")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("30000", 30000), ("250ms", 250), ("30s", 30000), ("5min", 300000), ("1h", 3600000)],
)
def test_durations_are_milliseconds_or_units(text: str, expected: int) -> None:
    assert parse_duration_ms(text, name="x") == expected


@pytest.mark.parametrize("text", ["1k", "1.5s", "5m", "-1", "", "1KiB", "soon", "\u0665s"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="full_wait_ms must be a duration"):
        parse_duration_ms(text, name="full_wait_ms")


def test_ints_and_bools() -> None:
    assert parse_int("4") == 4 and parse_int("-5") == -5 and parse_int(" +7 ") == 7
    for bad in ("1k", "1_000", "1e3", "", "4.0", "\u0661\u0662"):
        with pytest.raises(InvalidArgumentError, match="n must be a whole number"):
            parse_int(bad, name="n")
    for text in ("1", "true", "YES", "On"):
        assert parse_bool(text) is True
    for text in ("0", "false", "No", "OFF"):
        assert parse_bool(text) is False
    with pytest.raises(InvalidArgumentError, match="b must be true or false"):
        parse_bool("maybe", name="b")


# ----------------------------------------------------------------------------- names


def test_every_setting_has_a_rule_and_the_docs_list_them_all() -> None:
    names = setting_names(ClientSettings)
    assert "compaction.stream_set_split_bytes" in names and "file_wal.capacity_bytes" in names
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = doc.split("## All settings", 1)[1]
    listed = re.findall(r"^\| `([a-z_.]+)` \|", table, re.MULTILINE)
    declared = _declared_order(ClientSettings)
    assert listed == declared, "list every setting in docs/configuration.md, in field order"
    assert sorted(declared) == names


def _declared_order(cls: type, prefix: str = "") -> list[str]:
    out: list[str] = []
    sections = {
        "compaction": CompactionSettings,
        "file_wal": FileWalSettings,
        "object_wal": ObjectWalSettings,
    }
    for f in dataclasses.fields(cls):
        if f.name in sections and cls is ClientSettings:
            out.extend(_declared_order(sections[f.name], f"{f.name}."))
        else:
            out.append(prefix + f.name)
    return out


def test_env_var_names() -> None:
    assert env_var("upload_threshold_bytes") == "S3STREAM_UPLOAD_THRESHOLD_BYTES"
    assert env_var("compaction.interval_ms") == "S3STREAM_COMPACTION__INTERVAL_MS"


# ----------------------------------------------------------------------------- sources


def test_a_mapping_takes_dotted_names_nested_mappings_and_typed_values() -> None:
    got = settings_from_mapping(
        ClientSettings,
        {
            "upload_threshold_bytes": "16MiB",
            "max_pending_bytes": 64 << 20,
            "compaction.background": "on",
            "compaction": {"interval_ms": "5min"},
            "file_wal": {"full_wait_ms": "5s", "direct_io": True},
            "zstd_level": "-5",
        },
    )
    assert got.upload_threshold_bytes == 16 * MiB and got.max_pending_bytes == 64 * MiB
    assert got.compaction.background and got.compaction.interval_ms == 300_000
    assert got.file_wal == FileWalSettings(full_wait_ms=5000, direct_io=True)
    assert got.object_wal is None and got.zstd_level == -5


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"upload_treshold_bytes": 1}, r"unknown client setting .*did you mean 'upload_thres"),
        ({"compaction.intervl_ms": 1}, r"unknown compaction setting 'compaction\.intervl_ms'"),
        ({"file_wal": {"speed": 1}}, r"unknown file WAL setting 'file_wal\.speed'"),
        ({"upload_threshold_bytes.x": 1}, r"unknown client setting 'upload_threshold_bytes\.x'"),
        ({"compaction.interval_ms": 1, "compaction": {"interval_ms": 2}}, "given twice"),
        ({"compaction.interval_ms": "1k"}, r"settings\['compaction\.interval_ms'\] must be a dur"),
        ({"block_target_bytes": "4K"}, r"settings\['block_target_bytes'\]: '4K' is ambiguous"),
        ({"max_pending_bytes": "1KiB"}, r"settings: ClientSettings\.max_pending_bytes must be >="),
        ({"zstd_level": 3.0}, r"ClientSettings\.zstd_level"),
        ({"compaction": "fast"}, r"ClientSettings\.compaction must be a CompactionSettings"),
    ],
)
def test_a_mapping_names_the_setting_of_every_mistake(values: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        settings_from_mapping(ClientSettings, values)


def test_a_query_uses_the_field_names_and_still_takes_the_first_short_names() -> None:
    new = settings_from_query(
        FileWalSettings, "capacity_bytes=64KiB&direct_io=1&max_group_bytes=16KiB&full_wait_ms=5s"
    )
    old = settings_from_query(FileWalSettings, "capacity=64KiB&direct=1&max_group=16KiB")
    assert new == FileWalSettings(
        capacity_bytes=64 * KiB, direct_io=True, max_group_bytes=16 * KiB, full_wait_ms=5000
    )
    assert old == FileWalSettings(capacity_bytes=64 * KiB, direct_io=True, max_group_bytes=16 * KiB)
    objects = settings_from_query(ObjectWalSettings, "batch_interval_ms=5&wal_batch_max_bytes=1MiB")
    assert objects == ObjectWalSettings(wal_batch_interval_ms=5, wal_batch_max_bytes=MiB)
    with pytest.raises(InvalidArgumentError, match="'capacity_bytes' given twice"):
        settings_from_query(FileWalSettings, "capacity=1MiB&capacity_bytes=1MiB", url="u")
    # A query sets single fields over its base.
    base = FileWalSettings(full_wait_ms=7)
    assert settings_from_query(FileWalSettings, "direct_io=1", base=base).full_wait_ms == 7


@pytest.mark.parametrize("kind", ["file", "object"])
def test_full_wait_ms_1k_means_the_same_in_every_wal_url(tmp_path: Path, kind: str) -> None:
    """It used to be 1,024 ms in an object WAL URL and an error in a file WAL URL."""
    base = tmp_path.as_uri() + "/w"
    url = f"{base}.wal" if kind == "file" else f"object+{base}"
    clock = s3stream.SystemClock()
    with pytest.raises(InvalidArgumentError, match=r"full_wait_ms in URL .*must be a duration"):
        open_wal(f"{url}?full_wait_ms=1k", node_id="n1", clock=clock)
    wal = open_wal(f"{url}?full_wait_ms=2s", node_id="n1", clock=clock)
    try:
        assert wal._settings.full_wait_ms == 2000  # type: ignore[attr-defined]
        assert isinstance(wal, ObjectWal) == (kind == "object")
    finally:
        wal.close()


def test_the_environment_uses_the_same_names(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "S3STREAM_COMPACTION__INTERVAL_MS": "1h",
        "S3STREAM_FILE_WAL__DIRECT_IO": "yes",
        "S3STREAM_URL": "s3://not/a/setting",  # the CLI's: never reported
        "S3STREAM_MY_APP_THING": "1",  # someone else's: logged and skipped
        "PATH": "/bin",
    }
    with caplog.at_level(logging.WARNING, logger="s3stream.settings_parse"):
        got = settings_from_environ(ClientSettings, env)
    assert got.compaction.interval_ms == 3_600_000
    assert got.file_wal == FileWalSettings(direct_io=True)
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable S3STREAM_MY_APP_THING names no s3stream setting: ignored"
    ]
    with pytest.raises(InvalidArgumentError, match="did you mean S3STREAM_UPLOAD_THRESHOLD_BYTES"):
        settings_from_environ(ClientSettings, {"S3STREAM_UPLOAD_TRESHOLD_BYTES": "1MiB"})
    with pytest.raises(
        InvalidArgumentError,
        match=r"S3STREAM_FILE_WAL__FULL_WAIT_MS \(setting 'file_wal\.full_wait_ms'\) must be",
    ):
        settings_from_environ(ClientSettings, {"S3STREAM_FILE_WAL__FULL_WAIT_MS": "1k"})


def test_the_compactors_split_setting_has_its_own_name() -> None:
    assert ClientSettings().stream_split_bytes == 16 * MiB
    assert CompactionSettings().stream_set_split_bytes == 8 * MiB
    with pytest.warns(DeprecationWarning, match="stream_set_split_bytes"):
        assert CompactionSettings(stream_split_bytes=5).stream_set_split_bytes == 5
    with pytest.warns(DeprecationWarning, match="compaction.stream_set_split_bytes"):
        got = settings_from_mapping(ClientSettings, {"compaction.stream_split_bytes": "1MiB"})
    assert got.compaction.stream_set_split_bytes == MiB
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgumentError, match="not both"):
        CompactionSettings(stream_split_bytes=5, stream_set_split_bytes=6)


# ----------------------------------------------------------------------------- precedence


def test_explicit_arguments_win_over_the_environment_over_the_defaults() -> None:
    env = {"S3STREAM_UPLOAD_INTERVAL_MS": "10s", "S3STREAM_FILE_WAL__FULL_WAIT_MS": "2s"}
    assert resolve_settings(None, environ={}) == ClientSettings()
    from_env = resolve_settings(None, environ=env)
    assert from_env.upload_interval_ms == 10_000 and from_env.file_wal is not None
    assert from_env.file_wal.full_wait_ms == 2000
    # A mapping gives the settings it names, the environment the rest.
    mapped = resolve_settings({"upload_interval_ms": "1s", "zstd_level": 5}, environ=env)
    assert mapped.upload_interval_ms == 1000 and mapped.zstd_level == 5
    assert mapped.file_wal == FileWalSettings(full_wait_ms=2000)
    # An object gives every field, but a WAL section it leaves None is the environment's.
    obj = resolve_settings(ClientSettings(zstd_level=5), environ=env)
    assert obj.upload_interval_ms == 30_000 and obj.file_wal == FileWalSettings(full_wait_ms=2000)
    # The older per-WAL arguments give their whole section.
    older = resolve_settings(None, file_wal_settings=FileWalSettings(), environ=env)
    assert older.file_wal == FileWalSettings()
    with pytest.raises(InvalidArgumentError, match="give one"):
        resolve_settings(
            {"file_wal.direct_io": True}, file_wal_settings=FileWalSettings(), environ={}
        )
    with pytest.raises(InvalidArgumentError, match="give one"):
        resolve_settings(
            ClientSettings(object_wal=ObjectWalSettings()),
            object_wal_settings=ObjectWalSettings(),
            environ={},
        )
    # The default WAL of a local directory is smaller, unless something says otherwise.
    local = resolve_settings(None, environ={}, local_default_wal=True)
    assert local.file_wal == FileWalSettings(capacity_bytes=256 * MiB)
    sized = resolve_settings({"file_wal.full_wait_ms": 5}, environ={}, local_default_wal=True)
    assert sized.file_wal == FileWalSettings(capacity_bytes=256 * MiB, full_wait_ms=5)


def test_open_reads_the_environment_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"S3STREAM_UPLOAD_INTERVAL_MS": "1s", "S3STREAM_FILE_WAL__CAPACITY_BYTES": "1MiB"}
    with s3stream.open(tmp_path / "a", environ=env) as client:
        assert client._settings.upload_interval_ms == 1000
        client.create_stream().append(RecordBatch(b"x"))
    assert (tmp_path / "a" / "wal" / "local.wal").stat().st_size <= 2 * MiB
    # By default, os.environ when open is called; StreamClient never reads it.
    monkeypatch.setenv("S3STREAM_UPLOAD_INTERVAL_MS", "2s")
    with s3stream.open("memory://") as client:
        assert client._settings.upload_interval_ms == 2000
    with s3stream.open("memory://", environ={}) as client:
        assert client._settings.upload_interval_ms == 30_000
    with StreamClient(MemoryObjectStore(), MemoryWal()) as client:
        assert client._settings.upload_interval_ms == 30_000
    monkeypatch.setenv("S3STREAM_UPLOAD_INTERVAL_MS", "1k")
    with pytest.raises(InvalidArgumentError, match="S3STREAM_UPLOAD_INTERVAL_MS"):
        s3stream.open(tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_open_takes_settings_as_a_mapping(tmp_path: Path) -> None:
    settings = {"file_wal.capacity_bytes": "1MiB", "upload_threshold_bytes": "256KiB"}
    with s3stream.open(tmp_path, settings=settings, environ={}) as client:
        assert client._settings.upload_threshold_bytes == 256 * KiB
        client.create_stream().append(RecordBatch(b"x"))
    assert (tmp_path / "wal" / "local.wal").stat().st_size <= 2 * MiB


def test_take_over_opens_the_wal_with_the_clients_wal_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take-over's WAL factory used to drop the WAL settings the client was opened with
    (`client._wal_url_factory`, a copy of `opening._wal_factory`): one factory now."""
    root = tmp_path / "store"
    a = s3stream.open(root, node_id="A", environ={})
    stream = a.create_stream()
    for i in range(5):
        stream.append(RecordBatch(b"A:%d" % i))
    a._storage.abandon()  # crash: everything is only in A's WAL
    a._wal._abandon()  # type: ignore[attr-defined]
    seen: dict[str, FileWalSettings] = {}
    real = wal_registry.FileWal

    def spy(path: str, **kwargs: Any) -> Any:
        seen[kwargs["node_id"]] = kwargs["settings"]
        return real(path, **kwargs)

    monkeypatch.setattr(wal_registry, "FileWal", spy)
    settings = {"file_wal.full_wait_ms": "7s", "file_wal.recovery_read_bytes": "1MiB"}
    with s3stream.open(root, node_id="B", settings=settings, environ={}) as b:
        assert seen["B"].full_wait_ms == 7000
        wal_url = (root / "wal" / "A.wal").resolve().as_uri()
        report = b.take_over("A", wal=f"{wal_url}?max_group_bytes=64KiB&full_wait_ms=9s")
        assert report.recovery.uploaded_batches == 5
    # The client's WAL settings, the URL's query over them.
    assert seen["A"].recovery_read_bytes == MiB
    assert seen["A"].max_group_bytes == 64 * KiB and seen["A"].full_wait_ms == 9000


# ----------------------------------------------------------------------------- defined once


def test_scheme_checks_are_shared_by_the_registries() -> None:
    for register in (register_wal, register_object_store):
        for bad in ("S3", "s3\n", "", "3x", 5):
            with pytest.raises(InvalidArgumentError, match="scheme must be lower-case"):
                register(bad, "m:f")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="target must be a callable"):
            register("valid-scheme", "no colon")


def test_check_number() -> None:
    assert check_number("r", 0) == 0.0 and check_number("p", 1, maximum=1.0) == 1.0
    for bad in (True, "1", None, float("nan"), float("inf"), -0.5):
        with pytest.raises(InvalidArgumentError, match="r must be a"):
            check_number("r", bad)
    with pytest.raises(InvalidArgumentError, match=r"p must be a finite number in \[0, 1\]"):
        check_number("p", 1.5, maximum=1.0)


def test_units_and_validators_are_defined_once() -> None:
    """`s3stream.units` holds the size units and `s3stream.validation` the argument checks:
    no module defines its own copy again."""
    units = {"KiB", "MiB", "GiB", "TiB", "_MiB", "_GiB", "_KiB"}
    copies: list[str] = []
    for path in sorted((ROOT / "s3stream").rglob("*.py")):
        if path.name == "units.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                copies += [f"{path.name}: {n}" for n in names & units]
            if isinstance(node, ast.FunctionDef) and node.name in ("_check_rate", "_check_int"):
                copies.append(f"{path.name}: {node.name}")
    assert copies == []
