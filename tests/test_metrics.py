"""Observability: the metrics registry, its exporters (Prometheus, OpenTelemetry), the cost
ledger against a real S3 server's requests, and log records with node and stream."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    ManualClock,
    MetricsRegistry,
    ObjectWalSettings,
    PriceTable,
    RecordBatch,
)
from s3stream.metrics import catalog, store_cost
from s3stream.metrics.cost import GIB, SECONDS_PER_MONTH
from s3stream.metrics.instruments import Kind, MetricSpec
from s3stream.metrics.ledger import CostLedger
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.stack import store_stack
from s3stream.objectstore.wrappers import MetricsObjectStore
from s3stream.wal.base import WalPosition
from s3stream.wal.memory import MemoryWal
from s3stream.wal.object import ObjectWal

#: How long each append of the known workload takes on the manual clock: between two bucket
#: bounds (2.5 ms and 5 ms), so float rounding of the clock cannot move it across one.
APPEND_S = 0.004
N_APPENDS = 50
PAYLOAD = b"p" * 100
RECORDS_PER_BATCH = 2

QUIET = ClientSettings(upload_interval_ms=0)


class SlowWal(MemoryWal):
    """A memory WAL whose every append takes `APPEND_S` on a manual clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self._clock = clock

    def append_and_wait(self, head: bytes, tail: bytes = b"") -> WalPosition:
        # What `append` calls too, and what the client calls (`acks_on_call`).
        self._clock.advance(APPEND_S)
        return super().append_and_wait(head, tail)


def known_workload(registry: MetricsRegistry | None = None) -> s3stream.StreamClient:
    """50 appends of 100 bytes and 2 records, each taking 4 ms; one fetch of everything
    (from the LogCache); one flush (one upload of one object). Returns the open client."""
    clock = ManualClock()
    client = s3stream.StreamClient(
        MemoryObjectStore(), SlowWal(clock), clock=clock, settings=QUIET,
        metrics_registry=registry,
    )  # fmt: skip
    s = client.create_stream()
    for _ in range(N_APPENDS):
        s.append(RecordBatch(PAYLOAD, count=RECORDS_PER_BATCH))
    assert len(s.fetch(0, max_bytes=1 << 20).batches) == N_APPENDS
    client.flush()
    return client


# ==============================================================================================
# The registry
# ==============================================================================================

SPEC_C = MetricSpec("t.count", Kind.COUNTER, "{x}", "test counter", ("k",))
SPEC_H = MetricSpec("t.lat", Kind.HISTOGRAM, "s", "test histogram", bounds=(0.1, 1.0))


def test_counters_add_up_across_threads_and_outlive_their_threads() -> None:
    reg = MetricsRegistry()
    cell = reg.counter(SPEC_C).cell("a")

    def work() -> None:
        for _ in range(10_000):
            cell.add()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.total("t.count") == 80_000
    # The rows of the ended threads were folded into the retired totals; counting goes on.
    cell.add(5)
    assert reg.total("t.count", k="a") == 80_005
    # A cell made after a thread's first update lengthens that thread's row.
    late = reg.counter(SPEC_C).cell("b")
    late.add(2)
    assert reg.family("t.count") is not None
    assert {p.labels: p.value for p in reg.family("t.count").points} == {  # type: ignore[union-attr]
        ("a",): 80_005,
        ("b",): 2,
    }


def test_histogram_buckets_are_upper_bounds() -> None:
    reg = MetricsRegistry()
    h = reg.histogram(SPEC_H).cell()
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    (point,) = reg.family("t.lat").points  # type: ignore[union-attr]
    # Buckets: <= 0.1, <= 1.0, the rest; an observation equal to a bound is in its bucket.
    assert point.bucket_counts == (2, 2, 1)
    assert point.count == 5
    assert point.value == pytest.approx(4.65)


def test_a_metric_name_has_one_definition() -> None:
    reg = MetricsRegistry()
    reg.counter(SPEC_C)
    assert reg.counter(SPEC_C) is reg.counter(SPEC_C)
    with pytest.raises(s3stream.InvalidArgumentError):
        reg.counter(MetricSpec("t.count", Kind.COUNTER, "By", "other unit", ("k",)))
    with pytest.raises(s3stream.InvalidArgumentError):
        reg.counter(SPEC_C).cell("a", "b")


def test_clients_sharing_a_registry_add_up() -> None:
    reg = MetricsRegistry()
    with (
        s3stream.StreamClient(MemoryObjectStore(), MemoryWal(), metrics_registry=reg) as a,
        s3stream.StreamClient(
            MemoryObjectStore(), MemoryWal(), node_id="b", metrics_registry=reg
        ) as b,
    ):
        for client in (a, b):
            client.create_stream().append(RecordBatch(PAYLOAD))
        assert reg.total("s3stream.append.duration") == 2
        assert reg.total("s3stream.append.bytes") == 2 * len(PAYLOAD)
        assert a.metrics.registry is b.metrics.registry is reg


def test_every_metric_is_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "observability.md").read_text()
    for spec in catalog.ALL.values():
        assert f"`{spec.name}`" in doc, f"{spec.name} is not in docs/observability.md"
        for label in spec.labels:
            assert f"`{label}`" in doc, f"label {label} of {spec.name} is not documented"


# ==============================================================================================
# What the client records
# ==============================================================================================


def test_the_client_records_appends_fetches_uploads_and_requests() -> None:
    client = known_workload()
    try:
        reg = client.metrics.registry
        appends = reg.family("s3stream.append.duration")
        assert appends is not None
        (point,) = appends.points
        assert point.count == N_APPENDS
        assert point.value == pytest.approx(N_APPENDS * APPEND_S, rel=1e-4)
        assert point.bucket_counts[LATENCY_INDEX_5MS] == N_APPENDS
        assert reg.total("s3stream.append.bytes") == N_APPENDS * len(PAYLOAD)
        assert reg.total("s3stream.append.records") == N_APPENDS * RECORDS_PER_BATCH
        assert reg.total("s3stream.fetch.duration") == 1
        assert reg.total("s3stream.fetch.records") == N_APPENDS * RECORDS_PER_BATCH
        assert reg.total("s3stream.cache.requests", tier="log", result="hit") == 1
        assert reg.total("s3stream.upload.objects") == 1
        assert reg.total("s3stream.objectstore.requests", purpose="upload") == 1
        # The old snapshots read the same numbers.
        m = client.metrics
        assert (m.storage.appends, m.storage.append_bytes) == (N_APPENDS, 5000)
        assert (m.storage.uploads, m.storage.objects_uploaded) == (1, 1)
        assert m.object_store.puts == 1  # the upload; the metadata log uses conditional puts
        assert reg.total("s3stream.metadata.commit.duration", outcome="written") == (
            m.object_store.conditional_puts
        )
    finally:
        client.close()


#: Index of the 5 ms bucket (``le=0.005``) in the latency histograms.
LATENCY_INDEX_5MS = catalog.APPEND_DURATION.bounds.index(0.005)


def test_a_failed_append_is_counted_by_its_error() -> None:
    clock = ManualClock()
    with s3stream.StreamClient(MemoryObjectStore(), MemoryWal(), clock=clock) as client:
        s = client.create_stream()
        with pytest.raises(s3stream.InvalidArgumentError):
            s.append(RecordBatch(b"x" * (65 << 20)))  # over the WAL's record limit
        reg = client.metrics.registry
        assert reg.total("s3stream.append.errors", **{"error.type": "InvalidArgumentError"}) == 1
        assert reg.total("s3stream.append.duration") == 0


def test_requests_are_put_down_to_their_purpose() -> None:
    """A client whose object WAL shares its store stack (as `s3stream.open` builds it for a
    remote store): WAL, metadata, upload, read and compaction traffic each under its own
    purpose, and the WAL's only through calls it makes itself."""
    clock = s3stream.SystemClock()
    stack = store_stack(MemoryObjectStore(), clock=clock, rng=random.Random(1), timeout_s=5)
    wal_settings = ObjectWalSettings(wal_batch_interval_ms=1)

    def wal(node: str, epoch: int, on_full: Any) -> ObjectWal:
        return ObjectWal(stack, node_id=node, node_epoch=epoch, prefix="wal", clock=clock,
                         on_full=on_full, retry=False, settings=wal_settings)  # fmt: skip

    settings = ClientSettings(upload_interval_ms=0, log_cache_bytes=0)
    with s3stream.StreamClient(stack, wal, clock=clock, settings=settings) as client:
        s = client.create_stream()
        for f in [s.append_async(RecordBatch(PAYLOAD)) for _ in range(10)]:
            f.result(timeout=30)
        client.flush()
        assert len(s.fetch(0).batches) == 10  # the LogCache keeps nothing uploaded: objects
        client.compact(sweep_orphans=True)
        reg = client.metrics.registry

        def requests(purpose: str) -> float:
            return reg.total("s3stream.objectstore.requests", purpose=purpose)

        assert reg.total("s3stream.objectstore.requests", purpose="wal", request="PutObject") > 0
        assert requests("metadata") > 0
        assert (
            reg.total("s3stream.objectstore.requests", purpose="upload", request="PutObject") == 1
        )
        assert reg.total("s3stream.objectstore.requests", purpose="read", request="GetObject") > 0
        assert (
            reg.total(
                "s3stream.objectstore.requests", purpose="compaction", request="ListObjectsV2"
            )
            > 0
        )
        assert requests("other") == 0
        # Calls and requests agree where nothing was retried.
        calls = reg.family("s3stream.objectstore.operation.duration")
        assert calls is not None and calls.total(purpose="upload", operation="put") == 1


def test_a_file_wal_reports_its_group_commits(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=QUIET) as client:
        s = client.create_stream()
        for _ in range(20):
            s.append(RecordBatch(PAYLOAD))
        reg = client.metrics.registry
        assert 1 <= reg.total("s3stream.wal.commit.duration") <= 20
        assert reg.total("s3stream.wal.commit.records") == 20
        assert reg.total("s3stream.wal.commit.bytes") > 20 * len(PAYLOAD)
        assert reg.total("s3stream.wal.used") > 0
        assert reg.total("s3stream.wal.capacity") >= reg.total("s3stream.wal.used")


class _LongTriesStore(MemoryObjectStore):
    """A store whose tries may each take 30 s (as a remote one's), so that a call with a
    shorter deadline runs each try in a thread of its own (`within_deadline`)."""

    @property
    def attempt_timeout_s(self) -> float | None:
        return 30.0


def test_a_try_run_apart_to_keep_a_deadline_keeps_its_purpose() -> None:
    """`close(timeout_s=2)` with 30 s tries: the release commit's PUT ran in a thread of its
    own, which had the caller's context variables but not the purpose (a thread-local), so
    its request was counted under ``other``; the same for the deletes the GCS and Azure
    stores send from a pool (`map_in_context`)."""
    clock = s3stream.SystemClock()
    stack = store_stack(_LongTriesStore(), clock=clock, rng=random.Random(1), timeout_s=60)
    client = s3stream.StreamClient(stack, MemoryWal(), clock=clock)
    s = client.create_stream()
    s.append(RecordBatch(PAYLOAD))
    client.flush()
    reg = client.metrics.registry
    before = reg.total("s3stream.objectstore.requests", purpose="metadata", request="PutObject")
    client.close(timeout_s=2)
    assert reg.total("s3stream.objectstore.requests", purpose="other") == 0
    assert (
        reg.total("s3stream.objectstore.requests", purpose="metadata", request="PutObject") > before
    )
    from s3stream.objectstore._common import map_in_context

    pooled = MetricsObjectStore(MemoryObjectStore(), registry=MetricsRegistry())
    view = pooled.for_purpose("compaction")
    view.put("a", b"1")

    def counted(key: str) -> str:
        pooled.head(key)  # on the stack itself: counted under the purpose in force
        return pooled.current_purpose()

    previous = pooled.enter_purpose("compaction")
    try:
        assert map_in_context(counted, ["a", "b", "c"], 3, "test") == ["compaction"] * 3
    finally:
        pooled.leave_purpose(previous)
    assert pooled.current_purpose() == "other"
    assert pooled.registry.total("s3stream.objectstore.requests", purpose="other") == 0


def test_store_views_keep_their_purpose_per_thread() -> None:
    reg = MetricsRegistry()
    stack = MetricsObjectStore(MemoryObjectStore(), registry=reg)
    views = {p: stack.for_purpose(p) for p in ("read", "upload")}
    start = threading.Barrier(2)

    def work(purpose: str) -> None:
        start.wait()
        for i in range(300):
            views[purpose].put(f"{purpose}/{i}", b"abc")
        assert len(list(views[purpose].list(purpose + "/"))) == 300

    threads = [threading.Thread(target=work, args=(p,)) for p in views]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for purpose in views:
        assert (
            reg.total("s3stream.objectstore.requests", purpose=purpose, request="PutObject") == 300
        )
        assert (
            reg.total("s3stream.objectstore.requests", purpose=purpose, request="ListObjectsV2")
            == 1
        )
        assert reg.total("s3stream.objectstore.keys", purpose=purpose, operation="list") == 300
    with pytest.raises(s3stream.InvalidArgumentError):
        stack.for_purpose("fun")


# ==============================================================================================
# Exporters
# ==============================================================================================


def test_prometheus_scrape_after_a_known_workload() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from s3stream.metrics.prometheus import S3StreamCollector

    client = known_workload()
    try:
        scrape = prometheus_client.CollectorRegistry()
        scrape.register(S3StreamCollector(client.metrics.registry, labels={"node": "local"}))
        families = {
            f.name: f for f in text_string_to_metric_families(generate_latest(scrape).decode())
        }
    finally:
        client.close()

    def sample(family: str, suffix: str = "", **labels: str) -> float:
        (value,) = [
            s.value
            for s in families[family].samples
            if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return float(value)

    appends = families["s3stream_append_duration_seconds"]
    assert (appends.type, appends.unit) == ("histogram", "seconds")
    assert sample("s3stream_append_duration_seconds", "_count", node="local") == N_APPENDS
    assert sample("s3stream_append_duration_seconds", "_sum") == pytest.approx(
        N_APPENDS * APPEND_S, rel=1e-4
    )
    assert sample("s3stream_append_duration_seconds", "_bucket", le="0.0025") == 0
    assert sample("s3stream_append_duration_seconds", "_bucket", le="0.005") == N_APPENDS
    assert sample("s3stream_append_duration_seconds", "_bucket", le="+Inf") == N_APPENDS
    assert (families["s3stream_append_bytes"].type, families["s3stream_append_bytes"].unit) == (
        "counter",
        "bytes",
    )
    assert sample("s3stream_append_bytes", "_total") == N_APPENDS * len(PAYLOAD)
    assert sample("s3stream_append_records", "_total") == N_APPENDS * RECORDS_PER_BATCH
    assert sample("s3stream_fetch_records", "_total") == N_APPENDS * RECORDS_PER_BATCH
    assert sample("s3stream_cache_requests", "_total", tier="log", result="hit") == 1
    assert sample("s3stream_upload_objects", "_total") == 1
    assert families["s3stream_upload_duration_seconds"].type == "histogram"
    assert (
        sample("s3stream_objectstore_requests", "_total", purpose="upload", request="PutObject")
        == 1
    )
    assert families["s3stream_cache_size_bytes"].type == "gauge"
    assert sample("s3stream_cache_size_bytes", tier="log") > 0
    assert families["s3stream_cost_monthly"].type == "gauge"
    assert sample("s3stream_cost_monthly", kind="requests") > 0


def test_a_collector_registers_once_per_registry() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from s3stream.metrics.prometheus import S3StreamCollector

    scrape = prometheus_client.CollectorRegistry()
    reg = MetricsRegistry()
    scrape.register(S3StreamCollector(reg))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        scrape.register(S3StreamCollector(reg))


def test_opentelemetry_in_memory_reader_after_a_known_workload() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from s3stream.metrics.otel import register_otel

    client = known_workload()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        register_otel(
            client.metrics.registry, provider, bucket="b", attributes={"service.instance.id": "n"}
        )
        data = reader.get_metrics_data()
    finally:
        client.close()
        provider.shutdown()
    assert data is not None
    metrics = {
        m.name: m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        if sm.scope.name == "s3stream"
        for m in sm.metrics
    }

    def points(name: str, **attrs: str) -> list[Any]:
        return [
            p
            for p in metrics[name].data.data_points
            if all(p.attributes.get(k) == v for k, v in attrs.items())
        ]

    assert metrics["s3stream.append.duration.count"].unit == "{observation}"
    (count,) = points("s3stream.append.duration.count")
    assert count.value == N_APPENDS
    assert count.attributes["messaging.system"] == "s3stream"
    assert count.attributes["messaging.operation.name"] == "append"
    assert count.attributes["service.instance.id"] == "n"
    assert metrics["s3stream.append.duration.sum"].unit == "s"
    (total,) = points("s3stream.append.duration.sum")
    assert total.value == pytest.approx(N_APPENDS * APPEND_S, rel=1e-4)
    (le5,) = points("s3stream.append.duration.bucket", le="0.005")
    assert le5.value == N_APPENDS
    assert metrics["s3stream.append.bytes"].unit == "By"
    assert points("s3stream.append.bytes")[0].value == N_APPENDS * len(PAYLOAD)
    assert metrics["messaging.client.sent.messages"].unit == "{message}"
    assert points("messaging.client.sent.messages")[0].value == N_APPENDS * RECORDS_PER_BATCH
    assert points("messaging.client.consumed.messages")[0].value == (N_APPENDS * RECORDS_PER_BATCH)
    (put,) = points("s3stream.objectstore.requests", **{"s3stream.purpose": "upload"})
    assert put.value == 1
    assert put.attributes["rpc.method"] == "PutObject"
    assert put.attributes["rpc.system"] == "aws-api"
    assert put.attributes["aws.s3.bucket"] == "b"
    assert metrics["s3stream.cache.size"].unit == "By"
    assert points("s3stream.cache.size", **{"s3stream.tier": "log"})[0].value > 0


# ==============================================================================================
# The cost ledger
# ==============================================================================================


def test_cost_is_the_rate_over_the_window_times_a_month() -> None:
    clock = ManualClock()
    reg = MetricsRegistry()
    store = MetricsObjectStore(MemoryObjectStore(), registry=reg, clock=clock)
    ledger = CostLedger(reg, clock, stored_bytes=lambda: 10 * GIB, window_s=600)
    for i in range(1000):
        store.put(f"k{i}", b"x")
    for i in range(500):
        store.get(f"k{i}")
    clock.advance(100)
    report = ledger.cost()
    assert report.window_s == pytest.approx(100)
    assert report.count("PutObject") == 1000 and report.count("GetObject") == 500
    puts = 1000 / 100 * SECONDS_PER_MONTH * 0.005 / 1000
    gets = 500 / 100 * SECONDS_PER_MONTH * 0.0004 / 1000
    assert report.requests_usd_per_month == pytest.approx(puts + gets)
    assert puts == pytest.approx(131.4)
    assert report.storage_usd_per_month == pytest.approx(0.23)
    assert report.by_purpose() == {"other": pytest.approx(puts + gets)}
    # An hour of silence later the window holds no request: the rate is 0.
    clock.advance(3600)
    quiet = ledger.cost()
    assert quiet.requests_usd_per_month == 0 and quiet.window_s == pytest.approx(3600)
    assert quiet.requests[0].total == 1000 or quiet.requests[1].total == 1000
    # Another provider's prices.
    dearer = CostLedger(reg, clock, prices=PriceTable(name="x", put_per_1000=0.01))
    store.put("more", b"y")
    clock.advance(1)
    assert dearer.cost().requests_usd_per_month == pytest.approx(SECONDS_PER_MONTH * 0.01 / 1000)


def test_frequent_cost_calls_keep_the_window() -> None:
    """Each `cost` call (each scrape of the cost gauge) kept a snapshot in a list of 4,096:
    two scrapes a second for two hours measured over 2,048 s instead of the hour, and a
    burst of 5,000 calls over under a second."""
    clock = ManualClock()
    reg = MetricsRegistry()
    store = MetricsObjectStore(MemoryObjectStore(), registry=reg, clock=clock)
    ledger = CostLedger(reg, clock, window_s=3600)
    for i in range(2 * 3600 * 2):
        if i % 20 == 0:
            store.put(f"k{i}", b"x")
        clock.advance(0.5)
        report = ledger.cost()
    assert report.window_s >= 3600
    assert report.count("PutObject") == pytest.approx(360, abs=2)  # one every 10 s
    for _ in range(5000):
        clock.advance(0.0001)
        report = ledger.cost()
    assert report.window_s >= 3600


def test_a_take_overs_uploads_count_in_the_taking_clients_metrics(tmp_path: Path) -> None:
    """The replay of a taken-over node's WAL uploaded into a registry of its own: the
    taking client's ``s3stream.upload.*`` stayed at 0 while its store requests moved."""
    a = s3stream.open(str(tmp_path), node_id="a", settings=QUIET)
    s = a.create_stream()
    for i in range(3):
        s.append(RecordBatch(b"x%d" % i))
    a.abandon()
    with s3stream.open(str(tmp_path), node_id="b", settings=QUIET) as b:
        report = b.take_over("a")
        assert report.recovery.uploaded_batches == 3
        storage = b.metrics.storage
        assert storage.uploads == 1 and storage.objects_uploaded == 1
        assert storage.appends == 0  # replayed records are not appends of this client


def test_a_stack_reset_before_a_client_adopts_it_reports_no_negative_counts() -> None:
    stack = store_stack(
        MemoryObjectStore(), clock=s3stream.SystemClock(), rng=random.Random(0), timeout_s=30
    )
    for i in range(10):
        stack.put(f"seed/{i}", b"x" * 100)
    stack.reset()  # a baseline of 10 PUTs, in the stack's own registry
    with s3stream.StreamClient(stack, MemoryWal(), node_id="n1") as client:
        m = client.metrics.object_store
        assert m.puts >= 0 and m.put_bytes >= 0 and m.requests >= 0, m


def test_a_read_of_a_stream_not_owned_counts_as_a_fetch_from_objects(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), node_id="w", settings=QUIET) as writer:
        sid = writer.create_stream().stream_id
        writer.open_stream(sid).append(RecordBatch(b"x"))
    with s3stream.open(str(tmp_path), node_id="r", wal="memory://") as reader:
        assert len(reader.read(sid, 0).batches) == 1
        storage = reader.metrics.storage
        assert (storage.fetches_from_cache, storage.fetches_from_objects) == (0, 1)


def test_client_cost_and_store_cost(tmp_path: Path) -> None:
    settings = ClientSettings(upload_interval_ms=0)
    with s3stream.open(str(tmp_path), settings=settings) as client:
        s = client.create_stream()
        for _ in range(20):
            s.append(RecordBatch(PAYLOAD))
        client.flush()
        report = client.metrics.cost()
        assert report.prices.name == "aws-s3-standard-us-east-1"
        assert report.stored_bytes == sum(o.size for o in client.metadata.state.objects.values())
        assert report.storage_usd_per_month == pytest.approx(report.stored_bytes / GIB * 0.023)
        assert report.to_dict()["stored_bytes"] == report.stored_bytes
    with s3stream.open_reader(str(tmp_path)) as reader:
        cost = store_cost(reader)
        areas = {a.prefix: a for a in cost.areas}
        assert {"data", "meta"} <= set(areas)
        assert cost.live_bytes == areas["data"].bytes and cost.orphan_bytes == 0
        assert cost.stored_bytes == sum(a.bytes for a in cost.areas)
        assert cost.list_requests == 1
        assert cost.to_dict()["areas"]


@pytest.mark.s3
def test_cost_ledger_counts_every_request_the_s3_server_gets(seaweedfs: Any) -> None:
    """The ledger's request counts, by S3 API name, equal the HTTP requests botocore sent,
    counted independently through botocore's own ``before-send`` event: the object WAL's
    conditional PUTs, the uploads, the metadata log, reads of objects and compaction's list
    and deletes included."""
    from s3stream.objectstore.s3 import S3ObjectStore

    sent: Counter[str] = Counter()
    lock = threading.Lock()

    def on_send(event_name: str, **_: Any) -> None:
        with lock:
            sent[event_name.rsplit(".", 1)[-1]] += 1

    raw = S3ObjectStore(seaweedfs.bucket, f"cost-{uuid.uuid4().hex}", **seaweedfs.storage_options())
    make_client = raw._make_client

    def hooked() -> Any:
        boto = make_client()
        boto.meta.events.register("before-send.s3", on_send)
        return boto

    raw._make_client = hooked  # type: ignore[method-assign]
    clock = s3stream.SystemClock()
    stack = store_stack(raw, clock=clock, rng=random.Random(7), timeout_s=30)

    def wal(node: str, epoch: int, on_full: Any) -> ObjectWal:
        return ObjectWal(stack, node_id=node, node_epoch=epoch, prefix="wal", clock=clock,
                         on_full=on_full, retry=False,
                         settings=ObjectWalSettings(wal_batch_interval_ms=5))  # fmt: skip

    settings = ClientSettings(upload_interval_ms=0, log_cache_bytes=0, block_target_bytes=512)
    client = s3stream.StreamClient(stack, wal, settings=settings, clock=clock)
    try:
        streams = [client.create_stream() for _ in range(2)]
        for _ in range(3):
            for s in streams:
                for f in [s.append_async(RecordBatch(PAYLOAD * 4)) for _ in range(5)]:
                    f.result(timeout=30)
            client.flush()
        for s in streams:
            assert len(s.fetch(0).batches) > 0  # from objects: the LogCache keeps none
        client.compact(sweep_orphans=True)
    finally:
        client.close()
    report = client.metrics.cost()
    counted = Counter({r.request: 0 for r in report.requests})
    for r in report.requests:
        counted[r.request] += r.total
    assert sum(sent.values()) > 0
    assert +counted == +sent
    purposes = {r.purpose for r in report.requests if r.total}
    assert {"wal", "metadata", "upload", "read", "compaction"} <= purposes


# ==============================================================================================
# Logs
# ==============================================================================================


def test_client_log_records_carry_node_and_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    with s3stream.open(str(store), wal="memory://", node_id="n1") as a:
        sid = a.create_stream().stream_id
        with (
            caplog.at_level(logging.WARNING, logger="s3stream"),
            s3stream.open(str(store), wal="memory://", node_id="n2") as b,
        ):
            b.open_stream(sid, force=True)
    records = [r for r in caplog.records if "force=True" in r.getMessage()]
    assert records, caplog.text
    assert records[0].node_id == "n2"  # type: ignore[attr-defined]
    assert records[0].stream_id == sid  # type: ignore[attr-defined]
    adapter = b.logger
    with caplog.at_level(logging.INFO, logger="s3stream"):
        adapter.info("plain")
        adapter.for_stream(7).info("about a stream", extra={"extra_field": 1})
    plain, about = [r for r in caplog.records if r.getMessage() in ("plain", "about a stream")]
    assert (plain.node_id, plain.stream_id) == ("n2", None)  # type: ignore[attr-defined]
    assert (about.node_id, about.stream_id) == ("n2", 7)  # type: ignore[attr-defined]
    assert about.extra_field == 1  # type: ignore[attr-defined]


def test_wal_compaction_and_take_over_records_carry_the_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every record the library logs says which node it is about (``node_id``): here the file
    WAL's recovery, a loss accepted, a compaction pass and a take-over, all in one process."""
    store = tmp_path / "store"
    small = s3stream.FileWalSettings(capacity_bytes=1 << 20)
    with caplog.at_level(logging.DEBUG, logger="s3stream"):
        crashed = s3stream.open(str(store), node_id="n1", file_wal_settings=small)
        crashed.create_stream().append(RecordBatch(b"acknowledged"))
        crashed.abandon()
        (store / "wal" / "n1.wal").unlink()  # its WAL is lost: the take-over must accept it
        with s3stream.open(str(store), node_id="n2", file_wal_settings=small) as healthy:
            healthy.take_over("n1", wal=(store / "wal" / "n1.wal").as_uri(), accept_wal_loss=True)
            healthy.compact()
    records = [r for r in caplog.records if r.name.startswith("s3stream")]
    assert {r.name for r in records} >= {"s3stream.failover", "s3stream.wal"}, caplog.text
    missing = [(r.name, r.getMessage()) for r in records if not getattr(r, "node_id", None)]
    assert not missing, missing


def test_a_shared_registry_forgets_closed_clients_gauges_and_keeps_their_counts() -> None:
    """Clients sharing one registry registered callbacks that outlived them: with none
    open, the registry still reported three WALs' capacity, objects counted once per client
    that had seen them, and it kept every closed client's WAL and metadata alive."""
    import gc
    import weakref

    registry = MetricsRegistry()
    store = MemoryObjectStore()
    alive = []
    for _ in range(3):
        client = s3stream.StreamClient(store, MemoryWal(), metrics_registry=registry)
        s = client.create_stream()
        s.append(RecordBatch(b"x" * 1000))
        client.flush()
        s.fetch(0)
        open_objects = registry.total("s3stream.data.objects")
        hits_open = registry.total("s3stream.cache.requests")
        client.close()
        alive.append(weakref.ref(client.metadata))
        assert registry.total("s3stream.data.objects") == 0  # a gauge: gone with its client
        assert registry.total("s3stream.cache.requests") == hits_open  # a counter: kept
        assert open_objects > 0
        del client, s
    gc.collect()
    assert [r() for r in alive] == [None, None, None]


def test_misused_metric_calls_raise_clear_errors(tmp_path: Path) -> None:
    """Found by a first-hour review: `cost(window_s="abc")` raised a bare ValueError and
    accepted NaN, inf and True; `total(name, purpose=...)` on a metric without that label
    raised ``tuple.index(x): x not in tuple``; a collector label named like a metric's own
    label (or ``le``) was dropped from every sample without a word; `take_over` on an
    in-memory client blamed a WAL instance nobody gave."""
    prometheus_client = pytest.importorskip("prometheus_client")
    del prometheus_client
    from s3stream.metrics.prometheus import S3StreamCollector

    with s3stream.open("memory://") as client:
        client.create_stream().append(RecordBatch(b"x"))
        for bad in ("abc", "1", True, [1]):
            with pytest.raises(s3stream.InvalidArgumentError, match="window_s must be a number"):
                client.metrics.cost(window_s=bad)  # type: ignore[arg-type]
        for bad in (float("nan"), float("inf"), 0, -1, -0.5, 10**400, -(10**400)):
            # One message for all (-1 was told ">= 0", and then 0 was refused).
            with pytest.raises(s3stream.InvalidArgumentError, match="finite number > 0"):
                client.metrics.cost(window_s=bad)
        assert client.metrics.cost(window_s=5).requests_usd_per_month >= 0
        with pytest.raises(s3stream.InvalidArgumentError, match="has no label 'purpose'"):
            client.metrics.registry.total("s3stream.metadata.seq", purpose="x")
        for labels in ({"purpose": "x"}, {"le": "1"}, {"a-b": "1", "a_b": "2"}):
            with pytest.raises(s3stream.InvalidArgumentError, match="choose other names"):
                S3StreamCollector(client.metrics.registry, labels=labels)
        S3StreamCollector(client.metrics.registry, labels={"node": "n1"})
        # Label names Prometheus refuses (the whole scrape with them): refused here.
        for name in ("__name__", "", "1st", "__x"):
            with pytest.raises(s3stream.InvalidArgumentError, match="not a Prometheus label"):
                S3StreamCollector(client.metrics.registry, labels={name: "v"})
        # Several registries on one collector: each told apart by its label values.
        both = S3StreamCollector(client.metrics.registry, labels={"node": "a"})
        for labels in ({"node": "a"}, {"host": "b"}, {"node": "b", "x": "c"}):
            with pytest.raises(s3stream.InvalidArgumentError, match="labels"):
                both.add(MetricsRegistry(), labels=labels)
        with pytest.raises(s3stream.InvalidArgumentError, match="reported already"):
            both.add(client.metrics.registry, labels={"node": "b"})
        with pytest.raises(s3stream.InvalidArgumentError, match="names this collector"):
            S3StreamCollector(client.metrics.registry).add(MetricsRegistry(), labels={})
        with pytest.raises(s3stream.InvalidArgumentError, match="its WAL lives in memory"):
            client.take_over("other")


def test_a_bad_price_table_is_refused_and_a_failing_callback_spares_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`PriceTable(classes={"PutObject": "put"})`, `classes=None` and NaN or infinite prices
    were accepted; then every `cost()` raised (a bare KeyError), and so did the collection of
    the cost gauge, which took the whole registry's collection (every exported metric) with
    it. The table is checked when made now, and a callback that fails at collection reports
    what it reported last, the other metrics unharmed."""
    from s3stream import PriceTable
    from s3stream.metrics.cost import RequestClass

    for bad in (
        {"classes": {"PutObject": "put"}},
        {"classes": None},
        {"classes": {1: RequestClass.PUT}},
        {"put_per_1000": float("nan")},
        {"storage_gb_month": float("inf")},
        {"get_per_1000": -1},
    ):
        with pytest.raises(s3stream.InvalidArgumentError):
            PriceTable(**bad)
    reg = MetricsRegistry()
    spec = MetricSpec("test.observed", Kind.COUNTER, "1", "observed", ("k",))
    calls = iter([[(("a",), 5.0)], RuntimeError("component broke")])

    def observed() -> list[tuple[tuple[str, ...], float]]:
        got = next(calls)
        if isinstance(got, BaseException):
            raise got
        return got

    reg.observe(spec, observed)
    reg.counter(catalog.APPEND_BYTES).cell().add(7)
    assert reg.total("test.observed") == 5
    with caplog.at_level(logging.WARNING, logger="s3stream.metrics.instruments"):
        families = {f.spec.name: f for f in reg.collect()}
    assert reg.total("test.observed") == 5  # what it reported last: a counter never goes back
    assert "test.observed" in families and catalog.APPEND_BYTES.name in families
    assert "a callback failed at collection" in caplog.text


def test_store_cost_tells_orphans_from_replaced_objects_by_key(tmp_path: Path) -> None:
    """Orphans were the data bytes less the listed ones: an object listed as replaced but
    already purged (a crash between a purge's delete and its commit) hid as many orphan
    bytes, and still counted as replaced."""
    import os

    with s3stream.open(str(tmp_path / "s"), wal="memory://") as client:
        stream = client.create_stream()
        for _ in range(3):
            stream.append(RecordBatch(os.urandom(20_000)))
            client.flush()
        client.compact()
    with s3stream.open_reader(str(tmp_path / "s")) as reader:
        replaced = [o for o in reader.objects() if not o.live]
        assert len(replaced) == 3
        (tmp_path / "s" / replaced[0].key).unlink()
        orphan = tmp_path / "s" / "data" / "local" / "99" / "000000000000-m.s3o"
        orphan.parent.mkdir(parents=True)
        orphan.write_bytes(os.urandom(replaced[0].size - 100))
        cost = store_cost(reader)
    assert cost.orphan_bytes == replaced[0].size - 100
    assert cost.deleting_bytes == sum(o.size for o in replaced[1:])
