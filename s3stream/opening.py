"""`s3stream.open`: build a client from URLs (object store URL, WAL URL)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._registry import split_scheme
from .client import StreamClient, WalFactory
from .clock import Clock, SystemClock
from .errors import InvalidArgumentError
from .objectstore.base import ObjectStore
from .objectstore.registry import open_object_store
from .objectstore.stack import store_stack
from .settings import ClientSettings, FileWalSettings, ObjectWalSettings
from .validation import check_bool, check_instance, check_node_id, check_options, check_text
from .wal.base import WriteAheadLog
from .wal.holder import WalHolderLock
from .wal.memory import MemoryWal
from .wal.object import ObjectWal
from .wal.registry import OBJECT_PREFIX, lock_file_wal

__all__ = ["DEFAULT_LOCAL_WAL_CAPACITY", "OBJECT_WAL_DIR", "default_wal_url", "open"]

#: Where the default object WAL of a remote store lives, inside the store.
OBJECT_WAL_DIR = "wal"

#: WAL ring size of the embedded default (a local directory): large enough for several
#: uploads in flight, small enough that a test suite creating many clients stays cheap.
DEFAULT_LOCAL_WAL_CAPACITY = "256MiB"


def default_wal_path(url: str, node_id: str) -> Path | None:
    """The file of a local store's default WAL for `node_id`; None for other stores."""
    scheme, rest = split_scheme(url)
    if scheme != "file":
        return None
    return Path(rest).resolve() / OBJECT_WAL_DIR / f"{node_id}.wal"


def default_wal_url(
    url: str, node_id: str, *, capacity: str | None = DEFAULT_LOCAL_WAL_CAPACITY
) -> str | None:
    """The WAL a client uses when none is given: a file WAL inside a local directory,
    memory for ``memory://``, and for a remote store the object WAL under ``wal/`` of the
    same store (durable and shared, so another client can take the node over; appends wait
    about `wal_batch_interval_ms` plus one PUT). None where no default exists."""
    scheme, _ = split_scheme(url)
    if scheme == "memory":
        return "memory://"
    path = default_wal_path(url, node_id)
    if path is not None:
        # as_uri() percent-encodes the path, so the WAL URL names exactly this file for any
        # directory name (``%``, ``?``, ``#``, newlines, tabs, ``..``-lookalikes included).
        # A capacity in the URL would override `file_wal_settings`: None leaves it to them.
        return path.as_uri() + (f"?capacity={capacity}" if capacity is not None else "")
    base = url.split("?", 1)[0].rstrip("/")
    if scheme in ("s3", "s3a"):
        return f"{base}/{OBJECT_WAL_DIR}"
    return f"{OBJECT_PREFIX}{base}/{OBJECT_WAL_DIR}" if "://" in base else None


def _wal_factory(
    wal_url: str | Callable[[str], str],
    *,
    clock: Clock,
    file_settings: FileWalSettings | None,
    object_settings: ObjectWalSettings | None,
    storage_options: Mapping[str, Any] | None,
    held: WalHolderLock | None = None,
    accept_wal_loss: bool = False,
) -> WalFactory:
    """`held`: the holder lock of the client's own file WAL, taken already; handed to the
    WAL the first time the factory opens that node's WAL. `must_exist` (a node whose streams
    are still open, so its WAL may hold acknowledged appends): a file WAL that is missing or
    empty, or an object WAL prefix without objects, is damage, `CorruptionError`, unless
    `accept_wal_loss`."""
    from .wal.registry import open_wal

    unused = [held] if held is not None else []

    def factory(
        node_id: str,
        node_epoch: int,
        on_full: Callable[[], None],
        *,
        take_over: bool = False,
        must_exist: bool = False,
    ) -> WriteAheadLog:
        url = wal_url if isinstance(wal_url, str) else wal_url(node_id)
        extra: dict[str, Any] = {"must_exist": must_exist, "accept_wal_loss": accept_wal_loss}
        if take_over:
            extra["take_over"] = True
        elif unused and unused[0].node_id == node_id:
            extra["lock"] = unused.pop()
        return open_wal(
            url,
            node_id=node_id,
            node_epoch=node_epoch,
            on_full=on_full,
            clock=clock,
            file_settings=file_settings,
            object_settings=object_settings,
            storage_options=storage_options,
            **extra,
        )

    return factory


def _shared_object_wal(
    store: ObjectStore,
    *,
    clock: Clock,
    settings: ObjectWalSettings | None,
    accept_wal_loss: bool = False,
) -> WalFactory:
    """The default WAL of a remote store: an object WAL under ``wal/`` of the client's own
    store stack (the same keys `default_wal_url` names), retried by that stack alone.
    `must_exist` and `accept_wal_loss` as for `_wal_factory`: an empty WAL prefix, or a
    damaged chain (docs/s3-wal.md), is `CorruptionError` unless the loss is accepted."""

    def factory(
        node_id: str,
        node_epoch: int,
        on_full: Callable[[], None],
        *,
        take_over: bool = False,
        must_exist: bool = False,
    ) -> WriteAheadLog:
        # A take-over needs nothing special here: opening the chain seals the old holder out.
        del take_over
        return ObjectWal(
            store,
            node_id=node_id,
            node_epoch=node_epoch,
            prefix=OBJECT_WAL_DIR,
            settings=settings,
            clock=clock,
            on_full=on_full,
            retry=False,
            must_exist=must_exist,
            accept_loss=accept_wal_loss,
        )

    return factory


def _check_open_args(
    url: object,
    wal: object,
    node_id: object,
    storage_options: object,
    settings: object,
    file_wal_settings: object,
    object_wal_settings: object,
) -> None:
    """`open`'s arguments, checked before anything is opened or created."""
    if isinstance(url, str):
        check_text("url", url, allow_empty=False)
    elif not isinstance(url, Path):
        raise InvalidArgumentError(f"url must be a str or a Path, not {type(url).__name__}")
    if wal is not None and not isinstance(wal, WriteAheadLog):
        check_text("wal", wal, allow_empty=False)
        split_scheme(str(wal))  # a malformed WAL URL fails before the store is opened
    check_node_id(node_id)
    check_options("storage_options", storage_options)
    for name, value, cls in (
        ("settings", settings, ClientSettings),
        ("file_wal_settings", file_wal_settings, FileWalSettings),
        ("object_wal_settings", object_wal_settings, ObjectWalSettings),
    ):
        check_instance(name, value, cls, allow_none=True)


def open(
    url: str | Path,
    *,
    wal: str | WriteAheadLog | None = None,
    node_id: str = "local",
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | None = None,
    file_wal_settings: FileWalSettings | None = None,
    object_wal_settings: ObjectWalSettings | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    accept_wal_loss: bool = False,
) -> StreamClient:
    """Open a stream-storage client.

    `url` names the object store: a local directory (the embedded default), ``s3://bucket/
    prefix``, ``memory://`` or any fsspec URL. `wal` names the write-ahead log: a URL
    (``file:///path?capacity=2GiB``, ``memory://``, ``s3://bucket/prefix/wal``) or a
    `WriteAheadLog` instance. By default a local directory gets a file WAL inside it (one
    per node id), ``memory://`` a memory WAL, and a remote store the object WAL under its
    ``wal/`` prefix (see `default_wal_url` and ``docs/s3-wal.md``).

    A node whose streams are still open (its last session did not close them) may hold
    acknowledged appends in its WAL; if that WAL is gone (a file WAL missing or empty, an
    object WAL's prefix holding no object), opening the node raises `CorruptionError` naming
    it, and so does an object WAL chain missing an object that had landed (docs/s3-wal.md,
    "What recovery detects"). ``accept_wal_loss=True`` goes on without them (logged as a
    warning): for an operator who knows the lost part of the WAL is gone for good.
    """
    _check_open_args(
        url, wal, node_id, storage_options, settings, file_wal_settings, object_wal_settings
    )
    check_bool("accept_wal_loss", accept_wal_loss)
    check_instance("clock", clock, Clock, allow_none=True)
    check_instance("rng", rng, random.Random, allow_none=True)
    if isinstance(url, Path):
        url = str(url)
    clock = clock if clock is not None else SystemClock()
    raw_store = open_object_store(url, storage_options)
    # The client's one store stack, built here so that an object WAL in the same store shares
    # it (one boto3 client; its traffic in `client.metrics`); the client takes it as it is.
    store = store_stack(
        raw_store,
        clock=clock,
        rng=rng if rng is not None else random.Random(f"s3stream:{node_id}"),
        timeout_s=(settings if settings is not None else ClientSettings()).store_timeout_ms
        / 1000,
    )
    wal_arg: WriteAheadLog | WalFactory
    held: WalHolderLock | None = None
    scheme = split_scheme(url)[0]
    if isinstance(wal, WriteAheadLog):
        wal_arg = wal
    elif wal is None and scheme not in ("memory", "file"):
        # A remote store's default: the object WAL in it, on this client's store stack.
        wal_arg = _shared_object_wal(
            store, clock=clock, settings=object_wal_settings, accept_wal_loss=accept_wal_loss
        )
    elif split_scheme(wal if wal is not None else url)[0] == "memory":
        wal_arg = MemoryWal()
    else:
        target: str | Callable[[str], str]
        if wal is None:
            # The default file WAL of each node inside the directory (so that `take_over`
            # finds another node's beside this one's).
            capacity = None if file_wal_settings is not None else DEFAULT_LOCAL_WAL_CAPACITY

            def target(node: str) -> str:
                return default_wal_url(str(url), node, capacity=capacity) or ""
        else:
            target = wal
        # A file WAL of this node that a live process holds must fail the open here, before
        # the client registers the node: that would fence the live process.
        try:
            held = lock_file_wal(target if isinstance(target, str) else target(node_id), node_id)
        except BaseException:
            store.close()
            raise
        wal_arg = _wal_factory(
            target,
            clock=clock,
            file_settings=file_wal_settings,
            object_settings=object_wal_settings,
            storage_options=storage_options,
            held=held,
            accept_wal_loss=accept_wal_loss,
        )
    try:
        return StreamClient(
            store, wal_arg, node_id=node_id, settings=settings, clock=clock, rng=rng
        )
    except BaseException:
        if held is not None:
            held.release()  # idempotent: a WAL that took it over has released it already
        raise
