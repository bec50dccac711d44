"""Physical deletion: purging objects marked deleted, and sweeping orphans.

**Purge.** Compaction marks replaced (and dropped) objects deleted in the metadata log; they
stay in the store for `deletion_delay_ms` after `marked_deleted_ms`, because a reader that
took a metadata snapshot before the compaction may still read them. Then they are deleted
from the store, and only after that forgotten with `PurgeObjects` — so a crash in between
only repeats the (idempotent) deletion.

**Orphans.** An object PUT but never committed (a crash between an upload's or a
compaction's PUT and its commit, an aborted compaction whose clean-up failed) is referenced
by no metadata. `OrphanSweeper` finds such keys with a LIST of the data prefix — rare
(`orphan_sweep_interval_ms`) and bounded (`orphan_sweep_max_keys` keys per sweep, resuming
where the last sweep stopped) — and deletes a key once it has been seen unreferenced for
`orphan_grace_ms`. Only keys the library itself makes are candidates (`parse_object_key`:
anything else under ``data/`` belongs to someone else and is never touched), and never a key
of a node's *current* session: its writer may still be between the PUT and the commit of that
object, however long a metadata outage keeps it there. A session ends when its node registers
again (a restart or a take-over bumps the node epoch, after which the old session's commits
fail), so its orphans are swept after that. When each key was first seen is kept in a small
object of its own (``{meta prefix}/sweeper/orphans``), so a standalone compaction job run now
and then makes progress too. Two sweepers overwriting each other's record only delay
deletions: a key's first-seen time is never earlier than a moment it truly was unreferenced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from ..clock import Clock
from ..errors import ObjectNotFoundError, S3StreamError
from ..metadata import MetadataManager, MetadataState, PurgeObjects
from ..metrics.logs import ContextLogger
from ..objectstore.base import ObjectStore
from ..storage.packing import DEFAULT_DATA_PREFIX, parse_object_key
from ..throttle import Priority, PriorityRateLimiter

__all__ = ["OrphanSweeper", "purge_deleted"]

log = logging.getLogger(__name__)

_DELETE_CHUNK = 1000


def _chunks(keys: list[str], n: int) -> Iterable[list[str]]:
    for i in range(0, len(keys), n):
        yield keys[i : i + n]


def purge_deleted(
    meta: MetadataManager,
    store: ObjectStore,
    *,
    now_ms: int,
    delay_ms: int,
    limiter: PriorityRateLimiter | None = None,
    max_keys: int = 10_000,
) -> list[str]:
    """Delete objects marked deleted at least `delay_ms` ago, then forget them; their keys."""
    state = meta.state
    due = sorted(
        o.key
        for o in state.objects.values()
        if o.marked_deleted_ms is not None and now_ms - o.marked_deleted_ms >= delay_ms
    )[:max_keys]
    if not due:
        return []
    for chunk in _chunks(due, _DELETE_CHUNK):
        if limiter is not None:
            limiter.acquire(0, Priority.COMPACTION)
        store.delete_many(chunk)

    def build(latest: MetadataState) -> list[PurgeObjects]:
        keys = tuple(k for k in due if (o := latest.objects.get(k)) is not None and not o.live)
        return [PurgeObjects(keys)] if keys else []

    meta.commit(build)
    return due


class _Record(msgspec.Struct, kw_only=True):
    """The sweeper's persisted memory: where to resume, and when each key was first seen."""

    cursor: str = ""
    first_seen_ms: dict[str, int] = msgspec.field(default_factory=dict)


class OrphanSweeper:
    """Finds and deletes data objects no metadata references (see the module docstring)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        meta: MetadataManager,
        clock: Clock,
        grace_ms: int,
        max_keys: int,
        data_prefix: str = DEFAULT_DATA_PREFIX,
        limiter: PriorityRateLimiter | None = None,
    ) -> None:
        self._store = store
        self._meta = meta
        self._log = ContextLogger(log, meta.writer_id)
        self._clock = clock
        self._grace_ms = grace_ms
        self._max_keys = max_keys
        self._prefix = data_prefix
        self._limiter = limiter
        self._meta_prefix = meta.log.prefix
        self._record_key = f"{self._meta_prefix}/sweeper/orphans"

    @property
    def record_key(self) -> str:
        """Where the sweeper keeps its first-seen times."""
        return self._record_key

    def sweep(self) -> list[str]:
        """One bounded sweep; returns the keys deleted."""
        record = self._load()
        listed: list[str] = []
        exhausted = True
        if self._limiter is not None:
            self._limiter.acquire(0, Priority.COMPACTION)
        for info in self._store.list(self._prefix + "/"):
            if info.key <= record.cursor:
                continue
            if len(listed) >= self._max_keys:
                exhausted = False
                break
            listed.append(info.key)
        # Look at the metadata only after listing: an object committed before this refresh
        # is referenced; one not yet committed is at most unreferenced from now on.
        self._meta.refresh()
        state = self._meta.state
        now = self._clock.now_ms()
        seen = record.first_seen_ms
        unreferenced = [k for k in listed if k not in state.objects and self._sweepable(k, state)]
        # Forget keys of the span just listed that are referenced now, or gone.
        lo = record.cursor
        hi = listed[-1] if listed and not exhausted else None
        keep = set(unreferenced)
        for key in [k for k in seen if k > lo and (hi is None or k <= hi) and k not in keep]:
            del seen[key]
        due = []
        for key in unreferenced:
            first = seen.setdefault(key, now)
            if now - first >= self._grace_ms:
                due.append(key)
        if due:
            # One more look, as close to the deletion as possible.
            self._meta.refresh()
            latest = self._meta.state
            due = [k for k in due if k not in latest.objects and self._sweepable(k, latest)]
        for chunk in _chunks(due, _DELETE_CHUNK):
            if self._limiter is not None:
                self._limiter.acquire(0, Priority.COMPACTION)
            self._store.delete_many(chunk)
        for key in due:
            seen.pop(key, None)
        record.cursor = hi or ""
        self._save(record)
        if due:
            self._log.info("deleted %d orphan objects", len(due))
        # What writes killed mid-way left that is not an object (a local store's temporary
        # files): after the same grace, so a live writer's is never touched.
        leftovers = self._store.remove_leftovers(
            now - self._grace_ms, (self._prefix, self._meta_prefix)
        )
        if leftovers:
            self._log.info("removed %d temporary files of writes that died", leftovers)
        return due

    def _sweepable(self, key: str, state: MetadataState) -> bool:
        """Ours (made by `KeyFactory` under this prefix, for a node this store registered:
        nodes are never forgotten, and every key is made after its node's registration) and
        of a session that has ended."""
        parsed = parse_object_key(key, self._prefix)
        if parsed is None:
            return False
        node = state.nodes.get(parsed.node_id)
        return node is not None and node.epoch > parsed.node_epoch

    def _load(self) -> _Record:
        try:
            data = self._store.get(self._record_key)
        except ObjectNotFoundError:
            return _Record()
        try:
            return msgspec.json.decode(data, type=_Record)
        except msgspec.DecodeError as exc:
            # It holds first-seen times only: starting them again delays deletions, never
            # hastens one (and the save at the end of this sweep replaces the bad record;
            # refusing instead stopped every sweep for good).
            self._log.warning(
                "orphan sweeper record %r is unreadable (%s): starting from an empty one",
                self._record_key,
                exc,
            )
            return _Record()

    def _save(self, record: _Record) -> None:
        try:
            self._store.put(self._record_key, msgspec.json.encode(record))
        except S3StreamError as exc:
            # Harmless: the next sweep starts its clocks again (deletes later, never earlier).
            self._log.warning("could not save the orphan sweeper record: %s", exc)
