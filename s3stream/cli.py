"""The ``s3stream`` command: demo, inspect, dump, verify, compact, take-over.

Each subcommand is one small function.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from . import open as open_client
from .errors import CorruptionError, S3StreamError
from .reader import StreamReader, open_reader
from .types import AppendResult, RecordBatch

__all__ = ["main"]


def _payload(stream_index: int, seq: int, size: int) -> bytes:
    # Deterministic content so a reader can verify every byte without keeping a copy.
    seed = hashlib.blake2b(f"{stream_index}:{seq}".encode(), digest_size=16).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _demo(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if root.exists() and any(root.iterdir()) and not args.reuse:
        print(f"{root} is not empty; pass --reuse to add to it, or choose another directory")
        return 2
    n_streams, n_batches, size = args.streams, args.batches, args.batch_bytes
    print(f"s3stream demo: {n_streams} streams, {n_batches} batches of {size} B, in {root}")
    t0 = time.perf_counter()
    with open_client(str(root)) as client:
        streams = [
            client.create_stream(tags={"topic": "demo", "partition": str(i)})
            for i in range(n_streams)
        ]
        window: list[Future[AppendResult]] = []
        for seq in range(n_batches):
            i = seq % n_streams
            batch = RecordBatch(
                _payload(i, seq, size), count=1 + seq % 5, properties={"seq": str(seq)}
            )
            window.append(streams[i].append_async(batch))
            if len(window) >= 256:
                for f in window:
                    f.result()
                window.clear()
        for f in window:
            f.result()
        t_append = time.perf_counter() - t0
        ids = [s.stream_id for s in streams]
        records = sum(s.confirm_offset for s in streams)
        print(
            f"  appended {n_batches} batches ({records} records, {n_batches * size / 1e6:.1f} MB)"
            f" durably in {t_append:.2f} s: {n_batches / t_append:,.0f} batches/s, "
            f"{n_batches * size / 1e6 / t_append:.1f} MB/s"
        )
        t1 = time.perf_counter()
    t_close = time.perf_counter() - t1
    m = client.metrics
    print(
        f"  closed (uploaded everything) in {t_close:.2f} s: {m.storage.objects_uploaded} objects,"
        f" {m.object_store.puts} PUTs"
    )
    t2 = time.perf_counter()
    with open_client(str(root)) as reader:
        seen = 0
        for i, sid in enumerate(ids):
            stream = reader.open_stream(sid)
            offset, k = stream.start_offset, 0
            while offset < stream.confirm_offset:
                res = stream.fetch(offset, max_bytes=4 << 20)
                for b in res.batches:
                    seq = int(b.properties["seq"])
                    if seq % n_streams != i or b.payload != _payload(i, seq, size):
                        print(f"  MISMATCH in stream {sid} at offset {b.base_offset}")
                        return 1
                    k += 1
                offset = res.next_offset
            seen += k
    t_read = time.perf_counter() - t2
    if seen != n_batches:
        print(f"  read back {seen} batches, expected {n_batches}")
        return 1
    print(
        f"  reopened a new client and read back all {seen} batches byte-identical in "
        f"{t_read:.2f} s: {n_batches * size / 1e6 / t_read:.1f} MB/s"
    )
    print("demo OK")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    client = _open_ro(args)
    try:
        objects = client.objects()  # refreshes; everything below is of that one snapshot
        live = [o for o in objects if o.live]
        doomed = [o for o in objects if not o.live]
        out = {
            "metadata_seq": client.metadata.seq,
            "streams": [
                {
                    "id": s.stream_id,
                    "epoch": s.epoch,
                    "start": s.start_offset,
                    "end": s.end_offset,
                    "state": s.state.value,
                    "tags": dict(s.tags),
                }
                for s in client.metadata.list_streams()
            ],
            "objects": len(live),
            "object_bytes": sum(o.size for o in live),
            # Replaced by compaction or retention; deleted after the deletion delay.
            "objects_awaiting_deletion": len(doomed),
            "bytes_awaiting_deletion": sum(o.size for o in doomed),
        }
        print(json.dumps(out, indent=2))
    finally:
        client.close()
    return 0


def _dump(args: argparse.Namespace) -> int:
    client = _open_ro(args)
    try:
        info = client.stream_info(args.stream)
        offset = max(args.start, info.start_offset)
        shown = 0
        while offset < info.end_offset and shown < args.limit:
            res = client.read(args.stream, offset)
            for b in res.batches:
                print(
                    json.dumps(
                        {
                            "base_offset": b.base_offset,
                            "count": b.count,
                            "timestamp": b.base_timestamp,
                            "bytes": len(b.payload),
                            "properties": dict(b.properties),
                        }
                    )
                )
                shown += 1
            offset = res.next_offset
    finally:
        client.close()
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .metadata.audit import audit_log

    try:
        client = _open_ro(args)
    except CorruptionError as exc:
        print(f"metadata: FAILED to load: {exc}")
        return 1
    bad = 0
    try:
        audit = audit_log(client.metadata.log)
        for problem in audit.problems:
            print(f"metadata: {problem}")
        bad += len(audit.problems)
        print(
            f"metadata: {audit.entries} entries and {audit.checkpoints} checkpoints checked"
            + ("" if audit.ok else f", {len(audit.problems)} problems")
        )
        bad += _verify_wals(client, args)
        for info in client.list_streams():
            offset, batches = info.start_offset, 0
            try:
                while offset < info.end_offset:
                    res = client.read(info.stream_id, offset, max_bytes=8 << 20)
                    batches += len(res.batches)
                    offset = res.next_offset
                print(f"stream {info.stream_id}: {batches} batches OK")
            except S3StreamError as exc:
                bad += 1
                print(f"stream {info.stream_id}: FAILED at offset {offset}: {exc}")
    finally:
        client.close()
    return 1 if bad else 0


def _verify_wals(client: StreamReader, args: argparse.Namespace) -> int:
    """Check the WAL files a store's nodes use, read-only: those at a local store's default
    place, and any named with ``--wal``. The number of problems found."""
    from .failover import has_open_streams
    from .opening import default_wal_path
    from .wal.file_scan import check_file_wal

    url = str(args.url)
    paths = list(dict.fromkeys(Path(w).resolve() for w in args.wal))
    default_dir = default_wal_path(url, "x")
    if default_dir is not None and default_dir.parent.is_dir():
        paths += sorted(p for p in default_dir.parent.glob("*.wal") if p not in paths)
    bad, checked = 0, set()
    for path in paths:
        try:
            check = check_file_wal(path)
        except S3StreamError as exc:
            bad += 1
            print(f"wal {path}: FAILED: {exc}")
            continue
        checked.add(check.node_id)
        if not check.formatted:
            print(f"wal {path}: empty (never formatted)")
            continue
        how = "closed cleanly" if check.clean else "not closed (replayed on the next open)"
        if check.ok:
            print(
                f"wal {path} (node {check.node_id!r}): {check.records} records, "
                f"{check.record_bytes} bytes OK, {how}"
            )
        else:
            bad += 1
            print(f"wal {path} (node {check.node_id!r}): DAMAGED: {check.damage}")
    state = client.metadata.state
    for node_id in sorted(state.nodes):
        if node_id in checked:
            continue
        if default_dir is None:
            bad += _verify_object_wal(client, node_id, has_open_streams(state, node_id))
            continue
        if not has_open_streams(state, node_id):
            continue
        where = default_dir.parent / f"{node_id}.wal"
        bad += 1
        print(
            f"wal of node {node_id!r}: MISSING: the node still has streams open, so its WAL "
            f"may hold acknowledged appends, but {where} "
            f"{'is empty' if where.exists() else 'does not exist'} (name the WAL with --wal "
            "if it lives elsewhere)"
        )
    return bad


def _verify_object_wal(client: StreamReader, node_id: str, open_streams: bool) -> int:
    """Check `node_id`'s object WAL at a remote store's default place (``wal/NODE/``),
    read-only; 1 if it is damaged."""
    from .opening import OBJECT_WAL_DIR
    from .wal.object import check_object_wal

    try:
        check = check_object_wal(client.object_store, node_id, prefix=OBJECT_WAL_DIR)
    except S3StreamError as exc:
        print(f"wal of node {node_id!r}: FAILED: {exc}")
        return 1
    where = f"object WAL {check.prefix}"
    if check.objects == 0:
        # The node may use a file WAL on its own disk, which a store's reader cannot reach.
        if open_streams:
            print(
                f"{where} (node {node_id!r}): none; the node still has streams open: if its "
                "WAL is a file, check it with --wal"
            )
        return 0
    if not check.ok:
        print(f"{where} (node {node_id!r}): DAMAGED: {check.damage}")
        return 1
    torn = f", {check.torn_tail} unacknowledged object(s) past its end" if check.torn_tail else ""
    print(
        f"{where} (node {node_id!r}): {check.objects} objects, {check.records} records, "
        f"{check.record_bytes} bytes OK{torn}"
    )
    return 0


def _progress_bar() -> tuple[Any, Callable[[int, int, str], None] | None]:
    """A tqdm bar and the callback driving it; (None, None) without tqdm (it is optional)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(total=0, unit="B", unit_scale=True, desc="compacting")

    def update(done: int, total: int, phase: str) -> None:
        bar.set_description(phase)
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, update


def _compact(args: argparse.Namespace) -> int:
    import os

    from .settings import ClientSettings, CompactionSettings

    if args.nice and hasattr(os, "nice"):
        # A batch job: the processes it shares the machine with (the writers appending to
        # the streams, the object store) should win any contention for the CPU.
        os.nice(args.nice)
    limit = {} if args.bytes_per_s is None else {"bytes_per_s": args.bytes_per_s}
    compaction = CompactionSettings(
        deletion_delay_ms=args.deletion_delay_ms, orphan_grace_ms=args.orphan_grace_ms, **limit
    )
    client = open_client(
        args.url,
        node_id=args.node_id,
        wal="memory://",
        settings=ClientSettings(compaction=compaction),
    )
    bar, progress = (None, None) if args.no_progress else _progress_bar()
    try:
        report = client.compact(progress, sweep_orphans=args.sweep_orphans)
    finally:
        if bar is not None:
            bar.close()
        client.close()
    print(
        f"objects {report.objects_before} -> {report.objects_after} "
        f"({report.bytes_before / 1e6:.1f} MB -> {report.bytes_after / 1e6:.1f} MB); "
        f"tasks {dict(report.tasks)}, aborted {report.aborted}; read "
        f"{report.bytes_read / 1e6:.1f} MB, wrote {report.bytes_written / 1e6:.1f} MB; "
        f"trimmed {report.streams_trimmed} streams; purged {report.objects_purged}, "
        f"orphans deleted {report.orphans_deleted}; {report.duration_s:.2f} s"
    )
    return 0


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def _take_over(args: argparse.Namespace) -> int:
    from .opening import default_wal_url

    options: dict[str, str] = {}
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"--storage-option needs KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        options[key] = value
    wal = args.wal or default_wal_url(args.url, args.node)
    if wal is None:
        print(f"no default WAL for {args.url!r}: pass --wal", file=sys.stderr)
        return 2
    client = open_client(
        args.url, node_id=args.node_id, wal="memory://", storage_options=options or None
    )
    try:
        report = client.take_over(args.node, wal=wal, storage_options=options or None)
    finally:
        client.close()
    r = report.recovery
    print(
        json.dumps(
            {
                "node": report.node_id,
                "node_epoch": report.node_epoch,
                "wal": wal,
                "records": r.records,
                "already_committed": r.already_committed,
                "fenced": r.fenced,
                "uploaded_batches": r.uploaded_batches,
                "released_streams": list(report.released_streams),
            }
        )
    )
    return 0


def _open_ro(args: argparse.Namespace) -> StreamReader:
    """The read-only tools' view: a `StreamReader`, which never writes to the store."""
    return open_reader(args.url)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s3stream", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="append, reopen, read back and verify a realistic workload")
    d.add_argument("dir", nargs="?", default="./s3stream-demo")
    d.add_argument("--streams", type=int, default=8)
    d.add_argument("--batches", type=int, default=40_000)
    d.add_argument("--batch-bytes", type=int, default=1024)
    d.add_argument("--reuse", action="store_true", help="allow a non-empty directory")
    d.set_defaults(fn=_demo)
    for name, fn, help_ in (
        ("inspect", _inspect, "show streams and objects"),
        ("verify", _verify, "read every stream fully, checking every checksum"),
        ("dump", _dump, "print the batches of one stream"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("url")
        c.add_argument("--node-id", default="inspector")
        if name == "verify":
            c.add_argument(
                "--wal",
                action="append",
                default=[],
                metavar="PATH",
                help="also check this WAL file (repeatable); a local store's own are found",
            )
        if name == "dump":
            c.add_argument("stream", type=int)
            c.add_argument("--start", type=int, default=0)
            c.add_argument("--limit", type=int, default=100)
        c.set_defaults(fn=fn)
    c = sub.add_parser("compact", help="run one compaction pass (retention, merge, delete)")
    c.add_argument("url")
    c.add_argument("--node-id", default="compactor")
    c.add_argument("--deletion-delay-ms", type=int, default=600_000)
    c.add_argument("--orphan-grace-ms", type=int, default=86_400_000)
    c.add_argument("--sweep-orphans", action="store_true", default=None)
    c.add_argument(
        "--bytes-per-s",
        type=_non_negative,
        default=None,
        help="bytes/s the job reads plus writes at most (0: no limit; default: "
        "CompactionSettings.bytes_per_s, 4 MiB/s)",
    )
    c.add_argument(
        "--nice",
        type=_non_negative,
        default=10,
        help="lower this process's CPU priority by this much first (os.nice; 0: keep it)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(fn=_compact)
    t = sub.add_parser(
        "take-over", help="fence a failed node, commit what its WAL holds, release its streams"
    )
    t.add_argument("url")
    t.add_argument("node", help="node id of the failed client")
    t.add_argument("--wal", help="the node's WAL URL (default: the default WAL of URL)")
    t.add_argument("--node-id", default="failover", help="node id of this tool")
    t.add_argument(
        "--storage-option", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="object-store option (endpoint_url=..., ...); repeatable",
    )  # fmt: skip
    t.set_defaults(fn=_take_over)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except S3StreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
