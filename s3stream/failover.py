"""Node failover: a healthy client takes over the WAL and the streams of a failed node.

`take_over_node` fences the node (a `RegisterNode` bump in the metadata log: the old holder's
commits fail from then on, invariant I14), opens the node's WAL under the new epoch (an object
WAL seals its chain, so the old holder's WAL writes fail too), replays it through a `Storage`
of its own (records already committed or of superseded stream epochs are dropped, the rest is
uploaded and committed at the stream epochs the records carry), resets that WAL, and closes
the node's open streams so that any client can open them. See ``docs/s3-wal.md``.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ._bounded import stop_if_given_up
from .cache.block_cache import BlockCache
from .clock import Clock
from .errors import FencedError, InvalidArgumentError
from .metadata import MetadataManager, MetadataState
from .metadata.model import CloseStream
from .metrics.components import StorageInstruments
from .metrics.logs import ContextLogger
from .objectstore.base import ObjectStore
from .settings import ClientSettings
from .storage.engine import RecoveryReport, Storage
from .storage.packing import DEFAULT_DATA_PREFIX, KeyFactory
from .throttle import PriorityRateLimiter
from .types import StreamState
from .validation import check_node_id
from .wal.base import WriteAheadLog

__all__ = ["TakeOverReport", "take_over_node"]

log = logging.getLogger(__name__)

#: ``factory(node_id, node_epoch, on_full)`` -> the node's WAL (as `client.WalFactory`).
_WalFactory = Callable[[str, int, Callable[[], None]], WriteAheadLog]


@dataclass(frozen=True, slots=True)
class TakeOverReport:
    """What a take-over did."""

    #: The node taken over.
    node_id: str
    #: The node epoch the take-over registered (the failed holder's epoch + 1 or more).
    node_epoch: int
    #: What the replay of the node's WAL found and uploaded.
    recovery: RecoveryReport
    #: Streams the node had open, now closed so that other clients can open them.
    released_streams: tuple[int, ...]


def has_open_streams(state: MetadataState, node_id: str) -> bool:
    """Whether `node_id` still owns open streams: its last session did not close them, so its
    WAL may hold acknowledged appends that are not uploaded."""
    return any(m.state is StreamState.OPEN and m.owner == node_id for m in state.streams.values())


def expected_wal_uid(state: MetadataState, node_id: str, open_streams: bool) -> int | None:
    """What the store expects of `node_id`'s WAL (a WAL factory's `expect_uid`): the identity
    it recorded; else -1 when the node has no streams open, since no WAL's records can be of
    use to it then (one holding records is another store's or node's); else None (no check:
    open streams may have appends in whatever WAL the node used)."""
    known = state.nodes.get(node_id)
    if known is not None and known.wal_uid is not None:
        return known.wal_uid
    return None if open_streams else -1


def call_wal_factory(
    factory: _WalFactory,
    node_id: str,
    epoch: int,
    on_full: Callable[[], None],
    **options: bool | int | None,
) -> WriteAheadLog:
    """Open a node's WAL through `factory`, passing each keyword of `options` that is set
    (not None or False) and that the factory takes (the built-in ones take ``take_over``,
    ``must_exist`` and ``expect_uid``; a user's factory with the plain three-argument
    signature is called plainly)."""
    wanted = {
        name: value for name, value in options.items() if value is not None and value is not False
    }
    if wanted:
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):  # a callable without a signature: call it plainly
            params = {}  # type: ignore[assignment]
        passed = {name: value for name, value in wanted.items() if name in params}
        if passed:
            opener = cast(Callable[..., WriteAheadLog], factory)
            return opener(node_id, epoch, on_full, **passed)
    return factory(node_id, epoch, on_full)


def take_over_node(
    node_id: str,
    *,
    wal_factory: _WalFactory,
    store: ObjectStore,
    meta: MetadataManager,
    settings: ClientSettings,
    clock: Clock,
    block_cache: BlockCache | None = None,
    limiter: PriorityRateLimiter | None = None,
    data_prefix: str = DEFAULT_DATA_PREFIX,
    check_wal: Callable[[bool, int | None], None] | None = None,
    given_up: threading.Event | None = None,
    deadline: float | None = None,
    instruments: StorageInstruments | None = None,
) -> TakeOverReport:
    """Fence `node_id`, replay and commit its WAL, and release its streams.

    Raises `InvalidArgumentError` for a node the metadata log has never seen, `FencedError`
    if another client registered the node in the meantime, and whatever the WAL's recovery or
    the uploads raise (the take-over can then simply be run again: everything it did is
    idempotent or fenced).

    `check_wal` is called with whether the node has streams open and the WAL identity the
    store recorded for it (`expected_wal_uid`) before anything is written: it refuses a WAL
    that cannot be the node's (`wal.registry.check_take_over_wal`), so that a mistake in its
    name neither fences the node nor creates a WAL.

    `deadline` (on `clock`'s ``monotonic``; default: `call_timeout_ms` for the replay's
    uploads) is the caller's: a replay whose uploads keep failing stops there, not later,
    letting go of the node's WAL (its lock). `given_up`: set when the caller stopped waiting
    (`StreamClient.take_over` runs this in a thread of its own to keep its deadline on a
    device that stops answering) or its client closes; nothing new is started then. Once
    the WAL's records are uploaded the streams are released regardless: that is metadata
    only, and leaves the node as a finished take-over would. `instruments`: the taking
    client's, so that the replay's uploads count in its ``s3stream.upload.*`` metrics.
    """
    check_node_id(node_id)
    meta.refresh()
    if node_id not in meta.state.nodes:
        raise InvalidArgumentError(f"node {node_id!r} is not registered in the metadata log")
    if check_wal is not None:
        before = has_open_streams(meta.state, node_id)
        check_wal(before, expected_wal_uid(meta.state, node_id, before))
    stop_if_given_up(given_up, f"the take-over of node {node_id!r}")
    epoch = meta.register_node(node_id)
    stop_if_given_up(given_up, f"the take-over of node {node_id!r}")
    # `take_over`: a file WAL a live process still holds is opened anyway (the open fences
    # that process) instead of refused with `NodeInUseError`.
    open_streams = has_open_streams(meta.state, node_id)
    wal = call_wal_factory(
        wal_factory,
        node_id,
        epoch,
        lambda: None,
        take_over=True,
        must_exist=open_streams,
        expect_uid=expected_wal_uid(meta.state, node_id, open_streams),
    )
    storage = Storage(
        store=store,
        wal=wal,
        meta=meta,
        settings=settings,
        clock=clock,
        keys=KeyFactory(node_id, epoch, prefix=data_prefix),
        node_id=node_id,
        block_cache=block_cache,
        limiter=limiter,
        node_epoch=epoch,
        instruments=instruments,
    )
    try:
        stop_if_given_up(given_up, f"the take-over of node {node_id!r}")
        recovery = storage.recover(
            None if deadline is None else max(0.0, deadline - clock.monotonic())
        )
    except BaseException:
        storage.abandon()
        wal.close()
        raise
    about = ContextLogger(log, node_id)  # the node taken over
    try:
        storage.close()
    except FencedError as exc:
        # Appends of a stream someone force-opened during the replay were dropped, as a
        # force-open discards what the previous owner had not uploaded: the other streams
        # are still released (a take-over of the node itself since: the release refuses).
        about.warning("take-over of node %s: %s", node_id, exc)
    # One entry for all of them, as a client's close does: a node with tens of thousands of
    # open streams is released in one commit, not one commit per stream. A stream opened,
    # closed or deleted by someone meanwhile (its epoch or state changed) is released already.
    owned = {
        sid: s.epoch
        for sid, s in meta.state.streams.items()
        if s.owner == node_id and s.state is StreamState.OPEN
    }
    released: list[int] = []

    def check_still_ours(state: MetadataState) -> None:
        # A node registered again after this take-over (it restarted, or another take-over)
        # owns the streams now: closing them would make that session lose what it
        # acknowledges.
        ended = state.registered_again(node_id, epoch)
        if ended is not None:
            raise FencedError(
                f"{ended} while this take-over ran: its streams are the newer session's; "
                "nothing was released"
            )

    def build(state: MetadataState) -> list[CloseStream]:
        check_still_ours(state)
        ops = state.closes(owned.items())
        released[:] = [op.stream_id for op in ops]
        return ops

    if owned:
        meta.commit(build)
    else:
        meta.refresh()
        check_still_ours(meta.state)
    for sid in sorted(owned.keys() - set(released)):
        about.for_stream(sid).info(
            "stream %d of node %s not closed: another client opened, closed or deleted it",
            sid,
            node_id,
        )
    about.info("took over node %s at epoch %d: %s", node_id, epoch, recovery)
    return TakeOverReport(node_id, epoch, recovery, tuple(sorted(released)))
