"""The ``s3stream`` command: demo, inspect, dump, verify, compact, take-over.

Each subcommand is one small function returning its exit status. `main` turns what goes
wrong into one line on stderr and a status (docs/cli.md): 2 for a mistake in the command
line, 1 for a failure (a store out of reach, damage found), 130 for Ctrl-C; a reader that
goes away (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, redirect_stdout, suppress
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import open as open_client
from ._registry import split_scheme
from .client import MAX_CREATE_BATCH, StreamClient
from .errors import (
    CorruptionError,
    InvalidArgumentError,
    NodeInUseError,
    OffsetOutOfRangeError,
    S3StreamError,
    StreamNotFoundError,
    UnavailableError,
)
from .metadata import MetadataState, ObjectMeta
from .objectstore.registry import storage_option_from_text
from .opening import resolve_settings
from .reader import (
    StreamReader,
    _require_existing_directory,
    foreign_entries,
    holds_store,
    open_reader,
    open_reader_store,
)
from .settings import ClientSettings
from .settings_parse import parse_duration_ms, parse_int, parse_size
from .types import AppendResult, RecordBatch, StreamState
from .validation import check_node_id

if TYPE_CHECKING:
    from .wal.file_scan import FileWalCheck

__all__ = ["main"]

#: Exit statuses (docs/cli.md); the last two as a shell reports a command killed by SIGINT
#: or SIGPIPE (128 + the signal's number).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141

#: The store URL of a command given none.
ENV_URL = "S3STREAM_URL"
#: The metadata URL of a command given no --metadata (none: the log is in the store).
ENV_METADATA = "S3STREAM_METADATA"
#: Options of ``s3://`` and ``s3a://`` stores taken from the environment when no ``-o`` sets
#: them, the first variable set winning. boto3 reads the other AWS_* variables (credentials,
#: profile, config files) itself. The endpoint is passed on rather than left to boto3 so
#: that the store knows it talks to an S3-compatible service (path-style addressing); the
#: region too, as the store would otherwise pick us-east-1 for such an endpoint.
ENV_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("endpoint_url", ("S3STREAM_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")),
    ("region_name", ("S3STREAM_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")),
)


def _storage_options(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """The store options of a command: the environment's (`ENV_OPTIONS`), then ``-o``."""
    options: dict[str, Any] = {}
    if split_scheme(url)[0] in ("s3", "s3a"):
        for key, names in ENV_OPTIONS:
            value = next((os.environ[n] for n in names if os.environ.get(n)), None)
            if value is not None:
                options[key] = value
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidArgumentError(f"-o needs KEY=VALUE, got {item!r}")
        options[key] = storage_option_from_text(key, value)
    return options


def _settings(args: argparse.Namespace, **given: object) -> dict[str, object]:
    """The settings the command line gives, as a mapping of setting names: `given` (a
    command's flags, None where left out) and ``--store-timeout``. Only those: a flag left
    out leaves its setting to the environment's ``S3STREAM_*``, then to the default
    (docs/configuration.md, "Which value wins": a `ClientSettings` would state every field
    and the environment would lose)."""
    given["store_timeout_ms"] = args.store_timeout
    return {name: value for name, value in given.items() if value is not None}


def _resolved(settings: dict[str, object]) -> ClientSettings:
    """The command line's `settings` (`_settings`) over the environment's over the
    defaults, as `s3stream.open` resolves them: for what runs before or without an open (the
    checks of a store, the read-only tools)."""
    return resolve_settings(settings, environ=os.environ)


def _metadata(args: argparse.Namespace) -> str | None:
    """Where the store's metadata log lives: ``--metadata``, else $S3STREAM_METADATA, else
    None (in the store itself)."""
    url: str | None = args.metadata or os.environ.get(ENV_METADATA) or None
    return url


def _store_url(args: argparse.Namespace) -> str:
    """The store URL given, or the environment's; a typo (``s3:/bucket``) is reported here,
    before anything is opened."""
    url: str = args.url or os.environ.get(ENV_URL, "")
    if not url:
        # Said in full: with the URL left out, argparse gave the next word to the argument
        # after it (`take-over ./store` reads as the node ./store of no store).
        raise InvalidArgumentError(f"no store URL: write '{args.synopsis}', or set {ENV_URL}")
    split_scheme(url)
    return url


# ---------------------------------------------------------------------------------------------
# Output: progress bars, tables, sizes


class _Progress:
    """A bar on stderr, drawn by tqdm when it is installed, stderr is a terminal and
    ``--no-progress`` is not given; otherwise nothing is drawn (tqdm is optional)."""

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar

    @classmethod
    def start(
        cls, args: argparse.Namespace, what: str, total: int | None, unit: str = "B"
    ) -> _Progress:
        if getattr(args, "no_progress", False) or not sys.stderr.isatty():
            return cls()
        try:
            from tqdm import tqdm
        except ImportError:
            return cls()
        binary = unit == "B"
        return cls(
            tqdm(
                total=total,
                desc=what,
                unit=unit,
                unit_scale=binary,
                unit_divisor=1024 if binary else 1000,
                leave=False,
                dynamic_ncols=True,
                file=sys.stderr,
            )
        )

    @property
    def active(self) -> bool:
        return self._bar is not None

    def add(self, n: int) -> None:
        """`n` more done (drawn at most ten times a second)."""
        if self._bar is not None:
            self._bar.update(n)

    def set(self, done: int, total: int | None = None, what: str | None = None) -> None:
        """`done` of `total` (unchanged if None) done, drawn now."""
        bar = self._bar
        if bar is None:
            return
        if what is not None and what != bar.desc:
            bar.set_description(what, refresh=False)
        if total is not None:
            bar.total = total
        bar.n = done
        bar.refresh()

    def progress(self, done: int, total: int, what: str) -> None:
        """The compactor's `Progress` callback."""
        if total:  # a phase with nothing to do leaves the last one's bar standing
            self.set(done, total, what)

    def write(self, line: str) -> None:
        """Print `line` to stdout without tearing the bar."""
        if self._bar is None:
            print(line)
        else:
            self._bar.write(line, file=sys.stdout)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextmanager
def _watching(bar: _Progress, moved: Callable[[], int], total: int | None = None) -> Iterator[None]:
    """Move `bar` by `moved()` (bytes so far), polled from a thread while the block runs:
    for work inside one library call that reports no progress of its own."""
    if not bar.active:
        yield
        return
    stop = threading.Event()
    start = moved()

    def poll() -> None:
        while not stop.wait(0.2):
            try:
                bar.set(moved() - start, total)
            except Exception:  # a bar is not worth a traceback from a thread; stop moving it
                return

    thread = threading.Thread(target=poll, name="s3stream-cli-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _store_traffic(client: StreamClient) -> Callable[[], int]:
    """Bytes a client's object store has read and written so far."""

    def moved() -> int:
        m = client.metrics.object_store
        return int(m.get_bytes + m.put_bytes + m.conditional_put_bytes)

    return moved


def _size(n: int | None) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 3.2 GiB; "?" when unknown."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    value, i = n / 1024, 0
    while value >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{value:.1f} {units[i]}"


#: Characters a terminal acts on instead of showing: C0/C1 controls and DEL (cursor moves,
#: screen clears, faked lines), and the bidirectional overrides that reorder what follows.
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(text: str) -> str:
    """`text` (a tag, a property, a name: anybody's bytes) safe to print on a terminal, its
    unshowable characters as Python escapes (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return _UNSHOWABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Iterable[int]) -> None:
    """Print `rows` in columns under `header`; the columns numbered in `right` (numbers,
    sizes) aligned to the right. Cells are `_shown`."""
    cells = [list(header), *([_shown(str(c)) for c in row] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    right = set(right)
    for line in cells:
        padded = (
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        print("  ".join(padded).rstrip())


def _count(n: int, thing: str) -> str:
    """``1 stream``, ``2 streams``, ``1,000 batches``, ``3 entries``."""
    if n == 1:
        return f"1 {thing}"
    if thing.endswith("y") and thing[-2:-1] not in ("a", "e", "i", "o", "u"):
        return f"{n:,} {thing[:-1]}ies"
    return f"{n:,} {thing}{'es' if thing.endswith(('s', 'ch')) else 's'}"


def _rate(amount: float, seconds: float) -> float:
    # A fast machine can finish a phase within the clock's resolution.
    return amount / max(seconds, 1e-9)


def _utc(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)  # not a time a calendar can show: the raw milliseconds


# ---------------------------------------------------------------------------------------------
# Commands


def _payload(stream_index: int, seq: int, size: int) -> bytes:
    # Deterministic content so a reader can verify every byte without keeping a copy.
    seed = hashlib.blake2b(f"{stream_index}:{seq}".encode(), digest_size=16).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _check_demo_target(
    url: str,
    reuse: bool,
    options: dict[str, Any],
    settings: ClientSettings,
    metadata: str | None = None,
) -> None:
    """The demo's store must outlive its first client and start empty unless `reuse`."""
    scheme, path = split_scheme(url)
    if scheme == "memory":
        raise InvalidArgumentError(
            "the demo reads its store back through a second reader, and a memory:// store lives "
            "only as long as one: give a directory or a durable URL"
        )
    if scheme == "file":
        root = Path(path)
        if root.exists() and not root.is_dir():
            raise InvalidArgumentError(f"{url!r} is not a directory")
        if not reuse and root.is_dir() and any(root.iterdir()):
            others = foreign_entries(root)
            if others:
                # --reuse would be refused too: the demo adds to a store, not to a folder.
                raise InvalidArgumentError(
                    f"{url!r} holds other files ({', '.join(repr(n) for n in others[:3])}) and "
                    "no s3stream store: choose an empty or new directory"
                )
            raise InvalidArgumentError(
                f"{url!r} is not empty: pass --reuse to add to it, or choose another directory"
            )
    elif not reuse:
        with open_reader_store(url, storage_options=options or None, settings=settings) as store:
            if not holds_store(store):
                # A new prefix, where the demo makes its store; unless it holds somebody
                # else's objects (the demo wrote beside them, as it refuses a directory).
                other = next(iter(store.list("")), None)
                if other is not None:
                    raise InvalidArgumentError(
                        f"{url!r} holds objects that are not an s3stream store (such as "
                        f"{other.key!r}): choose an empty prefix"
                    )
                return
        with open_reader(
            url, storage_options=options or None, settings=settings, metadata=metadata
        ) as reader:
            if reader.list_streams():
                raise InvalidArgumentError(
                    f"{url!r} holds streams already: pass --reuse to add to them, or choose "
                    "another URL"
                )


def _demo(args: argparse.Namespace) -> int:
    url = args.dir
    options = _storage_options(args, url)
    settings = _settings(args)
    metadata = _metadata(args)
    # No check for a Ctrl-C in it (a store probe that may retry for 20 s): not deferred.
    interrupts = args.interrupts
    if interrupts is not None:
        interrupts.deferred = False
    try:
        _check_demo_target(url, args.reuse, options, _resolved(settings), metadata)
    finally:
        if interrupts is not None:
            interrupts.deferred = True
    n_streams, n_batches, size = args.streams, args.batches, args.batch_bytes
    total, mb = n_batches * size, n_batches * size / 1e6
    _say(
        f"s3stream demo: {_count(n_streams, 'stream')}, {_count(n_batches, 'batch')} of "
        f"{size:,} B, in {url}"
    )
    bar = _Progress.start(args, "appending", total)
    try:
        t0 = time.perf_counter()
        with open_client(
            url,
            storage_options=options or None,
            settings=settings,
            metadata=metadata,
        ) as client:
            args.check_interrupt()
            streams = client.create_streams(
                [{"topic": "demo", "partition": str(i)} for i in range(n_streams)]
            )
            window: list[Future[AppendResult]] = []
            for seq in range(n_batches):
                args.check_interrupt()
                i = seq % n_streams
                batch = RecordBatch(
                    _payload(i, seq, size), count=1 + seq % 5, properties={"seq": str(seq)}
                )
                window.append(streams[i].append_async(batch))
                if len(window) >= 256 or seq == n_batches - 1:
                    for f in window:
                        f.result()
                    bar.add(len(window) * size)
                    window.clear()
            t_append = time.perf_counter() - t0
            ids = [s.stream_id for s in streams]
            records = sum(s.confirm_offset for s in streams)
            _say(
                f"  appended {_count(n_batches, 'batch')} ({_count(records, 'record')}, "
                f"{mb:.1f} MB) durably "
                f"in {t_append:.2f} s: {_rate(n_batches, t_append):,.0f} batches/s, "
                f"{_rate(mb, t_append):.1f} MB/s"
            )
            bar.set(0, total, "uploading")
            t1 = time.perf_counter()
            with _watching(bar, _store_traffic(client), total):
                client.close()
        args.check_interrupt()
        t_close = time.perf_counter() - t1
        m = client.metrics
        _say(
            f"  closed (uploaded everything) in {t_close:.2f} s: "
            f"{_count(m.storage.objects_uploaded, 'object')}, "
            # Data and metadata, plain and conditional: what the cost ledger bills as PUTs.
            f"{_count(m.object_store.puts + m.object_store.conditional_puts, 'PUT')}"
        )
        bar.set(0, total, "reading back")
        t2 = time.perf_counter()
        # A read-only reader, as a consumer in another process would read: opening each
        # stream in a client would commit one metadata entry per stream.
        with open_reader(
            url, storage_options=options or None, settings=settings, metadata=metadata
        ) as reader:
            seen = 0
            ends = {s.stream_id: (s.start_offset, s.end_offset) for s in reader.list_streams()}
            for i, sid in enumerate(ids):
                offset, end = ends.get(sid, (0, 0))
                while offset < end:
                    args.check_interrupt()
                    res = reader.read(sid, offset, max_bytes=4 << 20)
                    for b in res.batches:
                        seq = int(b.properties["seq"])
                        if seq % n_streams != i or b.payload != _payload(i, seq, size):
                            _say(f"  MISMATCH in stream {sid} at offset {b.base_offset}")
                            return EXIT_FAILED
                        seen += 1
                        bar.add(b.size)
                    offset = res.next_offset
        t_read = time.perf_counter() - t2
    finally:
        bar.close()
    if seen != n_batches:
        _say(f"  read back {_count(seen, 'batch')}, expected {n_batches:,}")
        return EXIT_FAILED
    _say(
        f"  read back all {_count(seen, 'batch')} byte-identical through a new reader in "
        f"{t_read:.2f} s: {_rate(mb, t_read):.1f} MB/s"
    )
    _say("demo OK")
    return EXIT_OK


def _say(line: str) -> None:
    # Flushed line by line: a long run shows where it is even when stdout is a log file.
    print(line, flush=True)


def _stream_sizes(reader: StreamReader, live: Iterable[ObjectMeta]) -> dict[int, int | None]:
    """Stored bytes of each stream in the live objects; None where an index is unreadable.
    An object of one stream counts whole; a shared one is split by its index (one read)."""
    from .format.objects import read_index

    sizes: dict[int, int | None] = {}

    def add(stream_id: int, n: int | None) -> None:
        had = sizes.get(stream_id, 0)
        sizes[stream_id] = None if had is None or n is None else had + n

    for obj in live:
        if len(obj.ranges) == 1:
            add(obj.ranges[0].stream_id, obj.size)
            continue
        try:
            index = read_index(reader.object_store, obj.key, object_size=obj.size)
        except S3StreamError:
            for r in obj.ranges:
                add(r.stream_id, None)  # `verify` names the damage; here it is just unknown
            continue
        for r in obj.ranges:
            add(r.stream_id, index.stream_bytes(r.stream_id))
    return sizes


def _store_cost(reader: StreamReader) -> Any:
    from .metrics import store_cost

    return store_cost(reader)


def _print_cost(cost: Any) -> None:
    """The storage bill of what the store holds now, per top-level prefix."""
    print()
    _table(
        ("PREFIX", "OBJECTS", "SIZE"),
        [(a.prefix + "/", a.objects, _size(a.bytes)) for a in cost.areas],
        right=(1, 2),
    )
    split = ""
    if cost.live_bytes is not None:
        split = (
            f" (data: {_size(cost.live_bytes)} live, {_size(cost.deleting_bytes)} awaiting "
            f"deletion, {_size(cost.orphan_bytes)} not in the metadata)"
        )
    print(
        f"storage: {_size(cost.stored_bytes)}{split}: ${cost.storage_usd_per_month:,.4f} per "
        f"month at {cost.prices.name} prices; this listing took {cost.list_requests} LIST "
        f"request(s), ${cost.list_usd:,.6f}. A client's request costs: "
        "client.metrics.cost() (docs/observability.md)"
    )


def _inspect(args: argparse.Namespace) -> int:
    with _open_ro(args) as reader:
        # One snapshot: every figure below describes the same moment of the store.
        state = reader.snapshot()
        streams = state.list_streams()
        objects = sorted(state.objects.values(), key=lambda o: o.key)
        live = [o for o in objects if o.live]
        # Replaced by compaction or retention; deleted after the deletion delay.
        doomed = [o for o in objects if not o.live]
        sizes = _stream_sizes(reader, live)
        cost = _store_cost(reader) if args.cost else None
    if args.json:
        out: dict[str, Any] = {
            "url": args.url,
            "metadata_seq": state.seq,
            "streams": [
                {
                    "id": s.stream_id,
                    "epoch": s.epoch,
                    "start": s.start_offset,
                    "end": s.end_offset,
                    "state": s.state.value,
                    "owner": s.owner,
                    "bytes": sizes.get(s.stream_id, 0),
                    "tags": dict(s.tags),
                }
                for s in streams
            ],
            "objects": len(live),
            "object_bytes": sum(o.size for o in live),
            "objects_awaiting_deletion": len(doomed),
            "bytes_awaiting_deletion": sum(o.size for o in doomed),
        }
        if args.objects:
            out["object_list"] = [_object_facts(o) for o in objects]
        if cost is not None:
            out["cost"] = cost.to_dict()
        print(json.dumps(out, indent=2))
        return EXIT_OK
    open_ = sum(1 for s in streams if s.state is StreamState.OPEN)
    print(
        f"{args.url}: {_count(len(streams), 'stream')} ({open_} open), "
        f"{_count(len(live), 'live object')}, metadata log entry {state.seq}"
    )
    if streams:
        print()
        _table(
            ("STREAM", "STATE", "OWNER", "EPOCH", "START", "END", "SIZE", "TAGS"),
            [
                (
                    s.stream_id,
                    s.state.value,
                    s.owner or "-",
                    s.epoch,
                    s.start_offset,
                    s.end_offset,
                    _size(sizes.get(s.stream_id, 0)),
                    ", ".join(f"{k}={v}" for k, v in sorted(s.tags.items())) or "-",
                )
                for s in streams
            ],
            right=(0, 3, 4, 5, 6),
        )
    print()
    _table(
        ("OBJECTS", "COUNT", "SIZE"),
        [
            ("live", len(live), _size(sum(o.size for o in live))),
            ("awaiting deletion", len(doomed), _size(sum(o.size for o in doomed))),
        ],
        right=(1, 2),
    )
    if doomed:
        print("(replaced by compaction or retention; deleted after the deletion delay)")
    if cost is not None:
        _print_cost(cost)
    if args.objects and objects:
        print()
        _table(
            ("OBJECT", "KIND", "LEVEL", "NODE", "SIZE", "STREAMS", "STATE"),
            [
                (
                    o.key,
                    o.kind.value,
                    o.level,
                    o.node_id,
                    _size(o.size),
                    len(o.ranges),
                    "live" if o.live else "awaiting deletion",
                )
                for o in objects
            ],
            right=(2, 4, 5),
        )
    return EXIT_OK


def _object_facts(o: ObjectMeta) -> dict[str, Any]:
    return {
        "key": o.key,
        "kind": o.kind.value,
        "level": o.level,
        "node": o.node_id,
        "bytes": o.size,
        "live": o.live,
        "ranges": [[r.stream_id, r.start_offset, r.end_offset] for r in o.ranges],
    }


def _dump(args: argparse.Namespace) -> int:
    limit = args.limit or None  # 0: every batch
    with _open_ro(args) as reader:
        info = reader.stream_info(args.stream)
        if args.start > info.end_offset:
            raise InvalidArgumentError(
                f"--start {args.start} is past the end of stream {args.stream}, which holds "
                f"offsets [{info.start_offset}, {info.end_offset})"
            )
        offset = max(args.start, info.start_offset)
        if not args.json:
            header = f"{'OFFSET':>12}  {'RECORDS':>7}  {'TIMESTAMP (UTC)':<23}  {'BYTES':>9}"
            print(f"{header}  PROPERTIES")
        shown = 0
        while offset < info.end_offset and (limit is None or shown < limit):
            res = reader.read(args.stream, offset)
            batches = res.batches if limit is None else res.batches[: limit - shown]
            for b in batches:
                if args.json:
                    facts = {
                        "base_offset": b.base_offset,
                        "count": b.count,
                        "timestamp": b.base_timestamp,
                        "bytes": b.size,
                        "properties": dict(b.properties),
                    }
                    print(json.dumps(facts))
                else:
                    props = _shown(" ".join(f"{k}={v}" for k, v in sorted(b.properties.items())))
                    print(
                        f"{b.base_offset:>12}  {b.count:>7}  {_utc(b.base_timestamp):<23}  "
                        f"{b.size:>9}  {props}".rstrip()
                    )
            shown += len(batches)
            offset = batches[-1].next_offset if batches else res.next_offset
    if not args.json and offset < info.end_offset:
        print(f"(first {_count(shown, 'batch')}; the stream goes on to offset "
              f"{info.end_offset}: --start {offset} for the next, --limit 0 for all)")  # fmt: skip
    return EXIT_OK


class _Findings:
    """What `verify` finds: printed line by line as it goes, or gathered into one JSON
    object printed at the end (``--json``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.as_json = bool(args.json)
        self.bar = _Progress()
        self.facts: dict[str, Any] = {
            "url": args.url,
            "ok": True,
            "problems": 0,
            "metadata": None,
            "wals": [],
            "wal_problems": 0,
            "streams": [],
        }

    def say(self, line: str) -> None:
        if not self.as_json:
            self.bar.write(line)

    def stream(self, fact: dict[str, Any], line: str) -> None:
        self.facts["streams"].append(fact)
        self.say(line)

    def finish(self, problems: int) -> int:
        self.facts["problems"], self.facts["ok"] = problems, not problems
        if self.as_json:
            print(json.dumps(self.facts, indent=2))
        elif problems:
            print(f"verify: FAILED: {_count(problems, 'problem')} (see above)")
        else:
            streams = _count(len(self.facts["streams"]), "stream")
            batches = _count(sum(s["batches"] for s in self.facts["streams"]), "batch")
            print(f"verify: OK ({streams}, {batches}; metadata and WALs checked)")
        return EXIT_FAILED if problems else EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from .metadata.audit import audit_log

    found = _Findings(args)
    try:
        client = _open_ro(args)
    except CorruptionError as exc:
        found.facts["metadata"] = {"loaded": False, "error": str(exc)}
        found.say(f"metadata: FAILED to load: {exc}")
        return found.finish(1)
    bad = 0
    try:
        audit = audit_log(client.metadata.log)
        for problem in audit.problems:
            found.say(f"metadata: {problem}")
        bad += len(audit.problems)
        found.facts["metadata"] = {
            "loaded": True,
            "entries": audit.entries,
            "checkpoints": audit.checkpoints,
            "problems": [str(p) for p in audit.problems],
        }
        found.say(
            f"metadata: {_count(audit.entries, 'entry')} and "
            f"{_count(audit.checkpoints, 'checkpoint')} checked"
            + ("" if audit.ok else f", {_count(len(audit.problems), 'problem')}")
        )
        if found.as_json:
            # The WAL checks print their findings: gathered here as lines of text.
            lines = io.StringIO()
            with redirect_stdout(lines):
                wal_problems = _verify_wals(client, args)
            found.facts["wals"] = lines.getvalue().splitlines()
        else:
            wal_problems = _verify_wals(client, args)
        found.facts["wal_problems"] = wal_problems
        bad += wal_problems
        streams = client.list_streams()
        total = sum(i.end_offset - i.start_offset for i in streams)
        found.bar = _Progress.start(args, "verifying", total, unit="records")
        done = 0
        for info in streams:
            offset, batches = info.start_offset, 0
            fact: dict[str, Any] = {"id": info.stream_id, "start": offset, "end": info.end_offset}
            try:
                while offset < info.end_offset:
                    try:
                        res = client.read(info.stream_id, offset, max_bytes=8 << 20)
                    except OffsetOutOfRangeError:
                        # A live writer trimmed past the read since the listing: go on from
                        # the new start (a stream that really lost records fails otherwise).
                        now = client.stream_info(info.stream_id).start_offset
                        if now <= offset:
                            raise
                        offset = now
                        continue
                    batches += len(res.batches)
                    offset = res.next_offset
                    found.bar.set(done + offset - info.start_offset)
                found.stream(
                    {**fact, "ok": True, "batches": batches},
                    f"stream {info.stream_id}: {_count(batches, 'batch')} OK",
                )
            except S3StreamError as exc:
                bad += 1
                found.stream(
                    {**fact, "ok": False, "batches": batches, "failed_at": offset,
                     "error": str(exc)},
                    f"stream {info.stream_id}: FAILED at offset {offset}: {exc}",
                )  # fmt: skip
            done += info.end_offset - info.start_offset
    finally:
        found.bar.close()
        client.close()
    return found.finish(bad)


#: Scans of a WAL a live process holds before `verify` stops calling it damaged.
_LIVE_WAL_SCANS = 5


def _verify_wals(client: StreamReader, args: argparse.Namespace) -> int:
    """Check the WAL files a store's nodes use, read-only: those at a local store's default
    place, and any named with ``--wal``. The number of problems found."""
    from .failover import has_open_streams
    from .opening import default_wal_path
    from .wal.file_scan import check_file_wal
    from .wal.holder import live_holder
    from .wal.registry import file_wal_path

    url = str(args.url)
    # realpath, not Path.resolve: that raises RuntimeError on a symlink loop (Python 3.11).
    # A path or a file:// URL, as take-over's --wal takes (the URL's query is the WAL's
    # settings, which a read of the file does not need).
    paths = list(
        dict.fromkeys(
            Path(os.path.realpath(os.path.expanduser(file_wal_path(w)))) for w in args.wal
        )
    )
    for path in paths:
        # Named on the command line: a mistake there is the user's to fix (exit 2), said
        # with the path, not the OS's "Is a directory" of a read.
        if path.is_dir():
            raise InvalidArgumentError(f"--wal {str(path)!r} is a directory, not a WAL file")
        if not path.exists():
            raise InvalidArgumentError(f"--wal {str(path)!r}: no such file")
    default_dir = default_wal_path(url, "x")
    if default_dir is not None and default_dir.parent.is_dir():
        paths += sorted(p for p in default_dir.parent.glob("*.wal") if p not in paths)
    bad, checked = 0, set()
    for path in paths:
        try:
            check = check_file_wal(path)
        except (S3StreamError, OSError) as exc:
            bad += 1
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"wal {path}: FAILED: {reason}")
            continue
        scans = 1
        holder = None if check.ok else live_holder(path)
        while holder is not None and not check.ok and scans < _LIVE_WAL_SCANS:
            # A live writer's ring changes under the scan (a mark read before the frames
            # written after it): scan again rather than call a healthy WAL damaged.
            with contextlib.suppress(S3StreamError, OSError):
                check = check_file_wal(path)
            scans += 1
        checked.add(check.node_id)
        if holder is not None and not check.ok:
            who = f"process {holder[0]}" if holder[0] is not None else "a live process"
            print(
                f"wal {path} (node {check.node_id!r}): in use by {who}, which wrote under each "
                f"of {scans} scans: not judged (check it again, or once the writer stopped)"
            )
            continue
        if not check.formatted:
            print(f"wal {path}: empty (never formatted)")
            continue
        if not check.ok:
            bad += 1
            print(f"wal {path} (node {check.node_id!r}): DAMAGED: {check.damage}")
            continue
        foreign = _foreign_wal(check, client.metadata.state)
        if foreign is not None:
            bad += 1
            print(f"wal {path} (node {check.node_id!r}): NOT THIS STORE'S: {foreign}")
            continue
        how = "closed cleanly" if check.clean else "not closed"
        if check.records:
            # Not trimmed yet: the node's next open (or a take-over) replays and uploads them.
            how += "; its records are uploaded by the node's next open or `take-over`"
        print(
            f"wal {path} (node {check.node_id!r}): {_count(check.records, 'record')}, "
            f"{_count(check.record_bytes, 'byte')} OK, {how}"
        )
    state = client.metadata.state
    for node_id in sorted(state.nodes):
        if node_id in checked:
            continue
        if default_dir is None:
            bad += _verify_object_wal(
                client, node_id, has_open_streams(state, node_id), state.nodes[node_id].wal_uid
            )
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


def _foreign_wal(check: FileWalCheck, state: MetadataState) -> str | None:
    """Why the healthy WAL file `check` scanned is not one this store's node would replay
    (an open or a take-over refuses it: a node this store does not know, or another WAL
    identity than the one the store expects of the node), or None."""
    from .failover import expected_wal_uid, has_open_streams

    node_id = check.node_id
    if not check.records:
        return None  # nothing to replay: an open formats a WAL without records anew
    if node_id not in state.nodes:
        return (
            f"it holds records of node {node_id!r}, which this store does not know (a WAL of "
            "another store?): an open or a take-over refuses it"
        )
    # The rule an open and a take-over apply (`expected_wal_uid`): the identity recorded
    # for the node, else none at all while the node has no stream open.
    expect = expected_wal_uid(state, node_id, has_open_streams(state, node_id))
    if expect is not None and check.wal_uid != expect:
        recorded = (
            f"the WAL this store recorded for node {node_id!r} ({expect:#x})"
            if expect >= 0
            else f"of node {node_id!r}, which has no stream open and no WAL recorded"
        )
        return (
            f"it holds records, and its identity {check.wal_uid:#x} is not {recorded} (a WAL "
            "of another store?): an open or a take-over refuses it"
        )
    return None


def _verify_object_wal(
    client: StreamReader, node_id: str, open_streams: bool, recorded: int | None
) -> int:
    """Check `node_id`'s object WAL at a remote store's default place (``wal/NODE/``),
    read-only; 1 if it is damaged, or holds records under another identity than the one
    the store `recorded` for the node (the node's open would refuse them)."""
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
    if check.records and recorded is not None and check.identity != recorded:
        print(
            f"{where} (node {node_id!r}): NOT THIS STORE'S: its identity is "
            f"{check.identity}, the store recorded {recorded} for the node, and it holds "
            f"{_count(check.records, 'record')}: the node's open refuses it"
        )
        return 1
    torn = f", {check.torn_tail} unacknowledged object(s) past its end" if check.torn_tail else ""
    print(
        f"{where} (node {node_id!r}): {_count(check.objects, 'object')}, "
        f"{_count(check.records, 'record')}, {_count(check.record_bytes, 'byte')} OK{torn}"
    )
    return 0


def _compact(args: argparse.Namespace) -> int:
    options = _storage_options(args, args.url)
    settings = _settings(
        args,
        **{
            "compaction.deletion_delay_ms": args.deletion_delay_ms,
            "compaction.orphan_grace_ms": args.orphan_grace_ms,
            "compaction.bytes_per_s": args.bytes_per_s,
        },
    )
    # A typo in a path or a prefix must not create an empty store to work on, nor a
    # directory of somebody else's files get a metadata log beside them.
    _require_store(args, options, _resolved(settings))
    if args.nice and hasattr(os, "nice"):
        # A batch job: the processes it shares the machine with (the writers appending to
        # the streams, the object store) should win any contention for the CPU.
        # Niceness stops at 19 anyway; a larger int overflowed os.nice's C int.
        os.nice(min(args.nice, 40))
    client = open_client(
        args.url,
        node_id=args.node_id,
        wal="memory://",
        settings=settings,
        storage_options=options or None,
        metadata=_metadata(args),
    )
    bar = _Progress.start(args, "compacting", 0)
    try:
        report = client.compact(
            bar.progress if bar.active else None, sweep_orphans=args.sweep_orphans
        )
    finally:
        bar.close()
        client.close()
    # Damaged data stopped some tasks (the rest of the pass went on): a failure to report.
    status = EXIT_FAILED if report.damaged else EXIT_OK
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return status
    print(
        f"objects {report.objects_before} -> {report.objects_after} "
        f"({_size(report.bytes_before)} -> {_size(report.bytes_after)}); "
        f"tasks {dict(report.tasks) or 'none'}, aborted {report.aborted}; read "
        f"{_size(report.bytes_read)}, wrote {_size(report.bytes_written)}; "
        f"trimmed {_count(report.streams_trimmed, 'stream')}; purged {report.objects_purged}, "
        f"orphans deleted {report.orphans_deleted}; {report.duration_s:.2f} s"
    )
    if report.damaged:
        print(
            f"compact: FAILED: {_count(report.damaged, 'task')} stopped on damaged data "
            "(logged above); run `s3stream verify` on the store"
        )
    return status


def _whole_number(value: str, minimum: int) -> int:
    try:
        number = parse_int(value)  # the rule every setting follows (no 1_000, no 1e3)
    except InvalidArgumentError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {number}")
    return number


def _non_negative(value: str) -> int:
    return _whole_number(value, 0)


def _positive(value: str) -> int:
    return _whole_number(value, 1)


def _demo_streams(value: str) -> int:
    """``demo --streams``: as many as one `StreamClient.create_streams` call makes (a larger
    count made one metadata entry per stream, with a checkpoint of all of them every 64:
    gigabytes of metadata for a few million)."""
    number = _whole_number(value, 1)
    if number > MAX_CREATE_BATCH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CREATE_BATCH}, got {number}")
    return number


#: Largest ``demo --batch-bytes``: a batch is one WAL record, and a WAL takes records of
#: `WalCapabilities.max_record_bytes` (64 MiB) at most, its header included; 4 KiB is room
#: for the header (the demo's properties are a few bytes).
_DEMO_MAX_BATCH_BYTES = (64 << 20) - 4096


def _setting_value(parse: Callable[[str], int], value: str, minimum: int) -> int:
    """`value` read by `parse`, a rule of the settings (docs/configuration.md, "Values written
    as text": ``1MiB``, ``10min``), at least `minimum`."""
    try:
        number = parse(value)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value!r}")
    return number


def _size_arg(value: str) -> int:
    """Bytes, as a size setting takes them: ``4194304``, ``4MiB``."""
    return _setting_value(lambda text: parse_size(text, name="size"), value, 0)


def _duration_arg(value: str) -> int:
    """Milliseconds, as a duration setting takes them: ``600000``, ``10min``."""
    return _setting_value(lambda text: parse_duration_ms(text, name="duration"), value, 0)


def _batch_bytes(value: str) -> int:
    number = _setting_value(lambda text: parse_size(text, name="size"), value, 1)
    if number > _DEMO_MAX_BATCH_BYTES:
        # Checked before anything is written: the demo would build the payload first (a
        # MemoryError for a huge one) and then have the WAL refuse it.
        raise argparse.ArgumentTypeError(
            f"must be at most {_DEMO_MAX_BATCH_BYTES} (a batch is one WAL record, of 64 MiB "
            f"at most), got {number}"
        )
    return number


def _store_timeout(value: str) -> int:
    """``--store-timeout``, in milliseconds: a duration as the settings write one (``30s``,
    ``500ms``, ``2min``), or a bare number of seconds (``30``, ``0.5``), which is what the
    option took before it took units; scripts pass those."""
    try:
        seconds = float(value)
    except ValueError:
        try:
            number = _setting_value(lambda text: parse_duration_ms(text, name="duration"), value, 1)
        except argparse.ArgumentTypeError:
            # Not the settings' message: it says a bare number is milliseconds, and here it
            # is seconds (following it, 30000 meant 8 hours).
            raise argparse.ArgumentTypeError(
                f"a duration such as 30s, 500ms or 2min, or a bare number of seconds, got {value!r}"
            ) from None
    else:
        # (1e308 s passed a check for inf, then overflowed in round(): a traceback.)
        if not seconds > 0 or not math.isfinite(seconds * 1000):
            raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {value!r}") from None
        number = max(1, round(seconds * 1000))
    return number


def _stream_id(value: str) -> int:
    try:
        return _non_negative(value)
    except argparse.ArgumentTypeError:
        missing = "" if value.strip().lstrip("-").isdigit() else " (is the stream id missing?)"
        raise argparse.ArgumentTypeError(
            f"a stream id is a whole number >= 0 (see 'inspect'), got {value!r}{missing}"
        ) from None


def _take_over(args: argparse.Namespace) -> int:
    from .failover import expected_wal_uid, has_open_streams
    from .opening import default_wal_url
    from .wal.registry import check_take_over_wal

    # By the library's rule, before anything is read (an odd id was "not registered").
    check_node_id(args.node, "NODE")
    check_node_id(args.node_id, "--node-id")
    if args.node == args.node_id:
        raise InvalidArgumentError(
            f"the node to take over, {args.node!r}, is this tool's own node id: pass "
            "--node-id with another name"
        )
    options = _storage_options(args, args.url)
    settings = _settings(args)
    # A typo in a path or a prefix must not create an empty store to work on, nor a
    # directory of somebody else's files get a metadata log beside them.
    _require_store(args, options, _resolved(settings))
    wal = args.wal or default_wal_url(args.url, args.node)
    if wal is None:
        raise InvalidArgumentError(f"no default WAL for {args.url!r}: name it with --wal")
    # Read-only first: an unknown node or a WAL that is not there must not even register
    # this tool's node in the log (the library checks again, under its own open).
    with _open_ro(args) as reader:
        state = reader.metadata.state
        if args.node not in state.nodes:
            raise InvalidArgumentError(
                f"node {args.node!r} is not registered in the metadata log of {args.url!r}"
            )
        open_streams = has_open_streams(state, args.node)
        check_take_over_wal(
            wal,
            args.node,
            open_streams=open_streams,
            accept_loss=args.accept_wal_loss,
            base=_resolved(settings).file_wal,
            expect_uid=expected_wal_uid(state, args.node, open_streams),
            default=args.wal is None,
        )
    if not args.force:
        _refuse_live_holder(wal, args.node)
    client = open_client(
        args.url,
        node_id=args.node_id,
        wal="memory://",
        storage_options=options or None,
        settings=settings,
        metadata=_metadata(args),
    )
    bar = _Progress.start(args, f"taking over {args.node}", None)
    try:
        # Replaying the WAL and uploading what it holds is one library call: the bar follows
        # the client's object-store traffic meanwhile.
        with _watching(bar, _store_traffic(client)):
            report = client.take_over(
                args.node,
                wal=wal,
                storage_options=options or None,
                accept_wal_loss=args.accept_wal_loss,
            )
    finally:
        bar.close()
        client.close()
    r = report.recovery
    print(
        json.dumps(
            {
                "node": report.node_id,
                "node_epoch": report.node_epoch,
                # Without the default's capacity query: an existing WAL keeps the size its
                # header records (a 64 MiB WAL was reported as ?capacity_bytes=256MiB).
                "wal": args.wal or default_wal_url(args.url, args.node, capacity=None),
                "records": r.records,
                "already_committed": r.already_committed,
                "fenced": r.fenced,
                "uploaded_batches": r.uploaded_batches,
                "released_streams": list(report.released_streams),
            }
        )
    )
    return EXIT_OK


def _refuse_live_holder(wal: str, node: str) -> None:
    """Refuse to take over a node whose file WAL a live process holds (its holder lock,
    `WalHolderLock`): that node is not dead, and the take-over would fence a writer that is
    still working. Tested by taking the lock as the library's open does (`lock_file_wal`)
    and letting go at once. A WAL never opened has no lock file: nobody holds it, and none
    is created for it here."""
    from .wal.holder import lock_path_for
    from .wal.registry import check_wal_target, lock_file_wal

    path = check_wal_target(wal)
    if path is None or not (path.is_block_device() or lock_path_for(path).exists()):
        return
    try:
        lock = lock_file_wal(wal, node)
    except NodeInUseError as exc:
        who = f"process {exc.pid}" if exc.pid is not None else "another process"
        raise InvalidArgumentError(
            f"node {node!r} is alive: {who} holds its WAL {str(path)!r} open (the node's "
            "own, or one where a take-over of it is under way); a take-over would fence it "
            "while it works. Stop that process first, or pass --force to take the node over "
            "anyway"
        ) from None
    if lock is not None:
        lock.release()


def _require_store(
    args: argparse.Namespace, options: dict[str, Any], settings: ClientSettings
) -> None:
    """Refuse a URL that holds no store (a local directory, a remote prefix, memory://):
    calling it an empty store would hide the mistake (a wrong path or prefix), and a
    command that writes would create one there."""
    _require_existing_directory(
        args.url, store=True, storage_options=options or None, settings=settings
    )


def _open_ro(args: argparse.Namespace) -> StreamReader:
    """The read-only tools' view: a `StreamReader`, which never writes to the store (nor
    creates a missing local directory), on a URL that holds a store (`_require_store`)."""
    options = _storage_options(args, args.url)
    settings = _resolved(_settings(args))
    if split_scheme(args.url)[0] in ("file", "memory"):
        _require_store(args, options, settings)  # open_reader checks a remote prefix itself
    return open_reader(
        args.url,
        storage_options=options or None,
        settings=settings,
        metadata=_metadata(args),
    )


# ---------------------------------------------------------------------------------------------
# The parser

_URL_HELP = (
    f"the store: a local directory, s3://bucket/prefix or any fsspec URL (default: ${ENV_URL})"
)
_EPILOG = """\
The store options of -o can also come from the environment: S3STREAM_URL (the store URL),
S3STREAM_METADATA (--metadata), S3STREAM_ENDPOINT_URL and S3STREAM_REGION (for s3://), and
boto3's AWS_* variables (credentials, profile, AWS_ENDPOINT_URL, AWS_REGION). Client settings
come from S3STREAM_<SETTING> as for s3stream.open (S3STREAM_STORE_TIMEOUT_MS=2s,
S3STREAM_COMPACTION__RETENTION_BYTES=1GiB; docs/configuration.md); a flag given wins. Exit
status: 0 OK, 1 failed (a store out of reach, damage found), 2 bad command line, 130
interrupted. More: docs/cli.md.

examples:
  s3stream demo                        # write, close and read back ./s3stream-demo
  s3stream inspect ./s3stream-demo     # its streams and objects
  s3stream dump ./s3stream-demo 0 --limit 5
  s3stream verify s3://bucket/prefix -o endpoint_url=http://localhost:9000
"""
_EXAMPLES = {
    "demo": """\
examples:
  s3stream demo                             # 8 streams, 40,000 batches in ./s3stream-demo
  s3stream demo /tmp/try --batches 2000 --streams 2
  s3stream demo s3://bucket/demo -o endpoint_url=http://localhost:9000""",
    "inspect": """\
examples:
  s3stream inspect ./s3stream-demo
  s3stream inspect s3://bucket/prefix --objects
  s3stream inspect ./s3stream-demo --json | jq '.streams[] | select(.state == "open")'""",
    "dump": """\
examples:
  s3stream dump ./s3stream-demo 0                 # the first 100 batches of stream 0
  s3stream dump ./s3stream-demo 0 --start 500 --limit 10
  s3stream dump ./s3stream-demo 0 --limit 0 --json | wc -l""",
    "verify": """\
examples:
  s3stream verify ./s3stream-demo
  s3stream verify s3://bucket/prefix -o endpoint_url=http://localhost:9000
  s3stream verify ./store --wal /mnt/ebs/node-1.wal --json""",
    "compact": """\
examples:
  s3stream compact ./s3stream-demo --deletion-delay-ms 0
  s3stream compact s3://bucket/prefix --bytes-per-s 0 --sweep-orphans""",
    "take-over": """\
examples:
  s3stream take-over ./store node-1
  s3stream take-over s3://bucket/prefix node-1 -o endpoint_url=http://localhost:9000
  s3stream take-over ./store node-1 --wal file:///mnt/ebs-of-node-1/s3stream.wal""",
}


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal; keeps epilogs (examples) as laid out."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


#: What each command takes, for the message naming a missing URL.
_SYNOPSES = {
    "inspect": "URL",
    "verify": "URL",
    "dump": "URL STREAM",
    "compact": "URL",
    "take-over": "URL NODE",
}


class _IntermixedParser(argparse.ArgumentParser):
    """A command's parser that takes options between its positionals (``dump URL -o k=v 0``):
    with the store URL optional, a plain parser gave the URL to STREAM and then refused the
    stream id as an extra argument."""

    _parsing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        asks_help = args is not None and any(a in ("-h", "--help") for a in args)
        if self._parsing or asks_help:
            # The intermixed parse calls this one (on some versions); and help, printed in
            # its first pass, would meet its positionals' stand-in defaults.
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def _command(
    sub: Any, name: str, fn: Callable[[argparse.Namespace], int], help_: str, description: str
) -> argparse.ArgumentParser:
    c: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=description,
        epilog=_EXAMPLES[name],
        formatter_class=_Formatter,
    )
    c.set_defaults(
        fn=fn, synopsis=f"s3stream {name} {_SYNOPSES.get(name, '')}".rstrip(), command_parser=c
    )
    return c


def _add_store(c: argparse.ArgumentParser, *, url: bool = True) -> None:
    if url:
        c.add_argument("url", nargs="?", metavar="URL", help=_URL_HELP)
    c.add_argument(
        "-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="an option of the object store, e.g. endpoint_url=http://localhost:9000, "
        "profile_name=dev, fsync=false; repeatable (docs/object-stores.md lists them)",
    )  # fmt: skip
    c.add_argument(
        "--store-timeout", type=_store_timeout, default=None, metavar="DURATION",
        help="give up on an object-store call after this long, retries included: 30s, "
        "500ms, 2min, or a bare number of seconds (default: $S3STREAM_STORE_TIMEOUT_MS, "
        "else ClientSettings.store_timeout_ms, 30 s)",
    )  # fmt: skip
    c.add_argument(
        "--metadata", default=None, metavar="URL",
        help="where the store's metadata log lives if not in the store itself, e.g. "
        f"postgresql://user@host:5432/db (default: ${ENV_METADATA}, else the store; "
        "docs/metadata.md)",
    )  # fmt: skip


def _add_json(c: argparse.ArgumentParser, help_: str) -> None:
    c.add_argument("--json", action="store_true", help=help_)


def _add_no_progress(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--no-progress",
        action="store_true",
        help="draw no progress bar (one is drawn on stderr when it is a terminal and tqdm "
        "is installed)",
    )


def _add_unused_node_id(c: argparse.ArgumentParser) -> None:
    # The read-only tools register no node; the option stays for scripts that pass it.
    c.add_argument("--node-id", help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="s3stream",
        description="Look at, check and look after an s3stream store.",
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}",
        help="print the installed s3stream's version and exit",
    )  # fmt: skip
    sub = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_IntermixedParser
    )

    d = _command(
        sub, "demo", _demo, "append, close, read back and verify a realistic workload",
        "Append deterministic batches to a few streams, close (uploading everything), "
        "read everything back through a new reader, checking every byte; prints the rates.",
    )  # fmt: skip
    d.add_argument(
        "dir",
        nargs="?",
        default="./s3stream-demo",
        metavar="DIR",
        help="directory for the demo store, created if missing and empty unless --reuse "
        "(or a store URL such as s3://bucket/demo; default: %(default)s)",
    )
    d.add_argument(
        "--streams",
        type=_demo_streams,
        default=8,
        help=f"streams to append to, at most {MAX_CREATE_BATCH:,} (default: %(default)s)",
    )
    d.add_argument(
        "--batches",
        type=_positive,
        default=40_000,
        help="batches to append in all, round-robin over the streams (default: %(default)s)",
    )
    d.add_argument(
        "--batch-bytes",
        type=_batch_bytes,
        default=1024,
        metavar="SIZE",
        help="payload bytes of each batch: bytes, or 4KiB, 1MiB (default: %(default)s)",
    )
    d.add_argument(
        "--reuse", action="store_true", help="add to a store that is not empty (new streams)"
    )
    _add_store(d, url=False)
    _add_no_progress(d)

    c = _command(
        sub, "inspect", _inspect, "show streams and objects",
        "Show the streams (offsets, stored size, owner node, state, tags) and the objects "
        "(live, and replaced ones awaiting deletion) of a store. Reads only.",
    )  # fmt: skip
    _add_store(c)
    c.add_argument("--objects", action="store_true", help="list every object too")
    c.add_argument(
        "--cost",
        action="store_true",
        help="also list the whole store and price what it holds per month (S3 Standard "
        "us-east-1 prices; one LIST per 1,000 objects)",
    )
    _add_json(c, "print everything as one JSON object, for scripts (docs/cli.md: its keys)")
    _add_unused_node_id(c)

    c = _command(
        sub, "verify", _verify, "read every stream fully, checking every checksum",
        "Check a store: replay the metadata log from its first entry, check the WAL files "
        "of a local store (and those named with --wal), read every stream fully, checking "
        "every checksum. Reads only; exits 1 if anything is damaged.",
    )  # fmt: skip
    _add_store(c)
    c.add_argument(
        "--wal",
        action="append",
        default=[],
        metavar="PATH",
        help="also check this WAL file (repeatable); a local store's own are found",
    )
    _add_json(c, "print the findings as one JSON object, for scripts")
    _add_no_progress(c)
    _add_unused_node_id(c)

    c = _command(
        sub, "dump", _dump, "print the batches of one stream",
        "Print the committed batches of one stream: offset, record count, timestamp, size "
        "and properties. Reads only.",
    )  # fmt: skip
    _add_store(c)
    c.add_argument("stream", type=_stream_id, metavar="STREAM", help="the stream id")
    c.add_argument(
        "--start",
        type=_non_negative,
        default=0,
        help="first offset (default: the stream's start)",
    )
    c.add_argument(
        "--limit",
        type=_non_negative,
        default=100,
        help="batches to print at most, 0 for all (default: %(default)s)",
    )
    _add_json(c, "print one JSON object per line and batch, for scripts")
    _add_unused_node_id(c)

    c = _command(
        sub, "compact", _compact, "run one compaction pass (retention, merge, delete)",
        "Run one compaction pass as a standalone job: apply retention, merge small objects, "
        "delete replaced objects older than the deletion delay (and, with --sweep-orphans, "
        "objects no metadata names). Safe beside running writers and other compactors.",
    )  # fmt: skip
    _add_store(c)
    c.add_argument(
        "--node-id",
        default="compactor",
        help="node id the job writes as (default: %(default)s)",
    )
    c.add_argument(
        "--deletion-delay-ms",
        type=_duration_arg,
        default=None,
        metavar="DURATION",
        help="how long replaced objects stay for readers of an older snapshot before they "
        "are deleted: milliseconds, or 30s, 10min, 1h (default: "
        "$S3STREAM_COMPACTION__DELETION_DELAY_MS, else 600000, 10 min)",
    )
    c.add_argument(
        "--orphan-grace-ms",
        type=_duration_arg,
        default=None,
        metavar="DURATION",
        help="age an object no metadata names must reach before the sweep deletes it: "
        "milliseconds, or 30min, 24h (default: $S3STREAM_COMPACTION__ORPHAN_GRACE_MS, else "
        "86400000, 24 h)",
    )
    c.add_argument(
        "--sweep-orphans",
        action="store_true",
        default=None,
        help="sweep orphaned objects in this pass",
    )
    c.add_argument(
        "--bytes-per-s",
        type=_size_arg,
        default=None,
        metavar="SIZE",
        help="bytes/s the job reads plus writes at most: bytes, or 512KiB, 4MiB (0: no "
        "limit; default: $S3STREAM_COMPACTION__BYTES_PER_S, else 4 MiB/s)",
    )
    c.add_argument(
        "--nice",
        type=_non_negative,
        default=10,
        help="lower this process's CPU priority by this much first (os.nice; 0: keep it; "
        "default: %(default)s)",
    )
    _add_json(c, "print the report as one JSON object, for scripts")
    _add_no_progress(c)

    t = _command(
        sub, "take-over", _take_over,
        "fence a failed node, commit what its WAL holds, release its streams",
        "Take over a node that died: fence it (it can no longer commit), upload and commit "
        "what its WAL acknowledged, and close its streams so any node may open them. "
        "Prints a JSON report.",
    )  # fmt: skip
    _add_store(t)
    t.add_argument("node", metavar="NODE", help="node id of the failed client")
    t.add_argument(
        "--wal",
        metavar="WAL_URL",
        help="the node's WAL: file:///path, s3://bucket/prefix/wal, ... (default: where the "
        "node's WAL is by default for this store)",
    )
    t.add_argument(
        "--node-id",
        default="failover",
        help="node id of this tool (default: %(default)s)",
    )
    t.add_argument(
        "--accept-wal-loss",
        action="store_true",
        help="go on when the node's WAL is missing, emptied or not its own while its streams "
        "are open (the appends it acknowledged and did not upload are lost; logged)",
    )
    t.add_argument(
        "--force",
        action="store_true",
        help="take the node over even when a live process on this host holds its file WAL "
        "(that process is fenced: it can no longer commit)",
    )
    _add_no_progress(t)
    return p


def _version() -> str:
    """The version of the installed package (its metadata, which the build writes)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("s3stream")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _error(command: str, message: object) -> None:
    """One line on stderr, whatever the message holds."""
    text = _shown(" ".join(str(message).split())) or type(message).__name__
    _stderr(f"{command}: error: {text}")


def _stderr(line: str) -> None:
    # When stderr is gone too, the exit status is all that is left to tell.
    with suppress(OSError):
        print(line, file=sys.stderr)


def _silence_stdout() -> None:
    # The reader went away (`| head`): later writes, the flush at exit among them, go to
    # /dev/null instead of raising again (the recipe of Python's signal docs).
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # no file descriptor (captured in-process): nothing will be flushed to a pipe


#: Commands whose loops call `check_interrupt` often enough that a first Ctrl-C only asks them
#: to stop there (see `_Interrupts`).
_POLLING_COMMANDS = frozenset({"demo"})


class _Interrupts:
    """Catch Ctrl-C for the whole command. Calling it raises `KeyboardInterrupt` once there
    was one; long loops call it.

    `deferred` (a command that calls it often, `_POLLING_COMMANDS`): the first Ctrl-C is only
    remembered, and the command stops at its next check, from its own code. Raised wherever
    the main thread is, a `KeyboardInterrupt` can land inside the library's or
    `concurrent.futures`' bookkeeping (between taking a lock and the code that releases it,
    between counting an append in flight and registering what uncounts it) and leave it
    inconsistent, and the close that follows then waits forever: the demo hung so about one
    time in ten on a loaded machine. A second Ctrl-C raises at once. Otherwise the first one
    raises where the main thread is, and is remembered too, because a `KeyboardInterrupt`
    raised inside a future's completion callback is swallowed by `concurrent.futures` (it
    logs it). A command may turn `deferred` off around a step that has no check in it (the
    demo's look at its target: a Ctrl-C waited there for the store probe's 20 s)."""

    def __init__(self, *, deferred: bool) -> None:
        self.deferred = deferred
        self.seen = threading.Event()

    def on_sigint(self, signum: int, frame: object) -> None:
        if self.deferred and not self.seen.is_set():
            self.seen.set()
            return
        self.seen.set()
        raise KeyboardInterrupt

    def __call__(self) -> None:
        if self.seen.is_set():
            raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (docs/cli.md)."""
    for out in (sys.stdout, sys.stderr):
        # Tags and properties are any Unicode: an ASCII or Latin-1 terminal (or a Windows
        # redirect) must get escapes, not a UnicodeEncodeError traceback.
        reconfigure = getattr(out, "reconfigure", None)
        if callable(reconfigure):
            reconfigure(errors="backslashreplace")
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Said with the command's usage (the top-level parser printed its own, which lists
        # the commands, not what this one takes).
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    command = f"s3stream {args.command}"
    # Only the main thread may set a handler (`main` called in-process from another thread
    # keeps Python's default, which raises KeyboardInterrupt there too).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main else None
    args.interrupts = None
    args.check_interrupt = lambda: None
    if in_main:
        args.interrupts = args.check_interrupt = _Interrupts(
            deferred=args.command in _POLLING_COMMANDS
        )
        signal.signal(signal.SIGINT, args.interrupts.on_sigint)
    try:
        return _run(args, command)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)


def _interrupted(args: argparse.Namespace) -> bool:
    """Whether a Ctrl-C came during the command (a deferred one is only remembered)."""
    interrupts = getattr(args, "interrupts", None)
    return interrupts is not None and interrupts.seen.is_set()


def _run(args: argparse.Namespace, command: str) -> int:
    try:
        if hasattr(args, "url"):
            args.url = _store_url(args)
        status = int(args.fn(args))
        # A Ctrl-C a polling command had no check left to see: still an interrupted run.
        args.check_interrupt()
        # A closed pipe shows here at the latest, while it can still be handled quietly.
        sys.stdout.flush()
    except KeyboardInterrupt:
        _stderr(f"{command}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (InvalidArgumentError, StreamNotFoundError) as exc:
        # Said on the command line: an argument, a URL, a path, a stream id.
        _error(command, exc)
        return EXIT_USAGE
    except UnavailableError as exc:
        if _interrupted(args):
            # A Ctrl-C remembered (deferred) while the failing call ran: what was asked for.
            _stderr(f"{command}: interrupted")
            return EXIT_INTERRUPTED
        hint, url = "", getattr(args, "url", None) or getattr(args, "dir", None)
        if url and split_scheme(url)[0] != "file":
            # An endpoint out of reach: how long each call kept trying is the flag's to set.
            hint = " (--store-timeout sets how long each store call keeps trying)"
        _error(command, f"{exc}{hint}")
        return EXIT_FAILED
    except (S3StreamError, OSError) as exc:
        _error(command, exc)
        return EXIT_FAILED
    return status
