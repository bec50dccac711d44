"""The committer: makes an uploaded set of objects part of the streams.

It commits the objects of one upload to the metadata log (one entry, checked against the
streams' epochs and committed ends), unpins their batches in the LogCache, drops what streams
taken over by another owner had acknowledged here, deletes objects nobody will reference, and
trims the WAL below the upload.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..cache.log_cache import BASE, COUNT, EPOCH, WALPOS, CachedBatch, LogCache, Taken
from ..clock import Clock
from ..errors import CorruptionError, FencedError, S3StreamError
from ..metadata import (
    CommitObjects,
    MetadataManager,
    MetadataState,
    ObjectMeta,
    StreamRange,
)
from ..metrics.components import StorageInstruments
from ..objectstore.base import ObjectStore
from ..types import StreamState
from ..wal.base import WriteAheadLog
from .appender import Appender, Released
from .packing import PackedObject
from .status import PipelineStatus

__all__ = ["Committer", "fenced_by"]


class Committer:
    """Commits uploads in order (called by the uploader thread, or by recovery and flush
    without one)."""

    def __init__(
        self,
        *,
        status: PipelineStatus,
        meta: MetadataManager,
        store: ObjectStore,
        wal: WriteAheadLog,
        cache: LogCache,
        appender: Appender,
        clock: Clock,
        node_id: str,
        node_epoch: int | None,
        instruments: StorageInstruments,
    ) -> None:
        self._status = status
        self._meta = meta
        self._store = store
        self._wal = wal
        self._cache = cache
        self._appender = appender
        self._clock = clock
        self._node_id = node_id
        #: Carried by every commit, so a node taken over by another client commits nothing.
        self._node_epoch = node_epoch
        self._ins = instruments
        self._log = status.log
        #: Held from a commit until its entries are marked uploaded (and the fenced ones
        #: dropped), and by whoever drops a fenced writer's entries from another thread: so a
        #: drop never takes a committed entry for a lost one.
        self.lock = threading.RLock()

    def commit(
        self,
        entries: Taken,
        objects: Sequence[PackedObject],
        started: float,
        trim: bool,
    ) -> None:
        """Commit `objects` (holding `entries`, the upload that began at `started`), then
        trim the WAL below them if `trim`. Raises what the metadata commit raises."""
        groups = entries.groups
        first = {sid: lst[0] for sid, lst in groups.items()}
        ends = {sid: lst[-1][BASE] + lst[-1][COUNT] for sid, lst in groups.items()}
        fenced: set[int] = set()
        build = self._builder(first, ends, objects, fenced)
        with self.lock:
            _, state = self._meta.commit(build)
            self._cache.mark_uploaded(entries, fenced)
            for sid in sorted(fenced):
                self._drop_fenced(sid, groups[sid], state)
        dead = [o.key for o in objects if all(r[0] in fenced for r in o.ranges)]
        if dead:
            try:
                self._store.delete_many(dead)
            except S3StreamError as exc:
                # The commit stands: failing here would retry a committed upload. Objects
                # no entry references are the orphan sweep's to delete.
                self._log.warning("deleting %d unreferenced objects failed: %s", len(dead), exc)
        self._log.debug("upload committed: %d objects", len(objects))
        self._ins.upload.record(
            self._clock.monotonic() - started, sum(len(o.data) for o in objects), len(objects)
        )
        try:
            if trim:
                # Not `trim`: it would wait for the WAL's thread, which may be in an append's
                # callback waiting for this upload (a callback closing the client).
                self._wal.trim_soon(entries.entries[-1][WALPOS])
        except S3StreamError as exc:
            # Harmless for correctness: recovery drops what is committed.
            self._log.warning("WAL trim failed: %s", exc)
        status = self._status
        if status.wal_full:
            with status.cond:
                status.wal_full = False  # the next append tries the WAL again
                status.cond.notify_all()

    def _builder(
        self,
        first: dict[int, CachedBatch],
        ends: dict[int, int],
        objects: Sequence[PackedObject],
        fenced: set[int],
    ) -> Callable[[MetadataState], Sequence[CommitObjects]]:
        """The commit's entry, built afresh on each metadata state the log retries on;
        `fenced` collects the streams another owner has taken (`ends`: where the upload
        leaves each stream)."""
        now = self._clock.now_ms()

        def build(state: MetadataState) -> Sequence[CommitObjects]:
            fenced.clear()
            held_objects = state.objects
            landed = [m for o in objects if (m := held_objects.get(o.key)) is not None]
            if landed:
                # An earlier try of this very commit was written (its reply was lost, and
                # the read-back that would have said so failed too): committing it again
                # would fail forever on the moved ends. What it left out was fenced then.
                held = {r.stream_id for m in landed for r in m.ranges}
                fenced.update(sid for sid in first if sid not in held)
                return []
            moved: list[int] = []
            for sid, e in first.items():
                s = state.streams.get(sid)
                if s is None or s.state is StreamState.DELETED or s.epoch != e[EPOCH]:
                    fenced.add(sid)
                elif s.end_offset != e[BASE]:
                    if s.end_offset < ends[sid]:
                        self._fenced_if_taken_over(state)
                        raise CorruptionError(
                            f"stream {sid}: upload starts at {e[BASE]} but the "
                            f"committed end is {s.end_offset}"
                        )
                    moved.append(sid)
            if moved:
                if len(moved) + len(fenced) < len(first):
                    self._fenced_if_taken_over(state)
                    raise CorruptionError(
                        f"streams {sorted(moved)} are committed past this upload, others of "
                        "it are not: the metadata does not match this client's uploads"
                    )
                # Landed, and its objects compacted away since (so not found above): only
                # this client moves a stream's end at its epoch, and uploads commit in order.
                return []
            metas = []
            for o in objects:
                ranges = tuple(
                    StreamRange(sid, a, b, *o.times[sid])
                    for sid, a, b in o.ranges
                    if sid not in fenced
                )
                if ranges:
                    metas.append(
                        ObjectMeta(
                            key=o.key,
                            kind=o.kind,
                            size=len(o.data),
                            ranges=ranges,
                            committed_ms=now,
                            node_id=self._node_id,
                        )
                    )
            if not metas:
                return []
            epochs = {sid: e[EPOCH] for sid, e in first.items() if sid not in fenced}
            return [CommitObjects(objects=tuple(metas), epochs=epochs, node_epoch=self._node_epoch)]

        return build

    def _drop_fenced(self, sid: int, mine: list[CachedBatch], state: MetadataState) -> None:
        """This upload found stream `sid` taken over by another client: drop what this
        client acknowledged of it (`mine`: its entries of this upload, and what came after)."""
        last = mine[-1]
        self.drop_fenced(
            sid, mine[0][EPOCH], fenced_by(state, sid), (mine[0][BASE], last[BASE] + last[COUNT])
        )

    def drop_fenced(
        self,
        sid: int,
        epoch: int,
        by: str,
        taken: tuple[int, int] | None = None,
        *,
        live_only: bool = False,
    ) -> None:
        """Another client took stream `sid` over from this client's writer at `epoch` (`by`
        says how): drop what that writer acknowledged and did not upload (`taken`: the
        offsets an upload held of it, beside what the LogCache still has), stop its appends,
        and remember the loss for flush/close. Nothing is done, or reported twice, when this
        client appends to the stream at another epoch now (it reopened the stream after an
        earlier drop) or let the epoch go itself (it destroyed the stream); with `live_only`,
        also when that writer was stopped already (`Appender.release_writer`)."""
        with self.lock:
            released = self._appender.release_writer(
                sid,
                FencedError(f"stream {sid} is owned by a newer epoch: {by}"),
                epoch=epoch,
                discard=True,
                live_only=live_only,
            )
            if released is not None:
                self.report_dropped(sid, released, by, taken)

    def report_dropped(
        self, sid: int, released: Released, by: str, taken: tuple[int, int] | None = None
    ) -> None:
        """Remember, for flush and close, that what `released` had acknowledged of stream
        `sid` beyond what is committed (`taken`: offsets an upload held) was lost to
        another owner (`by`)."""
        spans = [taken] if taken is not None else []
        spans += [(e[BASE], e[BASE] + e[COUNT]) for e in released.dropped[:1]]
        spans += [(e[BASE], e[BASE] + e[COUNT]) for e in released.dropped[-1:]]
        if not spans:
            return  # everything this writer acknowledged is committed: nothing was lost
        lo = min(a for a, _ in spans)
        # Every acknowledged append is in the LogCache before it is acknowledged, so the
        # entries bound the loss; the writer's confirm offset, read when it stopped, may lag
        # an acknowledgement completing at that moment.
        hi = max([b for _, b in spans] + [released.confirm_offset or 0])
        if hi <= lo:
            return
        if self._taken_over(self._meta.state):
            # The take-over replayed this node's WAL, which held these appends (its claim
            # fenced the WAL before anything later was acknowledged): they are in the stream,
            # and a caller told they were lost would append them twice.
            what = (
                f"stream {sid} offsets [{lo}, {hi}) (this node was taken over: the take-over "
                "replayed its WAL, which held these appends, unless it was told to accept WAL "
                "loss; check the stream before resending them)"
            )
            self._log.for_stream(sid).warning("acknowledged appends handed over: %s", what)
        else:
            what = f"stream {sid} offsets [{lo}, {hi}) ({by})"
            self._log.for_stream(sid).error("acknowledged appends dropped: %s", what)
        self._status.add_dropped(what)

    def _fenced_if_taken_over(self, state: MetadataState) -> None:
        """`FencedError` if this node was taken over (`_taken_over` in `state`): a take-over's
        replay moves ends into this client's uploads, which is no damage then, and the
        entry's own node check (I14) would say fenced (a CorruptionError was retried for
        ever, the node never fenced, while it went on taking appends)."""
        if self._taken_over(state):
            raise FencedError(
                f"node {self._node_id!r} is at epoch {state.nodes[self._node_id].epoch}; this "
                f"client's uploads, at node epoch {self._node_epoch}, are fenced (the node was "
                "taken over)"
            )

    def _taken_over(self, state: MetadataState) -> bool:
        """Whether this node was registered again since this client registered it (a
        take-over, or another open of the node id), as `state` says."""
        if self._node_epoch is None:
            return False
        return state.registered_again(self._node_id, self._node_epoch) is not None


def fenced_by(state: MetadataState, sid: int) -> str:
    """How stream `sid` left this client's hands, for messages (from the current state)."""
    s = state.streams.get(sid)
    if s is None or s.state is StreamState.DELETED:
        return "it was deleted"
    if s.owner is None:
        return f"another client opened it at epoch {s.epoch} and has closed it since"
    return f"node {s.owner!r} opened it at epoch {s.epoch}"
