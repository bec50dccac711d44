"""`s3stream.open`: build a client from URLs (object store URL, WAL URL) and settings.

`open` is where settings from every source meet (docs/configuration.md). For each setting
the first of these that gives it wins:

1. the WAL URL's query (``file:///x.wal?full_wait_ms=5s``): it names one WAL, so it is the
   most specific statement, and it always overrode the settings objects' fields;
2. explicit arguments: ``settings=`` as a mapping gives the settings it names; as a
   `ClientSettings` it gives every field, except a WAL section left None; `file_wal_settings`
   and `object_wal_settings` give every field of their WAL;
3. the environment: ``S3STREAM_*`` variables, read from `environ` (`os.environ` when None)
   when `open` is called, never at import and never by `StreamClient`;
4. the defaults (a local directory's default file WAL is 256 MiB, not 2 GiB).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import random
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._bounded import stop_if_given_up, within_deadline
from ._registry import path_url, split_scheme
from .client import StreamClient, WalFactory
from .clock import Clock, SystemClock
from .errors import InvalidArgumentError, UnavailableError
from .metadata.base import MetadataLogStore
from .metadata.registry import check_metadata_url
from .objectstore.base import ObjectStore
from .objectstore.local import LocalObjectStore
from .objectstore.registry import open_object_store
from .objectstore.stack import store_stack
from .objectstore.wrappers import MetricsObjectStore
from .reader import foreign_entries, holds_store
from .settings import ClientSettings, FileWalSettings, ObjectWalSettings
from .settings_parse import parse_size, settings_from_environ, settings_from_mapping
from .validation import (
    check_bool,
    check_choice,
    check_instance,
    check_node_id,
    check_options,
    check_str_map,
    check_text,
)
from .wal.base import WriteAheadLog
from .wal.file import FileWal
from .wal.holder import WalHolderLock
from .wal.object import ObjectWal
from .wal.registry import (
    OBJECT_PREFIX,
    S3_WAL_CLIENTS,
    check_wal_target,
    default_s3_wal_client,
    lock_file_wal,
    open_s3_wal_store,
    url_wal_factory,
)

__all__ = [
    "DEFAULT_LOCAL_WAL_CAPACITY",
    "OBJECT_WAL_DIR",
    "default_wal_url",
    "open",
    "resolve_settings",
]

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
    # realpath, not Path.resolve: that raises RuntimeError on a symlink loop (Python 3.11).
    return Path(os.path.realpath(rest)) / OBJECT_WAL_DIR / f"{node_id}.wal"


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
        # A capacity in the URL would override the settings: None leaves it to them.
        return path.as_uri() + (f"?capacity_bytes={capacity}" if capacity is not None else "")
    base = url.split("?", 1)[0].rstrip("/")
    if scheme in ("s3", "s3a"):
        return f"{base}/{OBJECT_WAL_DIR}"
    return f"{OBJECT_PREFIX}{base}/{OBJECT_WAL_DIR}" if "://" in base else None


def _shared_object_wal(
    store: MetricsObjectStore,
    *,
    clock: Clock,
    settings: ObjectWalSettings | None,
    accept_wal_loss: bool = False,
    own_store: Callable[[], ObjectStore] | None = None,
    timeout_s: float = 0.0,
) -> WalFactory:
    """The default WAL of a remote store: an object WAL under ``wal/`` of the client's own
    store stack (the same keys `default_wal_url` names), retried by that stack alone.
    `must_exist` and `accept_wal_loss` as for `url_wal_factory`: an empty WAL prefix, or a
    damaged chain (docs/s3-wal.md), is `CorruptionError` unless the loss is accepted.

    `own_store` (the S3 WAL through obstore): the WAL gets a store of its own from it, on the
    same objects, in a stack like the client's (retried within `timeout_s`) that records into
    the client's metrics registry as its ``wal`` purpose, so its traffic still shows in
    `StreamClient.metrics`; the WAL closes it."""
    return _SharedObjectWal(store, clock, settings, accept_wal_loss, own_store, timeout_s)


@dataclasses.dataclass
class _SharedObjectWal:
    """`_shared_object_wal`'s factory, with `check_node` beside it (as `UrlWalFactory`'s):
    a wiped WAL prefix of a node whose streams are open is refused before the client
    registers the node, which would fence a live process of it."""

    store: MetricsObjectStore
    clock: Clock
    settings: ObjectWalSettings | None
    accept_wal_loss: bool
    own_store: Callable[[], ObjectStore] | None
    timeout_s: float

    def __call__(
        self,
        node_id: str,
        node_epoch: int,
        on_full: Callable[[], None],
        *,
        take_over: bool = False,
        must_exist: bool = False,
    ) -> ObjectWal:
        # A take-over needs nothing special here: opening the chain seals the old holder out.
        del take_over
        wal_store: ObjectStore = self.store
        if self.own_store is not None:
            stack = store_stack(
                self.own_store(),
                clock=self.clock,
                rng=random.Random(f"s3stream:{node_id}:wal"),
                timeout_s=self.timeout_s,
            )
            # The client adopted its registry before it opens the WAL: record into it.
            stack.use_registry(self.store.registry)
            stack.default_purpose = "wal"
            wal_store = stack
        return ObjectWal(
            wal_store,
            node_id=node_id,
            node_epoch=node_epoch,
            prefix=OBJECT_WAL_DIR,
            settings=self.settings,
            clock=self.clock,
            on_full=on_full,
            retry=False,
            # The WAL's own store is the WAL's to close; the client's is the client's.
            close_store=self.own_store is not None,
            must_exist=must_exist,
            accept_loss=self.accept_wal_loss,
        )

    def check_node(self, node_id: str, *, must_exist: bool, expect_uid: int | None = None) -> None:
        """`ObjectWal.preflight` of the node's WAL (made without I/O, closed unrecovered)."""
        del expect_uid  # (this WAL, at the store's own prefix, takes none)
        if must_exist:
            with contextlib.closing(self(node_id, 0, lambda: None, must_exist=True)) as wal:
                wal.preflight()


def _s3_wal_store_opener(
    url: str, scheme: str, storage_options: Mapping[str, Any] | None, client: str | None
) -> Callable[[], ObjectStore] | None:
    """How the default WAL of an ``s3://`` store opens a store of its own through obstore;
    None when it shares the client's store (boto3: chosen, or obstore missing, or options only
    boto3 takes with no client named). Options obstore refuses fail here, at open."""
    if scheme not in ("s3", "s3a"):
        return None
    chosen = client if client is not None else default_s3_wal_client()
    if chosen != "obstore":
        return None
    base = url.split("?", 1)[0]
    try:
        open_s3_wal_store(base, storage_options, "obstore").close()
    except InvalidArgumentError:
        if client is not None:
            raise
        return None  # e.g. profile_name: the data store's boto3 client serves the WAL too

    def opener() -> ObjectStore:
        return open_s3_wal_store(base, storage_options, "obstore")

    return opener


def _check_open_args(
    url: object,
    wal: object,
    node_id: object,
    storage_options: object,
    settings: object,
    file_wal_settings: object,
    object_wal_settings: object,
    environ: object,
    wal_client: object = None,
) -> None:
    """`open`'s arguments, checked before anything is opened or created (the settings are
    checked as they are resolved, also before)."""
    if isinstance(url, str):
        check_text("url", url, allow_empty=False)
    elif not isinstance(url, Path):
        raise InvalidArgumentError(f"url must be a str or a Path, not {type(url).__name__}")
    if wal is not None and not isinstance(wal, WriteAheadLog):
        check_text("wal", wal, allow_empty=False)
        split_scheme(str(wal))  # a malformed WAL URL fails before the store is opened
    check_node_id(node_id)
    check_options("storage_options", storage_options)
    if not isinstance(settings, Mapping):
        check_instance("settings", settings, ClientSettings, allow_none=True)
    for name, value, cls in (
        ("file_wal_settings", file_wal_settings, FileWalSettings),
        ("object_wal_settings", object_wal_settings, ObjectWalSettings),
    ):
        check_instance(name, value, cls, allow_none=True)
    check_str_map("environ", environ, allow_none=True)
    if wal_client is not None:
        check_choice("wal_client", wal_client, S3_WAL_CLIENTS)


def resolve_settings(
    settings: ClientSettings | Mapping[str, Any] | None,
    *,
    file_wal_settings: FileWalSettings | None = None,
    object_wal_settings: ObjectWalSettings | None = None,
    environ: Mapping[str, str],
    local_default_wal: bool = False,
) -> ClientSettings:
    """The `ClientSettings` `open` uses, WAL sections included, from its explicit arguments
    over the environment over the defaults (the module's docstring has the order; a WAL URL's
    query is applied over these when the WAL is opened). `local_default_wal`: the client
    gets the default file WAL of a local directory, whose default capacity is smaller."""
    defaults = ClientSettings(
        file_wal=FileWalSettings(capacity_bytes=parse_size(DEFAULT_LOCAL_WAL_CAPACITY))
        if local_default_wal
        else None
    )
    from_env = settings_from_environ(ClientSettings, environ, base=defaults)
    resolved: ClientSettings
    if isinstance(settings, ClientSettings):
        # An object gives every field; the environment only fills WAL sections it left None.
        resolved = dataclasses.replace(
            settings,
            file_wal=settings.file_wal if settings.file_wal is not None else from_env.file_wal,
            object_wal=(
                settings.object_wal if settings.object_wal is not None else from_env.object_wal
            ),
        )
    elif settings is None:
        resolved = from_env
    else:
        resolved = settings_from_mapping(ClientSettings, settings, base=from_env)
    if file_wal_settings is not None:
        _refuse_twice(settings, "file_wal")
        resolved = dataclasses.replace(resolved, file_wal=file_wal_settings)
    if object_wal_settings is not None:
        _refuse_twice(settings, "object_wal")
        resolved = dataclasses.replace(resolved, object_wal=object_wal_settings)
    return resolved


def _refuse_twice(settings: ClientSettings | Mapping[str, Any] | None, section: str) -> None:
    """Refuse ``{section}_settings=`` when `settings` gives that section too (which one was
    meant is anybody's guess)."""
    if isinstance(settings, ClientSettings):
        given = getattr(settings, section) is not None
    else:
        given = settings is not None and any(
            k == section or k.startswith(f"{section}.") for k in settings
        )
    if given:
        raise InvalidArgumentError(
            f"{section}_settings and settings.{section} both give the {section} settings: give one"
        )


def open(
    url: str | Path,
    *,
    wal: str | WriteAheadLog | None = None,
    node_id: str = "local",
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | Mapping[str, Any] | None = None,
    file_wal_settings: FileWalSettings | None = None,
    object_wal_settings: ObjectWalSettings | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    accept_wal_loss: bool = False,
    environ: Mapping[str, str] | None = None,
    metadata: str | MetadataLogStore | None = None,
    wal_client: str | None = None,
) -> StreamClient:
    """Open a stream-storage client.

    `url` names the object store: a local directory (the embedded default), ``s3://bucket/
    prefix``, ``memory://`` or any fsspec URL. `wal` names the write-ahead log: a URL
    (``file:///path?capacity_bytes=2GiB``, ``memory://``, ``s3://bucket/prefix/wal``) or a
    `WriteAheadLog` instance. By default a local directory gets a file WAL inside it (one
    per node id), ``memory://`` a memory WAL, and a remote store the object WAL under its
    ``wal/`` prefix (see `default_wal_url` and ``docs/s3-wal.md``).

    `settings` is a `ClientSettings` or a mapping of setting names to values, text as in
    docs/configuration.md: ``{"compaction.background": True, "file_wal.full_wait_ms": "5s"}``.
    The WAL's settings are its sections
    ``file_wal`` and ``object_wal``; `file_wal_settings` and `object_wal_settings` are the
    older way to give them (either way, not both). `environ` holds the ``S3STREAM_*``
    variables to read (default: `os.environ`, read now; ``{}`` reads none). What wins where
    several give a setting: the module's docstring.

    A node whose streams are still open (its last session did not close them) may hold
    acknowledged appends in its WAL; if that WAL is gone (a file WAL missing or empty, an
    object WAL's prefix holding no object), opening the node raises `CorruptionError` naming
    it, and so does an object WAL chain missing an object that had landed (docs/s3-wal.md,
    "What recovery detects"). ``accept_wal_loss=True`` goes on without them (logged as a
    warning): for an operator who knows the lost part of the WAL is gone for good.

    `metadata` names where the metadata log lives: by default in the object store itself;
    ``postgresql://user@host:5432/db`` keeps it in PostgreSQL (the ``postgres`` extra;
    docs/metadata.md, "The PostgreSQL backend"), a `MetadataLogStore` anywhere. The data objects
    stay in the store. Every node and reader of a store must name the same log.

    `wal_client` chooses the S3 client of an S3 WAL (the default WAL of an ``s3://`` store, or
    an ``s3://`` `wal` URL whose query names no ``client``): ``"obstore"`` (the default when
    obstore is installed; a small PUT, the WAL's latency, costs about half as much) or
    ``"boto3"``. The default WAL falls back to boto3, the data store's client, when the store's
    `storage_options` need boto3 (``profile_name``, a ready ``client``) and none was named.

    An open on a local device (a local directory, a file WAL) returns or raises within
    `call_timeout_ms`: when the device stops answering (a write or sync blocked in the kernel)
    it raises `UnavailableError`, and what is stuck finishes in a thread of its own, which
    then lets go of the WAL (until it has, opening the node again raises `NodeInUseError`).
    Other opens are sequences of store calls, each bounded by `store_timeout_ms`.
    """
    if not isinstance(metadata, MetadataLogStore):
        check_metadata_url(metadata)
    _check_open_args(
        url,
        wal,
        node_id,
        storage_options,
        settings,
        file_wal_settings,
        object_wal_settings,
        environ,
        wal_client,
    )
    check_bool("accept_wal_loss", accept_wal_loss)
    check_instance("clock", clock, Clock, allow_none=True)
    check_instance("rng", rng, random.Random, allow_none=True)
    if isinstance(url, Path):
        url = path_url(url)
    scheme = split_scheme(url)[0]
    resolved = resolve_settings(
        settings,
        file_wal_settings=file_wal_settings,
        object_wal_settings=object_wal_settings,
        environ=environ if environ is not None else os.environ,
        local_default_wal=wal is None and scheme == "file",
    )
    clock = clock if clock is not None else SystemClock()
    build = functools.partial(
        _build_client,
        url,
        scheme=scheme,
        wal=wal,
        node_id=node_id,
        storage_options=storage_options,
        resolved=resolved,
        clock=clock,
        rng=rng,
        accept_wal_loss=accept_wal_loss,
        metadata=metadata,
        wal_client=wal_client,
    )
    if not _on_local_device(scheme, wal):
        # Only store calls, each bounded by `store_timeout_ms` (docs/architecture.md).
        return build(None)
    # A local directory or file WAL: a device that stops answering holds any write or sync in
    # the kernel uninterruptibly, so the open runs in a thread of its own and this call keeps
    # `call_timeout_ms` (docs/file-wal.md, "Write path: group commit", on opening).
    given_up = threading.Event()
    return within_deadline(
        lambda: build(given_up),
        clock=clock,
        deadline=clock.monotonic() + resolved.call_limit_s(),
        name=f"s3stream-open:{node_id}",
        timeout_error=lambda: UnavailableError(
            f"opening node {node_id!r} did not finish within call_timeout_ms "
            f"({resolved.call_timeout_ms} ms): the device of its WAL or store directory is not "
            "answering, or the uploads of what its WAL holds kept failing (a full disk: the "
            "log's 'upload attempt ... failed' warnings say why); the open goes on in the "
            "background and lets go of the WAL (its lock) once the device answers: open "
            "again later"
        ),
        abandoned=_close_abandoned,
        given_up=given_up,
    )


def _on_local_device(scheme: str, wal: str | WriteAheadLog | None) -> bool:
    """Whether an open touches a local device: a store in a local directory, or a WAL in a
    file (a file WAL, or an object WAL in a local directory)."""
    if scheme == "file":
        return True
    if isinstance(wal, WriteAheadLog):
        return isinstance(wal, FileWal)
    if wal is None:
        return False
    wal_scheme = split_scheme(wal)[0]
    return wal_scheme == "file" or wal_scheme == f"{OBJECT_PREFIX}file"


def _close_abandoned(client: StreamClient) -> None:
    """Close a client whose open finished after its caller's deadline (nobody else has it)."""
    client.close()


def _refuse_undecoded_twin(url: str, root: Path) -> None:
    """A ``file://`` URL's path is percent-decoded (``my%20store`` is ``my store``), which
    versions before 2026-11-26 did not do: a store they made through such a URL sits in a
    directory named with the escapes. Opening it by the same URL would make a new, empty
    store beside it and show none of its streams: refuse, naming both."""
    if "://" not in url:
        return
    literal = Path(os.path.abspath(os.path.expanduser(url.split("://", 1)[1])))
    if literal == root or not literal.is_dir():
        return
    with LocalObjectStore(literal, fsync=False) as undecoded:
        if not holds_store(undecoded):
            return
    if root.is_dir():
        with LocalObjectStore(root, fsync=False) as decoded:
            if holds_store(decoded):
                return
    raise InvalidArgumentError(
        f"{url!r} names the directory {str(root)!r} (a file URL's path is percent-decoded, "
        f"and file://localhost/x is /x), which holds no store, but {str(literal)!r} does "
        "(made through this URL by an older version, which read it differently): open that "
        "one by its plain path, or rename it"
    )


def _check_before_writing(
    url: str,
    scheme: str,
    wal: str | WriteAheadLog | None,
    node_id: str,
    wal_settings: FileWalSettings | None,
) -> None:
    """Check the store directory and the WAL without writing anything: an unknown WAL
    scheme, a WAL path that is a directory or somebody's file, a directory of somebody
    else's files are refused before a directory, a lock file or a node registration is
    made."""
    if scheme == "file" and "\0" in url:
        raise InvalidArgumentError(f"a store directory cannot hold a NUL byte, got {url!r}")
    wal_url = wal if isinstance(wal, str) else None
    if wal is None and scheme == "file":
        wal_url = default_wal_url(url, node_id, capacity=None)
    # The WAL is judged first (the directory check needs its path), its error raised after
    # the directory's: a directory of somebody's files is the mistake to name first.
    wal_file: Path | None = None
    wal_error: InvalidArgumentError | None = None
    if wal_url is not None:
        try:
            wal_file = check_wal_target(wal_url, base=wal_settings)
        except InvalidArgumentError as exc:
            wal_error = exc
    if scheme == "file":
        given = split_scheme(url)[1]
        # Resolved as the kernel will resolve it for the store's writes: "link/../victim" is
        # beside the link's target, not beside the link ("new/../mine", with no "new", is mine).
        _refuse_broken_links(given)
        root = Path(os.path.realpath(os.path.expanduser(given)))
        _refuse_undecoded_twin(url, root)
        if root.exists() and not root.is_dir():
            raise InvalidArgumentError(f"{str(root)!r} exists and is not a directory")
        if root.is_dir():
            # A WAL file placed in the store directory itself, and its lock file, are ours:
            # a first open killed before the store's first entry leaves them there.
            others = foreign_entries(root, wal_file=wal_file)
            if others:
                raise InvalidArgumentError(
                    f"{str(root)!r} is a directory that holds other files and no s3stream store "
                    f"(such as {', '.join(repr(n) for n in others[:3])}): s3stream would write "
                    "meta/, data/ and wal/ beside them; open a store in an empty or new "
                    "directory, or in the directory of an existing store"
                )
    if wal_error is not None:
        raise wal_error


def _refuse_broken_links(given: str) -> None:
    """Refuse a store path that is, or lies below, a symbolic link leading nowhere (a loop,
    or a missing target): making its directories would fail half way, with an OS error that
    looks retryable (or a traceback from pathlib, for a loop)."""
    path = os.path.expanduser(given)
    try:
        os.stat(path)
        return
    except OSError as exc:
        looped = exc.errno == errno.ELOOP
    probe = path.rstrip("/") or path
    while not looped:
        if os.path.islink(probe) and not os.path.exists(probe):
            break  # dangling: this link, or a loop through it
        parent = os.path.dirname(probe)
        if parent == probe:
            return  # nothing broken on the way: a path still to be made
        probe = parent
    raise InvalidArgumentError(
        f"{given!r} lies on a symbolic link that leads nowhere (its target is missing, or the "
        "links form a loop): point it at a directory, or open the directory itself"
    )


def _build_client(
    url: str,
    given_up: threading.Event | None,
    *,
    scheme: str,
    wal: str | WriteAheadLog | None,
    node_id: str,
    storage_options: Mapping[str, Any] | None,
    resolved: ClientSettings,
    clock: Clock,
    rng: random.Random | None,
    accept_wal_loss: bool,
    metadata: str | MetadataLogStore | None,
    wal_client: str | None,
) -> StreamClient:
    """`open`'s work once its arguments are checked and its settings resolved: what can be
    checked without writing (`_check_before_writing`), then the store, the WAL's holder lock,
    the client (which registers the node, opens and recovers the WAL). `given_up`: set when
    `open`'s caller stopped waiting; then nothing new is started. An open that fails after
    it began writing leaves what it made (the store's directories, the node's registration,
    its WAL and lock file): s3stream's own files of that store, which the next open uses;
    nothing is deleted on a guess that it was this open's (another process may be opening
    the same store at that moment)."""
    _check_before_writing(url, scheme, wal, node_id, resolved.file_wal)
    raw_store = open_object_store(url, storage_options)
    # The client's one store stack, built here so that an object WAL in the same store shares
    # it (one boto3 client; its traffic in `client.metrics`); the client takes it as it is.
    store = store_stack(
        raw_store,
        clock=clock,
        rng=rng if rng is not None else random.Random(f"s3stream:{node_id}"),
        timeout_s=resolved.store_timeout_ms / 1000,
    )
    wal_arg: WriteAheadLog | WalFactory
    held: WalHolderLock | None = None
    if isinstance(wal, WriteAheadLog):
        wal_arg = wal
    elif wal is None and scheme not in ("memory", "file"):
        # A remote store's default: the object WAL in it, on this client's store stack (or,
        # for S3 through obstore, on a stack of its own over the same objects).
        try:
            own_store = _s3_wal_store_opener(url, scheme, storage_options, wal_client)
        except BaseException:
            store.close()
            raise
        wal_arg = _shared_object_wal(
            store,
            clock=clock,
            settings=resolved.object_wal,
            accept_wal_loss=accept_wal_loss,
            own_store=own_store,
            timeout_s=resolved.store_timeout_ms / 1000,
        )
    elif split_scheme(wal if wal is not None else url)[0] == "memory":
        # Through the factory: a node with streams open must not open on an empty WAL.
        wal_arg = url_wal_factory(
            wal if isinstance(wal, str) else "memory://",
            clock=clock,
            accept_wal_loss=accept_wal_loss,
        )
    else:
        target: str | Callable[[str], str]
        if wal is None:
            # The default file WAL of each node inside the directory (so that `take_over`
            # finds another node's beside this one's); its capacity is in the settings.
            def target(node: str) -> str:
                return default_wal_url(str(url), node, capacity=None) or ""
        else:
            target = wal
        # A file WAL of this node that a live process holds must fail the open here, before
        # the client registers the node: that would fence the live process.
        try:
            stop_if_given_up(given_up, f"the open of node {node_id!r}")
            held = lock_file_wal(target if isinstance(target, str) else target(node_id), node_id)
        except BaseException:
            store.close()
            raise
        wal_arg = url_wal_factory(
            target,
            clock=clock,
            file_settings=resolved.file_wal,
            object_settings=resolved.object_wal,
            storage_options=storage_options,
            held=held,
            accept_wal_loss=accept_wal_loss,
            s3_client=wal_client,
        )
    try:
        stop_if_given_up(given_up, f"the open of node {node_id!r}")
    except BaseException:
        # Before the client exists: let go of what it would have owned.
        if held is not None:
            held.release()
        if isinstance(wal_arg, WriteAheadLog):
            with contextlib.suppress(Exception):
                wal_arg.close()
        store.close()
        raise
    try:
        return StreamClient(
            store,
            wal_arg,
            node_id=node_id,
            settings=resolved,
            clock=clock,
            rng=rng,
            metadata=metadata,
        )
    except BaseException:
        if held is not None:
            held.release()  # idempotent: a WAL that took it over has released it already
        raise
