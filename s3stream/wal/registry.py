"""Choosing a write-ahead log by URL scheme.

Built in: ``memory://`` (a fresh `MemoryWal`), ``file://`` URLs or plain paths (a `FileWal`
on a file or a raw block device such as ``/dev/nvme1n1``), and the object-store WAL
(`ObjectWal`) on ``s3://bucket/prefix/wal`` or, with the ``object+`` prefix, on any object-store
URL (``object+file:///var/wal``, ``object+memory://``). A ``file://`` URL may carry
settings in its query, overriding single fields of `FileWalSettings`::

    file:///mnt/ebs/s3stream.wal?capacity_bytes=2GiB&direct_io=1&full_wait_ms=30s

The names are the fields' (the first short names, ``capacity``, ``direct``, ``max_group`` and
``recovery_window``, are still accepted) and the values follow `s3stream.settings_parse`: sizes
in bytes or ``KiB``/``MiB``/``GiB``/``TiB``, durations in milliseconds or ``ms``/``s``/``min``/
``h`` (docs/configuration.md). An ``s3://`` WAL URL may name its S3 client in its query,
``?client=obstore`` (the default when obstore is installed: a small PUT, the WAL's latency,
costs about half as much as through boto3) or ``?client=boto3`` (`S3_WAL_CLIENTS`).

A factory is called as ``factory(url, node_id=..., node_epoch=..., clock=..., on_full=...,
file_settings=..., object_settings=..., storage_options=..., **options)`` and returns a
`WriteAheadLog`; it uses the arguments its kind needs (and ignores the rest: a take-over adds
``take_over=True``). Third parties register one under the entry-point group ``s3stream.wals``
(``name = "package.module:factory"``) or at run time with `register_wal`. The registry is the
one piece of process-wide state here, like fsspec's, by design.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from .._registry import NAME_MAX, SchemeRegistry, split_scheme
from ..clock import Clock
from ..errors import CorruptionError, InvalidArgumentError
from ..objectstore.base import ObjectStore
from ..settings import FileWalSettings, ObjectWalSettings
from ..settings_parse import parse_size, settings_from_query
from ..validation import check_choice
from .base import WriteAheadLog
from .file import FileWal
from .file_scan import UnusableWal, peek_wal
from .framing import DATA_START, file_bytes, may_hold_header
from .holder import LOCK_SUFFIX, WalHolderLock
from .loss import check_open_node_wal, refuse_foreign_wal
from .memory import MemoryWal

__all__ = [
    "ENTRY_POINT_GROUP",
    "S3_WAL_CLIENTS",
    "UrlWalFactory",
    "check_file_wal_owner",
    "check_take_over_wal",
    "check_wal_target",
    "default_s3_wal_client",
    "file_wal_path",
    "lock_file_wal",
    "open_s3_wal",
    "open_s3_wal_store",
    "open_wal",
    "parse_size",
    "register_wal",
    "url_wal_factory",
]

#: Entry-point group through which installed packages add WAL schemes.
ENTRY_POINT_GROUP = "s3stream.wals"

_registry: SchemeRegistry[WriteAheadLog] = SchemeRegistry(
    "WAL",
    ENTRY_POINT_GROUP,
    {
        "file": "s3stream.wal.registry:open_file_wal",
        "memory": "s3stream.wal.registry:open_memory_wal",
        "s3": "s3stream.wal.registry:open_s3_wal",
        "s3a": "s3stream.wal.registry:open_s3_wal",
    },
)

#: Scheme prefix that opens an object-store WAL on any object-store URL (``object+file://``).
OBJECT_PREFIX = "object+"

#: The S3 clients an S3 WAL may use: obstore (`ObstoreS3ObjectStore`) or boto3
#: (`S3ObjectStore`).
S3_WAL_CLIENTS = ("obstore", "boto3")


def default_s3_wal_client() -> str:
    """The S3 WAL's client when none is named: obstore when it is installed (the ``s3`` extra
    brings it), else boto3."""
    return "obstore" if importlib.util.find_spec("obstore") is not None else "boto3"


def open_s3_wal_store(
    url: str, storage_options: Mapping[str, Any] | None, client: str | None
) -> ObjectStore:
    """The store of an S3 WAL at `url` (``s3://bucket/prefix``) through `client` (one of
    `S3_WAL_CLIENTS`, None for `default_s3_wal_client`)."""
    chosen = check_choice(
        "client", client if client is not None else default_s3_wal_client(), S3_WAL_CLIENTS
    )
    if chosen == "boto3":
        from ..objectstore.registry import open_object_store

        return open_object_store(url, storage_options)
    from ..objectstore.s3_obstore import ObstoreS3ObjectStore

    return ObstoreS3ObjectStore.from_url(url, **dict(storage_options or {}))


def open_s3_wal(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    s3_client: str | None = None,
    **options: Any,
) -> WriteAheadLog:
    """Factory of ``s3://bucket/prefix/wal`` (and ``s3a://``): `open_object_wal` (which takes
    `options`, the factory's other arguments) through the S3 client the query's ``client``
    names (else `s3_client`, else `default_s3_wal_client`). The rest of the query overrides
    single fields of ``object_settings``, as there."""
    from .object import open_object_wal

    store_url, named, rest = _split_s3_wal_url(url)
    client = named if named is not None else s3_client
    return open_object_wal(
        f"{store_url}?{rest}" if rest else store_url,
        open_store=lambda store_url: open_s3_wal_store(store_url, storage_options, client),
        **options,
    )


def _split_s3_wal_url(url: str) -> tuple[str, str | None, str]:
    """An S3 WAL URL's store URL, the client its query names (None: none) and the rest of
    its query (the WAL's settings)."""
    store_url, _, query = url.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    clients = [value for name, value in pairs if name == "client"]
    if len(clients) > 1:
        raise InvalidArgumentError(f"the WAL URL {url!r} names its client more than once")
    rest = urlencode([(name, value) for name, value in pairs if name != "client"])
    return store_url, clients[0] if clients else None, rest


def open_wal(
    url: str,
    *,
    node_id: str,
    clock: Clock,
    settings: FileWalSettings | None = None,
    node_epoch: int = 0,
    on_full: Callable[[], None] | None = None,
    file_settings: FileWalSettings | None = None,
    object_settings: ObjectWalSettings | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> WriteAheadLog:
    """Open the WAL a URL names: ``"memory://"``, ``"file:///path?capacity_bytes=2GiB"``, a path.

    `settings` (or its alias `file_settings`) configures a file WAL; the URL's query overrides
    single fields. `object_settings` and `storage_options` are for object-store WALs.
    `options` go to the factory as they are (for a file WAL: ``create``).
    """
    if settings is not None and file_settings is not None:
        raise InvalidArgumentError("pass settings or file_settings, not both")
    scheme, _ = split_scheme(url)
    factory: Callable[..., WriteAheadLog]
    if scheme.startswith(OBJECT_PREFIX):
        from .object import open_object_wal

        factory = open_object_wal
    else:
        factory = _registry.resolve(scheme)
    wal = factory(
        url,
        node_id=node_id,
        node_epoch=node_epoch,
        clock=clock,
        on_full=on_full,
        file_settings=settings if settings is not None else file_settings,
        object_settings=object_settings,
        storage_options=storage_options,
        **options,
    )
    if not isinstance(wal, WriteAheadLog):
        raise InvalidArgumentError(
            f"the WAL factory for {scheme!r} returned {type(wal).__name__}, not a WriteAheadLog"
        )
    return wal


def url_wal_factory(
    url: str | Callable[[str], str],
    *,
    clock: Clock,
    file_settings: FileWalSettings | None = None,
    object_settings: ObjectWalSettings | None = None,
    storage_options: Mapping[str, Any] | None = None,
    held: WalHolderLock | None = None,
    accept_wal_loss: bool = False,
    s3_client: str | None = None,
) -> UrlWalFactory:
    """The one way a client opens a WAL by URL, for its own node (`s3stream.open`) and for a
    node it takes over (`StreamClient.take_over`): a `WalFactory` ``(node_id, node_epoch,
    on_full, *, take_over=False, must_exist=False, expect_uid=None)`` calling `open_wal` with the
    client's WAL settings (the URL's query overrides single fields). `expect_uid`: the WAL
    identity the store recorded for the node (`FileWal`'s and `ObjectWal`'s).

    `url` is the WAL's URL, or a function of the node id giving it (each node's default file
    WAL inside a local store). `held`: the holder lock of the client's own file WAL, taken
    already (`lock_file_wal`); handed to the WAL the first time the factory opens that node's
    WAL. `must_exist` (a node whose streams are still open, so its WAL may hold acknowledged
    appends): a file WAL that is missing or empty, or an object WAL prefix without objects, is
    damage, `CorruptionError`, unless `accept_wal_loss`. `s3_client`: the client of an
    ``s3://`` WAL whose URL names none (`S3_WAL_CLIENTS`).
    """
    return UrlWalFactory(
        url,
        clock=clock,
        file_settings=file_settings,
        object_settings=object_settings,
        storage_options=storage_options,
        held=held,
        accept_wal_loss=accept_wal_loss,
        s3_client=s3_client,
    )


@dataclass
class UrlWalFactory:
    """`url_wal_factory`'s factory, with `check_node` beside it."""

    url: str | Callable[[str], str]
    clock: Clock
    file_settings: FileWalSettings | None
    object_settings: ObjectWalSettings | None
    storage_options: Mapping[str, Any] | None
    held: WalHolderLock | None
    accept_wal_loss: bool
    s3_client: str | None

    def _target(self, node_id: str) -> str:
        return self.url if isinstance(self.url, str) else self.url(node_id)

    def check_node(self, node_id: str, *, must_exist: bool, expect_uid: int | None = None) -> None:
        """Refuse now what opening `node_id`'s WAL would refuse without opening anything (a
        node with streams open on a memory WAL, or on a file WAL that is missing or empty; a
        file WAL of another node, or of another identity than `expect_uid`, the one the
        store recorded, by `check_file_wal_owner`; an object WAL's prefix wiped, or of
        another identity, by `ObjectWal.preflight`): the client calls this before it
        registers the node, which fences a live process of that node (`s3stream compact
        --node-id N` beside N's writer fenced it, and then failed on the memory WAL), and
        so does a take-over."""
        target = self._target(node_id)
        scheme, _ = split_scheme(target)
        if scheme == "memory" and _registry.resolve(scheme) is open_memory_wal:
            if must_exist:
                open_memory_wal(
                    target, node_id=node_id, must_exist=True, accept_wal_loss=self.accept_wal_loss
                )
        elif scheme == "file" and _registry.resolve(scheme) is open_file_wal:
            path = Path(_file_target(target)[0])
            if must_exist:
                _check_wal_present(path, node_id, self.accept_wal_loss)
            check_file_wal_owner(
                path,
                node_id,
                must_exist=must_exist,
                expect_uid=expect_uid,
                accept_loss=self.accept_wal_loss,
            )
        elif scheme.startswith(OBJECT_PREFIX) or _registry.resolve(scheme) is open_s3_wal:
            # Made without I/O, judged read-only (`ObjectWal.preflight`), closed unrecovered.
            from .object import ObjectWal

            made = self(node_id, 0, lambda: None, must_exist=must_exist, expect_uid=expect_uid)
            with contextlib.closing(made) as wal:
                if isinstance(wal, ObjectWal):
                    wal.preflight()

    def __call__(
        self,
        node_id: str,
        node_epoch: int,
        on_full: Callable[[], None],
        *,
        take_over: bool = False,
        must_exist: bool = False,
        expect_uid: int | None = None,
    ) -> WriteAheadLog:
        extra: dict[str, Any] = {
            "must_exist": must_exist,
            "accept_wal_loss": self.accept_wal_loss,
        }
        if expect_uid is not None:
            extra["expect_uid"] = expect_uid
        if self.s3_client is not None:
            extra["s3_client"] = self.s3_client
        if take_over:
            extra["take_over"] = True
        elif self.held is not None and self.held.node_id == node_id:
            # Handed to the WAL the first time it opens that node's WAL.
            extra["lock"], self.held = self.held, None
        return open_wal(
            self._target(node_id),
            node_id=node_id,
            node_epoch=node_epoch,
            on_full=on_full,
            clock=self.clock,
            file_settings=self.file_settings,
            object_settings=self.object_settings,
            storage_options=self.storage_options,
            **extra,
        )


def register_wal(
    scheme: str, target: str | Callable[..., WriteAheadLog], *, clobber: bool = False
) -> None:
    """Make `scheme` open WALs through `target`, a factory or its ``"module:attribute"`` path.

    Re-registering a scheme needs ``clobber=True``.
    """
    _registry.register(scheme, target, clobber=clobber)


def open_memory_wal(
    url: str,
    *,
    node_id: str = "",
    must_exist: bool = False,
    accept_wal_loss: bool = False,
    **_ignored: Any,
) -> WriteAheadLog:
    """Factory of ``memory://``: a new, empty `MemoryWal` (nothing survives the process).
    With `must_exist` (the node still has streams open: its own WAL may hold acknowledged
    appends) `CorruptionError`, unless `accept_wal_loss`: the client would release those
    streams at its close, and their appends in the node's real WAL would be lost."""
    _check_memory_url(url)
    if must_exist:
        check_open_node_wal(
            node_id,
            "an in-memory WAL holds none of them: open the node with its own WAL (or take it "
            "over with it)",
            location=url,
            accept_loss=accept_wal_loss,
        )
    return MemoryWal()


def _check_memory_url(url: str) -> None:
    if split_scheme(url)[1].strip("/"):
        raise InvalidArgumentError(f"a memory WAL URL takes no path or options, got {url!r}")


def _check_wal_present(path: Path, node_id: str, accept_loss: bool) -> None:
    try:
        size = path.stat().st_size if not path.is_block_device() else 1
    except FileNotFoundError:
        size = -1
    if size > 0:
        return
    what = "missing" if size < 0 else "empty"
    check_open_node_wal(
        node_id,
        f"the WAL {path} is {what}: they are lost unless the file is restored",
        location=str(path),
        accept_loss=accept_loss,
    )


def open_file_wal(
    url: str,
    *,
    node_id: str,
    node_epoch: int = 0,
    clock: Clock,
    on_full: Callable[[], None] | None = None,
    file_settings: FileWalSettings | None = None,
    create: bool = True,
    take_over: bool = False,
    lock: WalHolderLock | None = None,
    must_exist: bool = False,
    accept_wal_loss: bool = False,
    expect_uid: int | None = None,
    **_other_kinds: Any,
) -> WriteAheadLog:
    """Factory of ``file://`` URLs and plain paths: a `FileWal` (file or block device).

    `take_over` opens a WAL a live process holds (a take-over fences it); `lock` is its
    holder lock taken beforehand (`lock_file_wal`). `must_exist`: the node still has streams
    open, so a missing or empty WAL is damage (`CorruptionError`) unless `accept_wal_loss`,
    which also lets recovery go on past damaged records (`FileWal`'s `accept_loss`).
    `expect_uid`: `FileWal`'s (the identity the store recorded for the node's WAL)."""
    path, query = _file_target(url)
    if must_exist:
        _check_wal_present(Path(path), node_id, accept_wal_loss)
    settings = settings_from_query(FileWalSettings, query, base=file_settings, url=url)
    return FileWal(
        path,
        node_id=node_id,
        node_epoch=node_epoch,
        settings=settings,
        clock=clock,
        on_full=on_full,
        create=create,
        take_over=take_over,
        lock=lock,
        accept_loss=accept_wal_loss,
        expect_uid=expect_uid,
        must_exist=must_exist,
    )


def lock_file_wal(url: str, node_id: str) -> WalHolderLock | None:
    """Take the holder lock of the file WAL `url` names now, before the WAL is opened (pass
    it on as ``lock=``); None for other kinds of WAL. Raises `NodeInUseError` when a live
    process holds it: a client checks this before it registers its node, which would fence
    that process."""
    scheme, _ = split_scheme(url)
    if scheme != "file" or _registry.resolve("file") is not open_file_wal:
        return None
    path, query = _file_target(url)
    # A mistake in the settings must fail here too, before anything is registered.
    settings_from_query(FileWalSettings, query, url=url)
    return WalHolderLock.acquire(path, node_id)


def check_wal_target(url: str, *, base: FileWalSettings | None = None) -> Path | None:
    """Check what can be checked of the WAL `url` names without writing anything, so that an
    open refuses a mistake before it creates a store, registers a node or takes a lock: the
    scheme is known and, for a file WAL (the built-in factory), its path is not a directory,
    has no file where a directory must be, and is not a file holding something other than a
    WAL (an existing WAL, a device and a file of zeros are for the WAL to judge). Returns the
    file WAL's path (None for other kinds), `InvalidArgumentError` naming it otherwise."""
    target = _checked_target(url, base)
    return None if target is None else target[0]


def _checked_target(url: str, base: FileWalSettings | None) -> tuple[Path, str | None] | None:
    """`check_wal_target`'s work: the file WAL's path and what is there (`_file_kind` of a
    regular file, else None), or None for other kinds of WAL."""
    scheme, _ = split_scheme(url)
    if scheme.startswith(OBJECT_PREFIX):
        # The object store's URL is checked when that store is opened; the WAL's settings
        # in the query now (a typo there was refused after the node was registered).
        settings_from_query(ObjectWalSettings, url.partition("?")[2], url=url)
        return None
    resolved = _registry.resolve(scheme)
    if resolved is open_s3_wal:
        _, client, rest = _split_s3_wal_url(url)
        if client is not None:
            check_choice("client", client, S3_WAL_CLIENTS)
        settings_from_query(ObjectWalSettings, rest, url=url)
        return None
    if resolved is open_memory_wal:
        _check_memory_url(url)
        return None
    if resolved is not open_file_wal:
        return None
    raw_path, query = _file_target(url)
    settings = settings_from_query(FileWalSettings, query, base=base, url=url)
    path = Path(raw_path).expanduser()
    if len(os.fsencode(path.name + LOCK_SUFFIX)) > NAME_MAX:
        # The WAL's own name may fit; the lock file beside it would fail later, half made.
        raise InvalidArgumentError(
            f"the WAL name {path.name!r} is too long: with {LOCK_SUFFIX!r} added (its lock "
            f"file) it passes {NAME_MAX} bytes"
        )
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            # Refused before anything is written (it was, after the store was made).
            raise InvalidArgumentError(
                f"the WAL {str(path)!r} cannot be reached: symbolic links on its way form a loop"
            ) from None
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidArgumentError(
                    f"the WAL {str(path)!r} cannot be created: {str(parent)!r} is not a directory"
                )
            break
    if path.is_dir():
        raise InvalidArgumentError(
            f"the WAL {str(path)!r} is a directory: name a file (for example "
            f"{str(path / 'node.wal')!r}), which the WAL creates"
        )
    kind = _file_kind(path, settings.capacity_bytes) if path.is_file() else None
    if kind == "foreign":
        raise InvalidArgumentError(
            f"{str(path)!r} is not an s3stream WAL (no header magic where a WAL has one); "
            "refusing to use it: name a new file or an existing WAL"
        )
    return path, kind


def _file_kind(path: Path, capacity_bytes: int) -> str:
    """How `FileWal` (with `capacity_bytes`) would take the regular file `path`: "wal" (the
    header magic: a WAL, whole or damaged), "new" (empty, or all zeros where the headers go
    at exactly a WAL's size: a creation cut short; either is formatted) or "foreign" (it
    refuses it). Unreadable: "wal", left to the WAL to report."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(DATA_START)
    except OSError:
        return "wal"
    if may_hold_header(head):
        return "wal"
    if size == 0 or (not head.strip(b"\0") and size == file_bytes(capacity_bytes)):
        return "new"
    return "foreign"


def check_file_wal_owner(
    path: Path,
    node_id: str,
    *,
    must_exist: bool,
    expect_uid: int | None,
    accept_loss: bool,
) -> None:
    """What `FileWal` would refuse of the WAL at `path` by its header, read-only, before
    anything is registered: a WAL of another node (`InvalidArgumentError`), or of another
    identity than `expect_uid` (the store's record for the node) that holds records, or
    any while the node's streams are open (`must_exist`; `refuse_foreign_wal`, the WAL's
    own rule). A path without a readable WAL header passes (the open judges it)."""
    peeked = peek_wal(path)
    if peeked is None:
        return
    if isinstance(peeked, UnusableWal):
        # The WAL's open refuses it (a damage `accept_loss` may go past: left to the open);
        # judged here, it was refused after the node was registered, fencing a live one.
        if accept_loss:
            return
        raise CorruptionError(
            f"WAL {path} of node {node_id!r} cannot be opened: {peeked.problem}; nothing "
            "was registered (open with accept_wal_loss=True to go on without its records, "
            "where the damage allows)",
            location=str(path),
        )
    if peeked.node_id != node_id:
        raise InvalidArgumentError(
            f"WAL {path} belongs to node {peeked.node_id!r}, not node_id={node_id!r}"
        )
    if expect_uid is not None and peeked.wal_uid != expect_uid:
        refuse_foreign_wal(
            str(path),
            node_id,
            found=peeked.wal_uid,
            expect_uid=expect_uid,
            holds_records=peeked.holds_records,
            must_exist=must_exist,
            accept_loss=accept_loss,
        )


def check_take_over_wal(
    url: str,
    node_id: str,
    *,
    open_streams: bool,
    accept_loss: bool,
    base: FileWalSettings | None = None,
    expect_uid: int | None = None,
    default: bool = False,
) -> None:
    """Before a take-over registers anything: a file WAL named explicitly must exist. A node
    with streams open may have acknowledged appends in it: missing, that is the loss
    `CorruptionError` of `_check_wal_present` (unless `accept_loss`); with every stream
    closed there is nothing to recover, and the path is more likely a typo than a WAL to
    create (a 2 GiB one, by default): `InvalidArgumentError`, "no WAL at ...". So is an
    existing file that holds no WAL yet (empty, or zeros): formatting it would turn the
    user's file into a WAL. A WAL there of another node or store is refused as its open
    would refuse it (`check_file_wal_owner`, with `expect_uid`, the store's record for the
    node): a take-over registers the node first, which fences it, alive or not. `base`: the
    WAL settings the take-over opens it with; `default`: `url` is the node's default WAL,
    not one the caller named (for the advice of the errors)."""
    target = _checked_target(url, base)
    if target is None:
        return
    path, kind = target
    advice = (
        "name the node's WAL if it lives elsewhere"
        if default
        else "check the path, or leave the WAL out to use the default"
    )
    if path.exists():
        if kind in (None, "wal"):  # a device, or a WAL
            check_file_wal_owner(
                path,
                node_id,
                must_exist=open_streams,
                expect_uid=expect_uid,
                accept_loss=accept_loss,
            )
            return
        if open_streams:
            return
        raise InvalidArgumentError(
            f"{str(path)!r} holds no WAL of node {node_id!r} (it is empty or zeros, and the "
            f"node's streams are all closed, so there is nothing to recover): {advice}"
        )
    if open_streams:
        _check_wal_present(path, node_id, accept_loss)
        return
    raise InvalidArgumentError(
        f"no WAL at {str(path)!r} for node {node_id!r} (its streams are all closed, so it has "
        f"nothing to recover): {advice}"
    )


def file_wal_path(url: str) -> str:
    """The path a file WAL's URL or plain path names (``file:///abs?capacity_bytes=..`` or
    ``/abs``), for tools that read the file itself; `InvalidArgumentError` for a URL of
    another kind of WAL."""
    if "://" in url and not url.lower().startswith("file://"):
        raise InvalidArgumentError(f"not a file WAL (a path or a file:// URL): {url!r}")
    return _file_target(url)[0]


def _file_target(url: str) -> tuple[str, str]:
    """The path and the query of a file WAL URL (a plain path has no query)."""
    if "://" not in url:
        if url.lower().startswith("file:"):
            raise InvalidArgumentError(
                f"a file WAL URL is file:///absolute/path (three slashes), got {url!r}"
            )
        if "\0" in url:
            raise InvalidArgumentError(f"a file WAL path cannot hold a NUL byte, got {url!r}")
        # As for a store's URL: ``~`` is the home directory, a missing ``//`` is refused.
        return split_scheme(url)[1], ""
    parts = urlsplit(url)
    if parts.fragment:
        raise InvalidArgumentError(f"a file WAL URL takes no #fragment, got {url!r}")
    if parts.netloc not in ("", "localhost"):
        raise InvalidArgumentError(
            f"a file WAL URL names a path on this machine: file:///path (three slashes), not "
            f"a host {parts.netloc!r}, got {url!r}"
        )
    path = unquote(parts.path)
    if not path or path.endswith("/"):
        raise InvalidArgumentError(f"a file WAL URL needs the path of a file, got {url!r}")
    if "\0" in path:
        raise InvalidArgumentError(f"a file WAL path cannot hold a NUL byte, got {url!r}")
    return path, parts.query
