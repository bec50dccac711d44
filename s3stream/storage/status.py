"""The pipeline's shared status: one condition and the flags the parts of `Storage` signal
each other by.

The appender, the uploader, the committer and the facade's flush/close all wait on the one
condition here, so that every change they wait for (an upload committed, the WAL repaired, the
client failing or closing) wakes exactly the waiters it concerns, with no polling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import FencedError, S3StreamError, StreamClosedError
from ..metrics.logs import ContextLogger

__all__ = ["PipelineStatus", "dropped_message"]


class PipelineStatus:
    """Flags shared by the parts of the pipeline; read and written under `cond`."""

    def __init__(self, log: ContextLogger) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.log = log
        self._node_lost: list[Callable[[S3StreamError], None]] = []
        #: Fatal: the client takes no more appends (fenced, corrupted, a background bug).
        self.failed: S3StreamError | None = None
        #: `failed` came from the WAL alone (the node still owns its streams): what was
        #: acknowledged can still be uploaded, and flush and close do so.
        self.failed_in_wal = False
        #: Retryable WAL failure under repair by the uploader; appends wait until it clears.
        self.wal_error: S3StreamError | None = None
        #: Set when the WAL refused an append for want of room, until the next upload trims
        #: it: later appends wait for room outside the append lock instead of each waiting
        #: the WAL's full_wait_ms in turn inside it.
        self.wal_full = False
        #: No more appends (set under the appender's lock, read by waiters under `cond`).
        self.closing = False
        #: The uploader finishes what is pending and ends.
        self.stop = False
        #: The uploader ends at once, leaving what is not uploaded in the WAL.
        self.abandoned = False
        #: Upload everything now (flush, backpressure, a full WAL), in bounded uploads.
        self.upload_requested = False
        #: An append crossed the upload threshold and woke the uploader (cleared by it): the
        #: appenders after it do not wake it again.
        self.upload_woken = False
        self.upload_error: S3StreamError | None = None
        #: Failed upload attempts since the client opened (flush counts those during its wait).
        self.upload_failures = 0
        #: Set when the uploader thread ended by an unexpected error (a bug): `flush` and
        #: `close` raise it rather than wait for a thread that is gone.
        self.thread_error: S3StreamError | None = None
        #: Appends whose WAL write has not completed yet.
        self.outstanding = 0
        #: Acknowledged appends dropped because another owner took their stream: reported by
        #: the next `flush` (then cleared) and by `close` (all of them).
        self.dropped: list[str] = []
        self.dropped_unreported: list[str] = []

    def notify(self) -> None:
        """Wake every waiter (they re-check what they wait for)."""
        with self.cond:
            self.cond.notify_all()

    def wake_uploader(self) -> None:
        """Wake the uploader: enough is pending for an upload (it decides what to take)."""
        with self.cond:
            self.upload_woken = True
            self.cond.notify_all()

    def request_upload(self) -> None:
        """Ask the uploader to upload everything pending now."""
        with self.cond:
            self.upload_requested = True
            self.cond.notify_all()

    def raise_if_broken(self, *, but_wal: bool = False) -> None:
        """Raise the fatal error or the uploader's death, if any (under `cond`); with
        `but_wal`, not a failure of the WAL alone."""
        if self.failed is not None and not (but_wal and self.failed_in_wal):
            raise self.failed
        if self.thread_error is not None:
            raise self.thread_error

    def raise_if_closing(self) -> None:
        """Raise if appends are refused for good (under `cond`)."""
        self.raise_if_broken()
        if self.closing:
            raise StreamClosedError("the client is closed")

    def raise_dropped(self) -> None:
        """Report acknowledged appends dropped since the last report (under `cond`)."""
        if self.dropped_unreported:
            dropped, self.dropped_unreported = self.dropped_unreported, []
            raise FencedError(dropped_message(dropped))

    def add_dropped(self, what: str) -> None:
        """Remember acknowledged appends lost to another owner, for flush and close."""
        with self.cond:
            self.dropped.append(what)
            self.dropped_unreported.append(what)
            self.cond.notify_all()

    def fail(self, err: S3StreamError, *, in_wal: bool = False) -> None:
        """Stop the client for good: a failed WAL write leaves a hole in offsets, so nothing
        after it may be acknowledged. `in_wal`: the WAL failed (uploads may go on); a later
        failure of the node itself (fenced) takes its place."""
        node_lost = False
        with self.cond:
            if self.failed is None or (self.failed_in_wal and not in_wal):
                if self.failed is None:
                    self.log.error("the client takes no more appends: %s", err)
                self.failed = err
                self.failed_in_wal = in_wal
                # Taken over: the streams are another node's now. Any other failure (a WAL
                # that could not be repaired, a bug) leaves what was acknowledged readable.
                node_lost = isinstance(err, FencedError)
            self.cond.notify_all()
        if node_lost:
            for listener in list(self._node_lost):
                listener(err)

    def on_node_lost(self, listener: Callable[[S3StreamError], None]) -> None:
        """Call `listener(err)` when the client fails for good because its node was taken
        over (`FencedError`): its streams' handles must fail and their tails end, not wait."""
        self._node_lost.append(listener)

    def on_wal_error(self, err: S3StreamError) -> None:
        """A WAL append failed: nothing after it may be acknowledged (the WAL fails every
        later append too). Retryable: the uploader repairs the WAL; else the client stops."""
        if not err.retryable or isinstance(err, StreamClosedError):
            # A WAL fenced by a take-over means the node lost its streams: not the WAL alone.
            self.fail(err, in_wal=not isinstance(err, FencedError))
            return
        with self.cond:
            if self.wal_error is None:
                self.log.warning("WAL failed, repairing it (appends wait): %s", err)
                self.wal_error = err
                self.cond.notify_all()

    def on_upload_failed(self, err: S3StreamError) -> None:
        """Record a failed upload attempt and wake flush (under `cond`)."""
        self.upload_error = err
        self.upload_failures += 1
        self.cond.notify_all()


def dropped_message(dropped: list[str]) -> str:
    """The error text for acknowledged appends lost to another owner."""
    shown = "; ".join(dropped[:5]) + (f"; and {len(dropped) - 5} more" if len(dropped) > 5 else "")
    return (
        "acknowledged appends were dropped (or, where said, handed to a take-over of this "
        "node) because another client took their streams over (open_stream(force=True), the "
        "stream's deletion, a take-over, or another process opening the store with this "
        f"client's node_id): {shown}"
    )
