"""Where the metadata log lives in an object store, and reading/writing its records.

Layout under `prefix`::

    {prefix}/log/{seq:020d}           entry seq (1, 2, ...), created with put_if_absent
    {prefix}/checkpoints/{seq:020d}   the whole state after entry seq
    {prefix}/checkpoint               pointer: seq of the latest checkpoint (plain put)
    {prefix}/metadata-store           only when the log lives elsewhere: which (marker.py)

Zero-padded seqs keep keys in log order for humans and tools; a client never lists (only
`listed_seqs`, for audits, does).

Writers are fenced by `put_if_absent` alone: of two writers of entry N, exactly one may win, in
whatever processes they run. So the log commits only through a store whose capabilities say its
conditional create is atomic across processes, or whose user declared a single writer
(`ObjectStoreCapabilities.fences_writers`); it refuses any other before its first write.
Reading needs no fencing: read-only users (`StreamReader`, the CLI, Spark) work on any store.

The one request this adds to the log's own: before creating entry 1 (a fresh store), one GET of
``{prefix}/metadata-store``, whose presence means that the store's metadata log lives in another
backend (PostgreSQL): a node that was not told so must not start a second log beside it, whose
node epochs would restart and reuse the data keys of the other's.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from ..errors import CorruptionError, InvalidArgumentError, ObjectNotFoundError
from ..objectstore.base import ObjectStore, check_key
from .base import MetadataLogStore, tip_probes
from .codec import (
    decode_checkpoint,
    decode_entry,
    decode_pointer,
    encode_checkpoint,
    encode_pointer,
)
from .marker import check_not_bound_elsewhere
from .model import Checkpoint, LogEntry

__all__ = ["MetadataLog"]

#: Most entries `MetadataLog.read_entries` asks for at once (and threads it reads them with).
_MAX_READ_AHEAD = 8


class MetadataLog(MetadataLogStore):
    """The metadata log's records in one object store, under one key prefix (the default
    `MetadataLogStore`)."""

    def __init__(self, store: ObjectStore, prefix: str = "meta") -> None:
        if not isinstance(store, ObjectStore):
            raise InvalidArgumentError(f"store must be an ObjectStore, got {store!r}")
        try:
            check_key(prefix)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"prefix must be a valid object key: {exc}") from None
        self._store = store
        self._prefix = prefix
        #: Set once the store was found able to fence writers (checked at the first write).
        self._writable = False

    @property
    def store(self) -> ObjectStore:
        """The object store holding the log."""
        return self._store

    @property
    def prefix(self) -> str:
        """The key prefix of every record."""
        return self._prefix

    @property
    def namespace(self) -> str:
        """The key prefix: one log per prefix."""
        return self._prefix

    def describe(self) -> str:
        return f"{self._store.describe()} under {self._prefix}/"

    def entry_key(self, seq: int) -> str:
        """Key of log entry `seq`."""
        return f"{self._prefix}/log/{seq:020d}"

    def checkpoint_key(self, seq: int) -> str:
        """Key of the checkpoint taken after entry `seq`."""
        return f"{self._prefix}/checkpoints/{seq:020d}"

    @property
    def pointer_key(self) -> str:
        """Key of the pointer to the latest checkpoint."""
        return f"{self._prefix}/checkpoint"

    def listed_seqs(self, *, checkpoints: bool = False) -> set[int]:
        """Seqs of the entries (or checkpoints) present, by listing: for audits only."""
        folder = f"{self._prefix}/{'checkpoints' if checkpoints else 'log'}/"
        out: set[int] = set()
        for info in self._store.list(folder):
            tail = info.key[len(folder) :]
            if tail.isascii() and tail.isdigit():
                out.add(int(tail))
        return out

    def read_entry(self, seq: int) -> tuple[LogEntry, bytes]:
        """Entry `seq` and its raw bytes; `ObjectNotFoundError` if not written (yet)."""
        key = self.entry_key(seq)
        data = self._store.get(key)
        entry = decode_entry(data, key)
        if entry.seq != seq:
            raise CorruptionError(
                f"metadata object {key!r} holds entry {entry.seq}, not {seq}", location=key
            )
        return entry, data

    def read_entries(self, first: int) -> Iterator[tuple[LogEntry, bytes]]:
        """Entries `first`, `first` + 1, ... up to the first one missing, in order.

        The first two one by one (a writer that lost the race for an entry usually finds one
        new entry: one GET for it and one for the missing next, as before), then in runs read
        in parallel that double while every entry of the last run was there (2, 4, up to
        `_MAX_READ_AHEAD`): a writer held up while others committed finds many entries, and
        reading those one round trip each was what its catch-up was made of on a store with
        tens of milliseconds per GET. Entries past a missing one are read for nothing, at
        most a run's worth.
        """
        seq = first
        for _ in range(2):
            try:
                yield self.read_entry(seq)
            except ObjectNotFoundError:
                return
            seq += 1
        width = 2
        with ThreadPoolExecutor(_MAX_READ_AHEAD, "s3stream-metadata-read") as pool:
            while True:
                run = [pool.submit(self.read_entry, s) for s in range(seq, seq + width)]
                for i, future in enumerate(run):
                    try:
                        entry = future.result()
                    except ObjectNotFoundError:
                        if not any(f.exception() is None for f in run[i + 1 :]):
                            return
                        entry = self._read_before_later(seq + i)
                    yield entry
                seq += width
                width = min(2 * width, _MAX_READ_AHEAD)

    def _read_before_later(self, seq: int) -> tuple[LogEntry, bytes]:
        """Entry `seq`, found missing while a later one of the same run exists. A writer
        creates an entry only after reading the one before it, so `seq` was there before
        the later one was made: the first read may have come just before its create, so read
        again; missing still, the log has a hole (entries are never deleted), and stopping
        there would show readers a short history without a word (and let a writer fill the
        hole with a different entry)."""
        try:
            return self.read_entry(seq)
        except ObjectNotFoundError:
            key = self.entry_key(seq)
            raise CorruptionError(
                f"metadata log entry {key!r} is missing while later entries exist: the log is "
                "damaged (entries are never deleted); stop writers and restore it, or run "
                "`s3stream verify`",
                location=key,
            ) from None

    def create_entry(self, seq: int, payload: bytes) -> bool:
        """Write entry `seq` unless it exists; True if this call created it.

        Raises `InvalidArgumentError`, before writing anything, if the store cannot fence
        writers (see `check_writable`).
        """
        self.check_writable()
        if seq == 1:
            check_not_bound_elsewhere(self._store, self._prefix)
        return self._store.put_if_absent(self.entry_key(seq), payload)

    def has_entry(self, seq: int) -> bool:
        """Whether entry `seq` exists: one HEAD."""
        return self._store.head(self.entry_key(seq)) is not None

    def has_entry_past(self, seq: int) -> bool:
        # The default's HEADs at once: one round trip, not 17.
        with ThreadPoolExecutor(_MAX_READ_AHEAD, "s3stream-metadata-read") as pool:
            return any(pool.map(self.has_entry, tip_probes(seq)))

    def check_writable(self) -> None:
        """Raise `InvalidArgumentError` unless the store's conditional create can fence the
        log's writers (a writing client's first commit, at open, calls this)."""
        if self._writable:
            return
        caps = self._store.capabilities
        if not caps.fences_writers:
            scheme = f"{caps.scheme}://" if caps.scheme else "this"
            raise InvalidArgumentError(
                f"cannot write the metadata log in {self._store.describe()}: the {scheme} "
                "store's conditional create (put_if_absent) is not atomic across processes, so "
                "two writers could both commit the same log entry. Stores that can fence "
                "writers: a local directory (file:// or a path), s3:// (S3 and services with "
                "conditional writes), gs:// (Google Cloud Storage), az:// or abfs:// (Azure "
                "Blob Storage), memory://. If only one process at a time writes to "
                "this store, say so with the storage option single_writer=True, which fsspec "
                "URLs accept (s3stream.open(url, storage_options={'single_writer': True}), "
                "FsspecObjectStore(url, single_writer=True), or the CLI's -o "
                "single_writer=true); readers need no option"
            )
        self._writable = True

    def read_pointer(self) -> int | None:
        """Seq of the latest checkpoint the pointer names, or None if there is no pointer."""
        key = self.pointer_key
        try:
            data = self._store.get(key)
        except ObjectNotFoundError:
            return None
        return decode_pointer(data, key)

    def read_checkpoint(self, seq: int) -> Checkpoint:
        """The checkpoint after entry `seq`; `CorruptionError` if it is missing or bad."""
        key = self.checkpoint_key(seq)
        try:
            data = self._store.get(key)
        except ObjectNotFoundError as exc:
            raise CorruptionError(
                f"the checkpoint pointer names {key!r}, which does not exist", location=key
            ) from exc
        checkpoint = decode_checkpoint(data, key)
        if checkpoint.seq != seq:
            raise CorruptionError(
                f"metadata object {key!r} holds the checkpoint of entry {checkpoint.seq}, "
                f"not {seq}",
                location=key,
            )
        return checkpoint

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Store `checkpoint`, then point the pointer at it (in this order, so the pointer
        never names a checkpoint that is not there)."""
        self._store.put(self.checkpoint_key(checkpoint.seq), encode_checkpoint(checkpoint))
        self._store.put(self.pointer_key, encode_pointer(checkpoint.seq))
