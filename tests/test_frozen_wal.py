"""A file WAL on a device that stops answering: every append returns or raises within its
deadline, and what was acknowledged survives the thaw.

Real fault: the WAL lives on a loop-mounted ext4 filesystem that ``fsfreeze`` freezes, so its
``pwritev`` and ``fdatasync`` block in the kernel (uninterruptibly) until it is thawed (root
only; skipped with the reason elsewhere).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import s3stream
from s3stream import ClientSettings, RecordBatch
from s3stream.errors import UnavailableError
from s3stream.testing.disk_faults import frozen_filesystem

CALL_S = 1.0
#: A call may overrun its deadline by scheduling noise, never by the frozen device's time.
SLACK_S = 1.5


def _open(store: Path, wal_dir: Path, **wal_params: str) -> s3stream.StreamClient:
    query = "&".join(["capacity_bytes=4MiB", *(f"{k}={v}" for k, v in wal_params.items())])
    return s3stream.open(
        str(store),
        wal=f"file://{wal_dir / 'node.wal'}?{query}",
        settings=ClientSettings(call_timeout_ms=int(CALL_S * 1000)),
        environ={},
    )


@pytest.mark.parametrize("how", ["sync", "timeout_s", "threads"])
def test_appends_keep_their_deadline_while_the_wal_device_is_frozen(
    tmp_path: Path, how: str
) -> None:
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open(tmp_path / "store", freezer.path)
        try:
            stream = client.create_stream()
            acked = [stream.append(RecordBatch(b"before %d" % i)).base_offset for i in range(5)]
            freezer.freeze()
            timings: list[float] = []
            errors: list[BaseException] = []

            def one_append(i: int) -> None:
                started = time.monotonic()
                try:
                    if how == "timeout_s":
                        stream.append(RecordBatch(b"frozen %d" % i), timeout_s=CALL_S)
                    else:
                        stream.append(RecordBatch(b"frozen %d" % i))
                except UnavailableError as exc:
                    errors.append(exc)
                except BaseException as exc:  # anything else is a failure of the test
                    errors.append(exc)
                timings.append(time.monotonic() - started)

            if how == "threads":
                threads = [threading.Thread(target=one_append, args=(i,)) for i in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(CALL_S + SLACK_S + 5)
                assert not any(t.is_alive() for t in threads), "an append is still blocked"
            else:
                # In a thread, so a test that fails does not hang on the frozen device.
                t = threading.Thread(target=one_append, args=(0,))
                t.start()
                t.join(CALL_S + SLACK_S + 5)
                assert not t.is_alive(), "the append is blocked on the frozen device"
            assert timings and max(timings) <= CALL_S + SLACK_S, timings
            assert errors and all(isinstance(e, UnavailableError) for e in errors), errors
            freezer.thaw()
            # After the thaw the WAL goes on; the frozen appends may or may not have become
            # durable (the error said so), the acknowledged ones are there.
            after = stream.append(RecordBatch(b"after")).base_offset
            got = [b.payload for b in stream.fetch(0, after + 1).batches]
            assert got[: len(acked)] == [b"before %d" % i for i in range(5)]
            assert got[-1] == b"after"
        finally:
            freezer.thaw()
            client.close()


@pytest.mark.parametrize("pending", [True, False])
def test_close_keeps_its_deadline_while_the_wal_device_is_frozen(
    tmp_path: Path, pending: bool
) -> None:
    """`close(timeout_s)` raises `UnavailableError` by its deadline when the WAL cannot close
    (an append it waits for is stuck, or the WAL's own clean-shutdown write is); the WAL
    finishes closing after the thaw and the next client reads every acknowledged batch."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open(tmp_path / "store", freezer.path)
        stream = client.create_stream()
        for i in range(5):
            stream.append(RecordBatch(b"before %d" % i))
        freezer.freeze()
        if pending:
            with pytest.raises(UnavailableError):
                stream.append(RecordBatch(b"frozen"))
        outcome: list[BaseException | None] = []
        started = time.monotonic()

        def close() -> None:
            try:
                client.close(timeout_s=2.0)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=close)
        t.start()
        t.join(2.0 + SLACK_S + 5)
        took = time.monotonic() - started
        alive = t.is_alive()
        freezer.thaw()
        t.join(30)
        assert not alive, "close() is blocked on the frozen device"
        assert took <= 2.0 + SLACK_S, took
        assert len(outcome) == 1 and isinstance(outcome[0], UnavailableError), outcome
        # The WAL finishes closing in the background once the device answers (it holds its
        # file's lock until then); the next client on it sees what was acknowledged.
        deadline = time.monotonic() + 20
        while True:
            try:
                again = _open(tmp_path / "store", freezer.path)
                break
            except s3stream.S3StreamError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with again:
            got = [b.payload for b in again.open_stream(stream.stream_id).fetch(0).batches]
            assert got[:5] == [b"before %d" % i for i in range(5)]
