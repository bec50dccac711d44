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
from .objectstore.registry import open_object_store
from .settings import ClientSettings, FileWalSettings, ObjectWalSettings
from .wal.base import WriteAheadLog
from .wal.memory import MemoryWal
from .wal.registry import OBJECT_PREFIX

__all__ = ["DEFAULT_LOCAL_WAL_CAPACITY", "default_wal_url", "open"]

#: WAL ring size of the embedded default (a local directory): large enough for several
#: uploads in flight, small enough that a test suite creating many clients stays cheap.
DEFAULT_LOCAL_WAL_CAPACITY = "256MiB"


def default_wal_url(url: str, node_id: str) -> str | None:
    """The WAL a client uses when none is given: a file WAL inside a local directory,
    memory for ``memory://``, and for a remote store the object WAL under ``wal/`` of the
    same store (durable and shared, so another client can take the node over; appends wait
    about `wal_batch_interval_ms` plus one PUT). None where no default exists."""
    scheme, rest = split_scheme(url)
    if scheme == "memory":
        return "memory://"
    if scheme == "file":
        path = Path(rest).resolve() / "wal" / f"{node_id}.wal"
        return f"file://{path}?capacity={DEFAULT_LOCAL_WAL_CAPACITY}"
    base = url.split("?", 1)[0].rstrip("/")
    if scheme in ("s3", "s3a"):
        return f"{base}/wal"
    return f"{OBJECT_PREFIX}{base}/wal" if "://" in base else None


def _wal_factory(
    wal_url: str | Callable[[str], str],
    *,
    clock: Clock,
    file_settings: FileWalSettings | None,
    object_settings: ObjectWalSettings | None,
    storage_options: Mapping[str, Any] | None,
) -> WalFactory:
    from .wal.registry import open_wal

    def factory(node_id: str, node_epoch: int, on_full: Callable[[], None]) -> WriteAheadLog:
        return open_wal(
            wal_url if isinstance(wal_url, str) else wal_url(node_id),
            node_id=node_id,
            node_epoch=node_epoch,
            on_full=on_full,
            clock=clock,
            file_settings=file_settings,
            object_settings=object_settings,
            storage_options=storage_options,
        )

    return factory


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
) -> StreamClient:
    """Open a stream-storage client.

    `url` names the object store: a local directory (the embedded default), ``s3://bucket/
    prefix``, ``memory://`` or any fsspec URL. `wal` names the write-ahead log: a URL
    (``file:///path?capacity=2GiB``, ``memory://``, ``s3://bucket/prefix/wal``) or a
    `WriteAheadLog` instance. By default a local directory gets a file WAL inside it (one
    per node id), ``memory://`` a memory WAL, and a remote store the object WAL under its
    ``wal/`` prefix (see `default_wal_url` and ``docs/s3-wal.md``).
    """
    if isinstance(url, Path):
        url = str(url)
    clock = clock if clock is not None else SystemClock()
    store = open_object_store(url, storage_options)
    per_node: Callable[[str], str] | None = None
    if wal is None:
        wal = default_wal_url(url, node_id)
        if wal is not None and split_scheme(wal)[0] == "file":
            # So that `take_over` finds another node's default WAL beside this one's.
            root_url = url

            def per_node(node: str) -> str:
                return default_wal_url(root_url, node) or ""

        if wal is None:
            store.close()
            raise InvalidArgumentError(
                f"a WAL must be given for {url!r}, e.g. wal='file:///mnt/ebs/s3stream.wal' "
                "or wal='s3://bucket/prefix/wal'"
            )
    wal_arg: WriteAheadLog | WalFactory
    if isinstance(wal, WriteAheadLog):
        wal_arg = wal
    elif isinstance(wal, str):
        if split_scheme(wal)[0] == "memory":
            wal_arg = MemoryWal()
        else:
            wal_arg = _wal_factory(
                wal if per_node is None else per_node,
                clock=clock,
                file_settings=file_wal_settings,
                object_settings=object_wal_settings,
                storage_options=storage_options,
            )
    else:
        store.close()
        raise InvalidArgumentError(
            f"wal must be a URL or a WriteAheadLog, not {type(wal).__name__}"
        )
    return StreamClient(store, wal_arg, node_id=node_id, settings=settings, clock=clock, rng=rng)
