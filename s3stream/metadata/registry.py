"""Choosing where the metadata log lives, by URL.

No URL (the default): the object-store log, `MetadataLog`, under the metadata prefix of the
store that holds the data. Built in besides: ``postgresql://`` and ``postgres://``
(`PostgresMetadataLog`, with the ``postgres`` extra). The data objects stay in the object store
whichever it is; only the log moves.

A factory is called as ``factory(url, namespace=..., settings=...)`` (`namespace`: the client's
metadata prefix, the default name of its log; `settings`: the client's `ClientSettings`, for
deadlines) and returns a `MetadataLogStore`. Third parties register one under the entry-point
group ``s3stream.metadata_stores`` or at run time with `register_metadata_store`. The registry
is, like the object stores' and the WALs', the one piece of process-wide state here, by design.
"""

from __future__ import annotations

from collections.abc import Callable

from .._registry import SchemeRegistry, split_scheme
from ..errors import InvalidArgumentError
from ..objectstore.base import ObjectStore
from ..settings import ClientSettings
from ..validation import check_text
from .base import MetadataLogStore
from .log import MetadataLog
from .postgres_url import SCHEMES as POSTGRES_SCHEMES
from .postgres_url import check_postgres_url

__all__ = [
    "ENTRY_POINT_GROUP",
    "check_metadata_url",
    "open_metadata_log",
    "register_metadata_store",
]

#: Entry-point group through which installed packages add metadata-store schemes.
ENTRY_POINT_GROUP = "s3stream.metadata_stores"

_POSTGRES_FACTORY = "s3stream.metadata.postgres:from_url"

_registry: SchemeRegistry[MetadataLogStore] = SchemeRegistry(
    "metadata store",
    ENTRY_POINT_GROUP,
    {
        "postgresql": _POSTGRES_FACTORY,
        "postgres": _POSTGRES_FACTORY,
    },
)


def check_metadata_url(url: object) -> str | None:
    """`url` if it is None or names a known metadata store scheme (checked before anything
    is opened, so a typo fails first)."""
    if url is None:
        return None
    check_text("metadata", url, allow_empty=False)
    assert isinstance(url, str)
    if "://" not in url:
        raise InvalidArgumentError(
            f"metadata must be a URL such as postgresql://user@host:5432/db, got {url!r} "
            "(leave it out to keep the log in the object store)"
        )
    scheme = split_scheme(url)[0]
    if scheme not in _registry.schemes():
        raise InvalidArgumentError(
            f"no metadata store for URL scheme {scheme!r} (known: "
            f"{', '.join(_registry.schemes())}; none: the log stays in the object store)"
        )
    if scheme in POSTGRES_SCHEMES and _registry.target_name(scheme) == _POSTGRES_FACTORY:
        # The whole URL, not only its scheme: a typo in its query was found when the log
        # was opened, after the store's directories and the WAL's lock file were made.
        check_postgres_url(url)
    return url


def open_metadata_log(
    metadata: str | MetadataLogStore | None,
    *,
    store: ObjectStore,
    prefix: str,
    settings: ClientSettings | None = None,
) -> MetadataLogStore:
    """The log `metadata` names: an instance as it is, a URL through its factory (its
    namespace defaults to `prefix`), None the object-store log in `store` under `prefix`."""
    if isinstance(metadata, MetadataLogStore):
        return metadata
    if metadata is None:
        return MetadataLog(store, prefix)
    url = check_metadata_url(metadata)
    assert url is not None
    factory = _registry.resolve(split_scheme(url)[0])
    log = factory(url, namespace=prefix, settings=settings)
    if not isinstance(log, MetadataLogStore):
        raise InvalidArgumentError(
            f"the metadata store factory for {url.split('://', 1)[0]!r} returned "
            f"{type(log).__name__}, not a MetadataLogStore"
        )
    return log


def register_metadata_store(
    scheme: str, target: str | Callable[..., MetadataLogStore], *, clobber: bool = False
) -> None:
    """Make `scheme` open metadata logs through `target` (a factory or ``"module:attr"``)."""
    _registry.register(scheme, target, clobber=clobber)
