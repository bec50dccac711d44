"""The memory WAL's append path and what it holds (issue 19).

A large payload is kept as the caller's bytes, apart from its record's head, in the memory WAL
and the LogCache: nothing about it changes but the copy that is no longer made (the WAL
recovers whole records, objects are byte for byte those of joined records, fetches return the
payload). Entries the LogCache evicts are let go at once, so their records are freed.
"""

from __future__ import annotations

import os

import pytest

import s3stream
from s3stream import ClientSettings, InvalidArgumentError, RecordBatch, S3StreamError
from s3stream.cache.log_cache import APART_MIN_BYTES, LogCache
from s3stream.format.batch import WAL_PREFIX, decode_wal_record, encode_batch, encode_batch_head
from s3stream.format.objects import ObjectWriter
from s3stream.records import Record, records_batch
from s3stream.storage.packing import KeyFactory, pack_groups
from s3stream.wal.memory import MemoryWal, MemoryWalMedium

MiB = 1 << 20


def test_a_large_payload_is_not_copied_and_recovers_whole() -> None:
    """Appends of payloads of `APART_MIN_BYTES` or more through a client on a memory WAL: the
    WAL and the LogCache keep the caller's bytes (no copy), fetches return them, the WAL
    recovers each record whole, and what is uploaded reads back the same."""
    medium = MemoryWalMedium()
    settings = ClientSettings(upload_interval_ms=0, upload_threshold_bytes=64 * MiB)
    payloads = [os.urandom(APART_MIN_BYTES), os.urandom(100), os.urandom(100_000)]
    with s3stream.open("memory://", wal=MemoryWal(medium), settings=settings) as client:
        s = client.create_stream()
        for i, p in enumerate(payloads):
            s.append(RecordBatch(p, base_timestamp=i, properties={"k": str(i)} if i else {}))
        big = records_batch([Record(value=b"v" * 20_000, timestamp=7)])
        s.append(big)
        entries = client._storage.log_cache._pending
        # The caller's very bytes: apart from the head for large payloads only.
        assert entries[0][-1] is payloads[0] and entries[2][-1] is payloads[2]
        assert entries[1][-1] == b""
        stored = [r.data for r in medium.records]
        assert stored[0].endswith(payloads[0]) and stored[2].endswith(payloads[2])
        for pos, data in enumerate(stored):
            _epoch, batch, _ = decode_wal_record(data)
            assert batch.base_offset == pos
        got = s.fetch(0, max_bytes=1 << 30).batches
        assert [b.payload for b in got][:3] == payloads
        assert got[3].payload == big.payload
        # A new WAL over the medium (a crash) recovers the same whole records.
        assert [r.data for r in MemoryWal(medium).recover()] == stored
        client.flush()
        # Uploaded (and evicted from the LogCache): read back from the object.
        committed = client.read(s.stream_id, 0, max_bytes=1 << 30).batches
        assert [b.payload for b in committed] == [*payloads, big.payload]


def test_objects_of_payloads_apart_are_those_of_joined_records() -> None:
    """`pack_groups` over entries whose payloads are apart makes the same bytes as over
    entries of whole records (as `ObjectWriter.add` lays them out), RECORDS batches too."""
    settings = ClientSettings(block_target_bytes=64 * 1024, stream_split_bytes=200_000)
    apart_cache, whole_cache = LogCache(0), LogCache(0)
    offsets = [0, 0]
    prefix = WAL_PREFIX.pack(1, 1)
    for i in range(60):
        sid = i % 2
        size = APART_MIN_BYTES + 997 * i if i % 3 else 10 + i
        if i % 7 == 3:
            batch = records_batch([Record(value=b"r" * size, timestamp=100 + i)])
        else:
            batch = RecordBatch(os.urandom(size), base_timestamp=50 - i)
        ts = batch.base_timestamp if batch.base_timestamp is not None else 0
        off, kind, props = offsets[sid], int(batch.kind), batch.properties
        whole = encode_batch(sid, off, batch.count, kind, ts, props, batch.payload, prefix=prefix)
        whole_cache.put(
            sid, off, batch.count, ts, kind, props, batch.payload, whole, WAL_PREFIX.size, i, 1
        )
        apart = len(batch.payload) >= APART_MIN_BYTES
        head = (
            encode_batch_head(
                sid, off, batch.count, kind, ts, props, len(batch.payload), prefix=prefix
            )
            if apart
            else whole
        )
        apart_cache.put(
            sid, off, batch.count, ts, kind, props, batch.payload, head, WAL_PREFIX.size, i, 1,
            payload_apart=apart,
        )  # fmt: skip
        offsets[sid] += batch.count
    assert apart_cache.pending_bytes == whole_cache.pending_bytes
    assert apart_cache.untaken_bytes == whole_cache.untaken_bytes
    for sid in (0, 1):
        a = apart_cache.read(sid, 0, 1 << 40, 1 << 40)[0]
        w = whole_cache.read(sid, 0, 1 << 40, 1 << 40)[0]
        assert [b.payload for b in a] == [b.payload for b in w]
        assert [(b.base_offset, b.properties) for b in a] == [
            (b.base_offset, b.properties) for b in w
        ]
    got = pack_groups(apart_cache.take().groups, settings, KeyFactory("n", 1))
    want = pack_groups(whole_cache.take().groups, settings, KeyFactory("n", 1))
    assert [o.data for o in got] == [o.data for o in want]
    assert [o.ranges for o in got] == [o.ranges for o in want]
    assert [o.times for o in got] == [o.times for o in want]


def test_object_writer_checks_a_head_and_its_payload() -> None:
    """`ObjectWriter.add` with a payload apart takes only a head that ends where the payload
    begins, of the payload's length."""
    payload = os.urandom(5000)
    head = encode_batch_head(3, 0, 1, 0, 9, {}, len(payload))
    w = ObjectWriter()
    with pytest.raises(InvalidArgumentError):
        w.add(3, 0, 1, 9, head, payload[:-1])
    with pytest.raises(InvalidArgumentError):
        w.add(3, 0, 1, 9, head + b"x", payload)
    w.add(3, 0, 1, 9, head, payload)
    ref = ObjectWriter()
    ref.add(3, 0, 1, 9, encode_batch(3, 0, 1, 0, 9, {}, payload))
    assert w.finish() == ref.finish()


def test_the_memory_wal_refuses_what_append_refuses_in_two_parts() -> None:
    """`MemoryWal.append_and_wait` refuses what `append` refuses: not bytes, too large, before
    recovery, after close; and stores nothing then."""
    wal = MemoryWal()
    with pytest.raises(S3StreamError):
        wal.append_and_wait(b"h", b"p")  # not recovered yet
    list(wal.recover())
    with pytest.raises(InvalidArgumentError):
        wal.append_and_wait(b"h", bytearray(b"p"))  # type: ignore[arg-type]
    limit = wal.capabilities.max_record_bytes
    with pytest.raises(InvalidArgumentError):
        wal.append_and_wait(b"h", bytes(limit))
    assert wal.append_and_wait(b"h", b"p") == 0
    assert wal.append_and_wait(b"x") == 1
    assert [r.data for r in wal.medium.records] == [b"hp", b"x"]
    wal.close()
    with pytest.raises(S3StreamError):
        wal.append_and_wait(b"h", b"p")
    assert len(wal.medium.records) == 2


def test_evicted_entries_are_let_go_at_once() -> None:
    """An entry the LogCache evicts is no longer referenced by it (its record is freed): the
    cache held evicted 64 KiB records until they were half of a stream's list, ~400 MiB with
    the default budgets."""
    cache = LogCache(4 * 70_000)
    payload = bytes(64 * 1024)
    for i in range(40):
        record = encode_batch(1, i, 1, 0, 0, {}, payload, prefix=WAL_PREFIX.pack(1, 1))
        cache.put(1, i, 1, 0, 0, {}, payload, record, WAL_PREFIX.size, i, 1)
        if i % 10 == 9:
            cache.mark_uploaded(cache.take())
    # Four entries fit in what the uploaded ones may hold; the rest are gone from the list.
    assert cache.first_offset(1) == 36
    # Evicted slots hold no record (the list is cut later, once it is mostly evicted).
    held = sum(len(e[6]) + len(e[11]) for e in cache._streams[1].entries)
    assert held == 4 * len(record)
    assert [b.base_offset for b in cache.read(1, 36, 40, 1 << 30)[0]] == [36, 37, 38, 39]
