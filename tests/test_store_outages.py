"""Every blocking call returns or raises within its deadline against a frozen S3 server.

A SeaweedFS server of this module's own is stopped with SIGSTOP: its sockets still accept
connections (the kernel does that) but nothing answers, the worst case for a client. Each
public call must end (normally or with an `S3StreamError`) within its deadline plus 5 s:
`store_timeout_ms` for calls that are sequences of store requests, `call_timeout_ms` for the
calls that wait on the pipeline (append, flush, close).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import ClientSettings, CompactionSettings, RecordBatch, S3StreamError
from s3stream.testing.seaweedfs import SeaweedS3Server, SeaweedUnavailable

pytestmark = pytest.mark.s3

STORE_S = 3.0
CALL_S = 6.0
MARGIN_S = 5.0
SETTINGS = ClientSettings(
    store_timeout_ms=int(STORE_S * 1000),
    call_timeout_ms=int(CALL_S * 1000),
    backpressure_timeout_ms=int(CALL_S * 1000),
    upload_interval_ms=100,
    log_cache_bytes=0,
    block_cache_bytes=0,
    compaction=CompactionSettings(bytes_per_s=0),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3Server]:
    srv = SeaweedS3Server(tmp_path_factory.mktemp("frozen-seaweedfs"))
    try:
        srv.start()
    except SeaweedUnavailable as exc:
        pytest.skip(f"SeaweedFS cannot run here: {exc}")
    try:
        yield srv
    finally:
        srv.stop()


def ends_within(limit_s: float, call: Callable[[], Any]) -> str:
    """Run `call`; assert it ended (returned or raised S3StreamError) within `limit_s`."""
    started = time.monotonic()
    try:
        call()
        outcome = "returned"
    except S3StreamError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    assert took <= limit_s, f"took {took:.1f} s (limit {limit_s:.1f} s): {outcome}"
    return outcome


def test_every_call_ends_within_its_deadline_on_a_frozen_server(
    server: SeaweedS3Server, tmp_path: Path
) -> None:
    url = f"s3://{server.bucket}/frozen-{uuid.uuid4().hex}"
    opts = server.storage_options()
    writer = s3stream.open(url, node_id="w", storage_options=opts, settings=SETTINGS)
    stream = writer.create_stream()
    for i in range(20):
        stream.append(RecordBatch(f"batch {i}".encode() * 50))
    writer.flush()
    crashed = s3stream.open(url, node_id="gone", storage_options=opts, settings=SETTINGS)
    crashed.create_stream().append(RecordBatch(b"in gone's WAL"))
    crashed.abandon()
    reader = s3stream.open(
        url, node_id="r", wal="memory://", storage_options=opts, settings=SETTINGS
    )
    with server.frozen():
        store_limit = STORE_S + MARGIN_S
        call_limit = CALL_S + MARGIN_S
        outcomes = {
            "open": ends_within(
                store_limit,
                lambda: s3stream.open(
                    url, node_id="late", storage_options=opts, settings=SETTINGS
                ).close(),
            ),
            "read": ends_within(store_limit, lambda: reader.read(stream.stream_id, 0)),
            "fetch": ends_within(store_limit, lambda: stream.fetch(0)),
            "append": ends_within(call_limit, lambda: stream.append(RecordBatch(b"frozen"))),
            "append_async": ends_within(
                call_limit, lambda: stream.append_async(RecordBatch(b"async")).result(CALL_S)
            ),
            "flush": ends_within(call_limit, writer.flush),
            "compact": ends_within(store_limit, writer.compact),
            "take_over": ends_within(store_limit, lambda: writer.take_over("gone")),
            "list_streams": ends_within(store_limit, writer.list_streams),
            "close": ends_within(call_limit, writer.close),
            "reader.close": ends_within(call_limit, reader.close),
        }
    # The calls that need the store failed (nothing can succeed against a frozen server).
    # (flush may return: the appends made while frozen failed, so nothing was left to upload.)
    for name in ("open", "read", "append", "take_over", "list_streams"):
        assert outcomes[name] != "returned", (name, outcomes[name])
    # Thawed: nothing acknowledged was lost; a new client sees the 20 batches uploaded before.
    with s3stream.open(url, node_id="w", storage_options=opts, settings=SETTINGS) as again:
        got = again.read(stream.stream_id, 0, max_bytes=1 << 30).batches
        assert [b.payload for b in got][:20] == [f"batch {i}".encode() * 50 for i in range(20)]


def test_a_close_keeps_its_own_deadline_shorter_than_the_stores(
    server: SeaweedS3Server,
) -> None:
    """close(timeout_s=1.5) with store_timeout_ms=8000 on a frozen server: its release
    commit made two store calls in turn, each retrying for its full 8 s (12.7 s in all).
    The retry layer now also ends by the deadline of the call it serves, and so does a try
    in flight (one try added up to a third of store_timeout_ms: close(1) took 4.3 s with a
    20 s store timeout)."""
    url = f"s3://{server.bucket}/close-{uuid.uuid4().hex}"
    slow = ClientSettings(store_timeout_ms=8000, call_timeout_ms=8000, upload_interval_ms=100)
    writer = s3stream.open(
        url, node_id="w", wal="memory://", storage_options=server.storage_options(), settings=slow
    )
    writer.create_stream().append(RecordBatch(b"x"))
    writer.flush()
    with server.frozen():
        ends_within(1.5 + 1.0, lambda: writer.close(timeout_s=1.5))


def test_a_trim_keeps_the_call_deadline_on_a_frozen_server(server: SeaweedS3Server) -> None:
    """`Stream.trim` uploads what it trims past and commits: the upload kept
    `call_timeout_ms` and the commit then retried each store call for `store_timeout_ms`
    (one trim took both in turn). Both share one `call_timeout_ms` now."""
    url = f"s3://{server.bucket}/trim-{uuid.uuid4().hex}"
    slow = ClientSettings(store_timeout_ms=8000, call_timeout_ms=2000, upload_interval_ms=60_000)
    writer = s3stream.open(
        url, node_id="w", wal="memory://", storage_options=server.storage_options(), settings=slow
    )
    stream = writer.create_stream()
    for i in range(4):
        stream.append(RecordBatch(b"x%d" % i))
    writer.flush()
    stream.append(RecordBatch(b"not uploaded"))
    with server.frozen():
        # Below the committed end (a commit only), then past it (an upload first).
        for start in (2, 5):
            outcome = ends_within(2.0 + 1.0, lambda start=start: stream.trim(start))  # type: ignore[misc]
            assert outcome.startswith("UnavailableError"), outcome
    stream.trim(5)
    assert stream.start_offset == 5
    writer.close()


def test_a_long_poll_does_not_wait_for_a_frozen_store(server: SeaweedS3Server) -> None:
    """An empty long poll asks whether another client took its stream over: that read of the
    metadata runs on a thread of its own, so on a frozen store the poll still ends after its
    `wait_s` (not after `store_timeout_ms`), and an append made meanwhile (durable in the WAL)
    still reaches the waiting poll at once."""
    url = f"s3://{server.bucket}/poll-{uuid.uuid4().hex}"
    slow = ClientSettings(store_timeout_ms=8000, upload_interval_ms=60_000)
    writer = s3stream.open(
        url, node_id="w", wal="memory://", storage_options=server.storage_options(), settings=slow
    )
    stream = writer.create_stream()
    with server.frozen():
        for _ in range(3):
            assert ends_within(1.5, lambda: stream.fetch(0, wait_s=0.3)) == "returned"
        timer = threading.Timer(0.2, lambda: stream.append(RecordBatch(b"while frozen")))
        timer.start()
        got = stream.fetch(0, wait_s=5)
        timer.join()
        assert [b.payload for b in got.batches] == [b"while frozen"]
    writer.close()


def test_a_compaction_whose_output_put_freezes_keeps_one_store_timeout(
    server: SeaweedS3Server,
) -> None:
    """The server stops answering at a compaction's first output PUT: the task then also
    deleted its outputs from that server before raising, a second store timeout (15 s with
    an 8 s one). The outputs are left to the next pass now."""
    url = f"s3://{server.bucket}/compact-{uuid.uuid4().hex}"
    slow = ClientSettings(
        store_timeout_ms=6000,
        upload_interval_ms=60_000,
        compaction=CompactionSettings(interval_ms=0, stream_set_min_objects=2),
    )
    writer = s3stream.open(
        url, node_id="w", wal="memory://", storage_options=server.storage_options(), settings=slow
    )
    stream = writer.create_stream()
    for i in range(4):
        stream.append(RecordBatch(b"x%d" % i * 100))
        writer.flush()
    store = writer.compactor._executor._store  # type: ignore[attr-defined]
    real_put = store.put
    frozen = contextlib.ExitStack()

    def put(key: str, data: bytes) -> None:
        if not frozen_at:
            frozen_at.append(key)
            frozen.enter_context(server.frozen())
        real_put(key, data)

    frozen_at: list[str] = []

    store.put = put
    try:
        outcome = ends_within(6.0 + 1.0, writer.compact)  # one store timeout
    finally:
        frozen.close()
        store.put = real_put
    assert outcome.startswith("UnavailableError"), outcome
    assert writer.compact().tasks  # thawed: the next pass compacts (its room freed first)
    writer.close()


def test_a_close_does_not_wait_for_readahead_on_a_frozen_server(server: SeaweedS3Server) -> None:
    """A sequential reader's next fetch is served from the cache while the readahead planning
    reads the next object's index on a readahead thread, against the frozen server: the
    client's close joined that thread, a store timeout (13.2 s for close(1) with a 20 s
    store timeout). It now waits for readahead within its own deadline only."""
    url = f"s3://{server.bucket}/readahead-{uuid.uuid4().hex}"
    opts = server.storage_options()
    with s3stream.open(
        url, wal="memory://", storage_options=opts, settings={"upload_interval_ms": 60_000}
    ) as writer:
        stream = writer.create_stream()
        for obj in range(3):
            for i in range(8):
                stream.append(RecordBatch(bytes([obj * 10 + i]) * 1000))
            writer.flush()
        sid = stream.stream_id
    settings = {
        "store_timeout_ms": 20_000,
        "readahead_initial_bytes": 16 * 1024,
        "readahead_max_bytes": 64 * 1024,
    }
    reader = s3stream.open(
        url, wal="memory://", node_id="r", storage_options=opts, settings=settings
    )
    s = reader.open_stream(sid)
    page = s.fetch(0, max_bytes=2000)
    with server.frozen():
        page = s.fetch(page.next_offset, max_bytes=2000)  # from the cache: plans ahead
        assert page.batches
        time.sleep(0.3)
        ends_within(1 + 1.0, lambda: reader.close(timeout_s=1))


def test_an_append_that_timed_out_and_then_failed_is_counted_once(
    server: SeaweedS3Server,
) -> None:
    """A synchronous append with `timeout_s` on an object WAL whose server froze: its caller
    got the timeout (counted as ``TimeoutError``), and when the WAL's PUT gave up a moment
    later the same append was counted again (``UnavailableError``): two errors for one."""
    url = f"s3://{server.bucket}/counted-{uuid.uuid4().hex}"
    quick = ClientSettings(store_timeout_ms=1000, call_timeout_ms=4000, upload_interval_ms=100)
    writer = s3stream.open(
        url, node_id="w", storage_options=server.storage_options(), settings=quick
    )
    try:
        stream = writer.create_stream()
        stream.append(RecordBatch(b"before"))
        reg = writer.metrics.registry
        with server.frozen():
            with pytest.raises(S3StreamError):
                stream.append(RecordBatch(b"frozen"), timeout_s=0.3)
            time.sleep(2.5)  # the WAL's PUT gives up after its store deadline (1 s)
        errors = reg.family("s3stream.append.errors")
        assert errors is not None
        assert {p.labels: p.value for p in errors.points} == {("TimeoutError",): 1}
    finally:
        with contextlib.suppress(S3StreamError):
            writer.close(timeout_s=5)


def test_compaction_with_retention_ends_within_its_deadline_on_a_frozen_server(
    server: SeaweedS3Server, postgres: Any
) -> None:
    """Eight streams with a retention policy, the metadata in PostgreSQL (up all along), and a
    compactor that has read no index yet (a standalone `s3stream compact`): retention took
    each stream's outage as that stream's problem and went on to the next, a store timeout
    each (8 streams: 19.9 s; 16: 37 s). An outage now ends the pass."""
    url = f"s3://{server.bucket}/retention-{uuid.uuid4().hex}"
    opts = server.storage_options()
    meta = postgres.url()
    week = {"retention.ms": str(7 * 86_400_000)}
    with s3stream.open(
        url, node_id="w", wal="memory://", storage_options=opts, settings=SETTINGS, metadata=meta
    ) as writer:
        for _ in range(8):
            writer.create_stream(tags=week).append(RecordBatch(b"x" * 100))
            writer.flush()  # an object per stream
    compactor = s3stream.open(
        url, node_id="c", wal="memory://", storage_options=opts, settings=SETTINGS, metadata=meta
    )
    try:
        with server.frozen():
            outcome = ends_within(STORE_S + MARGIN_S, compactor.compact)
        assert outcome.startswith("UnavailableError"), outcome
    finally:
        compactor.close()


def _concurrently(calls: list[Callable[[], Any]]) -> list[float]:
    """Run `calls` at once, each in a thread; the seconds each took to end (returned or
    raised `S3StreamError`)."""
    took = [0.0] * len(calls)

    def run(i: int) -> None:
        started = time.monotonic()
        with contextlib.suppress(S3StreamError):
            calls[i]()
        took[i] = time.monotonic() - started

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return took


def test_concurrent_calls_of_one_client_do_not_queue_on_a_frozen_server(
    server: SeaweedS3Server,
) -> None:
    """Six threads' `list_streams` (each refreshing the metadata first) ended in turn, one
    store timeout after the other (2.2, 4.3, ... 13.1 s); they now share refreshes, and each
    ends within one store timeout. A close in their midst keeps its own deadline: its release
    commit waited for the lock the refreshes held (1 s took 6.2 s)."""
    url = f"s3://{server.bucket}/queue-{uuid.uuid4().hex}"
    opts = server.storage_options()
    client = s3stream.open(
        url, node_id="q", wal="memory://", storage_options=opts, settings=SETTINGS
    )
    client.create_stream().append(RecordBatch(b"x"))
    client.flush()
    try:
        with server.frozen():
            took = _concurrently([client.list_streams] * 6)
            assert max(took) <= STORE_S + 2, [f"{t:.1f}" for t in took]
            calls: list[Callable[[], Any]] = [client.list_streams] * 3
            calls.append(lambda: (time.sleep(0.3), client.close(timeout_s=1)))
            took = _concurrently(calls)
            assert took[-1] <= 0.3 + 1 + 1.5, f"close(timeout_s=1) took {took[-1] - 0.3:.1f} s"
    finally:
        with contextlib.suppress(S3StreamError):  # reports how the close above ended
            client.close()


def test_aio_calls_do_not_queue_for_threads_on_a_frozen_server(server: SeaweedS3Server) -> None:
    """16 fetches at once through the asyncio client: its four call threads took them in
    rounds of four, one store timeout each (the last ended after 8.6 s); now each ends within
    one store timeout, and a call no thread takes within `call_timeout_ms` fails."""
    import asyncio

    import s3stream.aio

    url = f"s3://{server.bucket}/aio-{uuid.uuid4().hex}"
    opts = server.storage_options()
    with s3stream.open(url, node_id="w", wal="memory://", storage_options=opts) as writer:
        stream = writer.create_stream()
        for i in range(16):
            stream.append(RecordBatch(f"batch {i}".encode()))
        stream_id = stream.stream_id

    async def fetches() -> list[float]:
        client = await s3stream.aio.open(
            url, node_id="r", wal="memory://", storage_options=opts, settings=SETTINGS
        )
        try:
            s = await client.open_stream(stream_id)

            async def one(offset: int) -> float:
                started = time.monotonic()
                with contextlib.suppress(S3StreamError):
                    await s.fetch(offset, offset + 1)
                return time.monotonic() - started

            with server.frozen():
                return list(await asyncio.gather(*(one(i) for i in range(16))))
        finally:
            await client.close(timeout_s=1)

    took = asyncio.run(fetches())
    assert max(took) <= STORE_S + 2, [f"{t:.1f}" for t in took]


# -- SeaweedFS killed and restarted -----------------------------------------------------------

RESTART_SETTINGS = ClientSettings(
    store_timeout_ms=int(STORE_S * 1000),
    call_timeout_ms=int(CALL_S * 1000),
    backpressure_timeout_ms=2000,
    upload_interval_ms=100,
    compaction=CompactionSettings(bytes_per_s=0),
)


def _append_outcomes(stream: Any, tag: str, count: int) -> tuple[list[bytes], list[str]]:
    """Append `count` batches; return the payloads acknowledged and the errors of the rest."""
    acked: list[bytes] = []
    errors: list[str] = []
    for i in range(count):
        payload = f"{tag} {i}".encode() * 20
        try:
            stream.append(RecordBatch(payload))
            acked.append(payload)
        except S3StreamError as exc:
            assert exc.retryable, f"an outage made a non-retryable error: {exc!r}"
            errors.append(type(exc).__name__)
    return acked, errors


def _check_after_restart(
    url: str, opts: dict[str, Any], stream_id: int, acked: list[bytes]
) -> None:
    """A fresh client (another node, after a take-over) reads exactly `acked`, in order."""
    with s3stream.open(
        url, node_id="checker", wal="memory://", storage_options=opts, settings=RESTART_SETTINGS
    ) as reader:
        got = reader.read(stream_id, 0, max_bytes=1 << 30).batches
        assert [b.payload for b in got] == acked


@pytest.mark.parametrize("wal_kind", ["file", "s3"])
def test_appends_resume_after_the_server_is_killed_and_restarted(
    server: SeaweedS3Server, tmp_path: Path, wal_kind: str
) -> None:
    """Kill SeaweedFS under a running client and start it again: the client resumes by
    itself (no reopen), and every acknowledged append is there, once, in order."""
    url = f"s3://{server.bucket}/restart-{wal_kind}-{uuid.uuid4().hex}"
    opts = server.storage_options()
    wal = f"file://{tmp_path / 'w.wal'}?capacity=64MiB" if wal_kind == "file" else None
    client = s3stream.open(
        url, node_id="w", wal=wal, storage_options=opts, settings=RESTART_SETTINGS
    )
    try:
        stream = client.create_stream()
        acked, _ = _append_outcomes(stream, "before", 50)
        assert len(acked) == 50
        client.flush()
        server.kill()
        # With the S3 WAL each append waits out its deadline: three show it as well as ten.
        tried = 10 if wal_kind == "file" else 3
        during, errors = _append_outcomes(stream, "during", tried)
        if wal_kind == "file":
            # The local WAL still acknowledges; only the uploads wait for the server.
            assert len(during) == tried, errors
            with pytest.raises(S3StreamError) as caught:
                client.flush(timeout_s=2)
            assert caught.value.retryable
        else:
            # The WAL is the store: nothing can be acknowledged while it is down.
            assert during == [] and errors, (during, errors)
        acked += during
        server.restart()
        # No reopen: the same client takes appends and uploads them again.
        # The first append after a restart may still meet the repair under way: retry it.
        give_up = time.monotonic() + 2 * RESTART_SETTINGS.call_timeout_ms / 1000
        while True:
            first, errors = _append_outcomes(stream, "first after", 1)
            if first:
                acked += first
                break
            assert time.monotonic() < give_up, errors
        after, errors = _append_outcomes(stream, "after", 50)
        assert len(after) == 50 and not errors, errors
        acked += after
        client.flush()
        got = stream.fetch(0, max_bytes=1 << 30).batches
        assert [b.payload for b in got] == acked
    finally:
        client.close()
    _check_after_restart(url, opts, stream.stream_id, acked)


def test_a_crashed_writer_survives_a_server_restart(
    server: SeaweedS3Server, tmp_path: Path
) -> None:
    """Appends acknowledged by the S3 WAL whose client dies, then a server restart: a new
    owner taking over finds them all."""
    url = f"s3://{server.bucket}/restart-crash-{uuid.uuid4().hex}"
    opts = server.storage_options()
    client = s3stream.open(url, node_id="w", storage_options=opts, settings=RESTART_SETTINGS)
    stream = client.create_stream()
    acked, _ = _append_outcomes(stream, "acked", 40)
    assert len(acked) == 40
    client.abandon()
    server.restart()
    with s3stream.open(
        url, node_id="next", storage_options=opts, settings=RESTART_SETTINGS
    ) as successor:
        successor.take_over("w")
        got = successor.read(stream.stream_id, 0, max_bytes=1 << 30).batches
        assert [b.payload for b in got] == acked


def test_a_spark_read_of_a_frozen_store_ends_after_one_store_deadline(
    server: SeaweedS3Server,
) -> None:
    """A Spark task's GETs (one at a time, `fetchConcurrency=1`) against a store that stopped
    answering: when the first GET gave up, the thread it freed had already taken the next
    queued one, and the pool's shutdown waited out that GET's deadline too (40.8 s for a
    20.5 s one). Once one GET fails with an outage, the rest fail at once."""
    import json
    import random

    from s3stream.clock import SystemClock
    from s3stream.objectstore.s3 import S3ObjectStore
    from s3stream.objectstore.stack import store_stack
    from s3stream.spark.fetch import fetch_slices
    from s3stream.spark.options import parse_options
    from s3stream.spark.source import S3StreamBatchReader

    prefix = f"spark-frozen-{uuid.uuid4().hex}"
    url = f"s3://{server.bucket}/{prefix}"
    opts = server.storage_options()
    with s3stream.open(url, wal="memory://", storage_options=opts) as writer:
        stream = writer.create_stream()
        for i in range(4):  # four objects: four GETs in one task
            stream.append(RecordBatch(b"v%d" % i))
            writer.flush()
    options = {"path": url, "storageOptions": json.dumps(opts), "fetchConcurrency": "1"}
    parts = S3StreamBatchReader(parse_options(options, streaming=False)).partitions()
    slices = [s for p in parts for s in p.plan.slices]
    store = store_stack(
        S3ObjectStore(server.bucket, prefix, **opts),
        clock=SystemClock(),
        rng=random.Random(0),
        timeout_s=STORE_S,
    )
    try:
        with server.frozen():
            started = time.monotonic()
            with pytest.raises(S3StreamError):
                list(fetch_slices(store, slices, concurrency=1, fail_on_data_loss=True))
            took = time.monotonic() - started
        # One GET's deadline (2.4 s measured), not two (4.5 s).
        assert took < 1.3 * STORE_S, f"{took:.1f} s for a {STORE_S} s store deadline"
    finally:
        store.close()


def test_the_process_ends_soon_after_a_close_on_a_frozen_server(server: SeaweedS3Server) -> None:
    """close(timeout_s=1) kept its deadline against a frozen server, but the process then
    did not end until the upload's PUT in flight gave up (6.2 s with a 30 s store timeout):
    the PUT pool's threads were joined at the interpreter's exit. They are daemons now."""
    import subprocess
    import sys

    url = f"s3://{server.bucket}/exit-{uuid.uuid4().hex}"
    child = f"""
import sys, s3stream
from s3stream import ClientSettings, RecordBatch
c = s3stream.open({url!r}, node_id="e", storage_options={server.storage_options()!r},
    settings=ClientSettings(store_timeout_ms=30000, call_timeout_ms=30000,
                            upload_interval_ms=100))
s = c.create_stream(); s.append(RecordBatch(b"z")); c.flush(); s.append(RecordBatch(b"w"))
print("READY", flush=True)
sys.stdin.readline()
try:
    c.close(timeout_s=1)
except s3stream.S3StreamError:
    pass
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "READY"
        with server.frozen():
            started = time.monotonic()
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(60)
            took = time.monotonic() - started
        assert took < 4.0, f"the process ended {took:.1f} s after close(timeout_s=1)"
    finally:
        proc.kill()
        proc.wait()


def test_tails_closed_while_their_read_waits_on_a_frozen_server_end_cleanly(
    server: SeaweedS3Server,
) -> None:
    """A tail whose read waits on a frozen store when its reader (or its stream's client)
    closes ended with `UnavailableError` ("the store was closed"), retryable, where the docs
    say a tail ends cleanly at a close: the read failed because of the close."""
    url = f"s3://{server.bucket}/tail-close-{uuid.uuid4().hex}"
    opts = server.storage_options()
    with s3stream.open(url, wal="memory://", storage_options=opts) as writer:
        writer.create_stream().append(RecordBatch(b"a0"))
    slow = {"store_timeout_ms": 15_000, "call_timeout_ms": 20_000}

    def tail_in_thread(batches: Iterator[Any]) -> tuple[threading.Thread, list[object]]:
        ended: list[object] = []

        def run() -> None:
            try:
                for b in batches:
                    ended.append(bytes(b.payload))
                ended.append("ended")
            except BaseException as exc:
                ended.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        return thread, ended

    reader = s3stream.open_reader(url, storage_options=opts, settings=slow)
    client = s3stream.open(url, wal="memory://", node_id="c", storage_options=opts, settings=slow)
    stream = client.open_stream(0)  # the tail reads the object: nothing of it is cached
    with server.frozen():
        tails = [tail_in_thread(reader.tail(0, 0, poll_s=0.2)), tail_in_thread(stream.tail(0))]
        time.sleep(1)
        ends_within(3.0, reader.close)
        with contextlib.suppress(S3StreamError):
            client.close(timeout_s=2)
        for thread, ended in tails:
            thread.join(10)
            assert not thread.is_alive(), "the tail still waits"
            assert ended == ["ended"], ended
