"""Choosing an object store by URL scheme.

Built in: ``file://`` and plain paths (`LocalObjectStore`), ``memory://`` (`MemoryObjectStore`),
``s3://`` and ``s3a://`` (`S3ObjectStore`), ``az://``, ``azure://``, ``abfs://`` and ``abfss://``
(`AzureObjectStore`, the ``azure`` extra), ``gs://`` and ``gcs://`` (`GcsObjectStore`, the
``gcs`` extra). Any other scheme fsspec knows (``hdfs://``, ``sftp://``, ...) opens an
`FsspecObjectStore`; ``fsspec+SCHEME://`` forces fsspec even for a built-in scheme
(``fsspec+memory://`` is fsspec's in-memory filesystem, ``fsspec+gcs://`` is gcsfs).

A factory is called as ``factory(url, **storage_options)`` and returns an `ObjectStore`.
Third parties register one under the entry-point group ``s3stream.object_stores``
(``name = "package.module:factory"``) or at run time with `register_object_store`.
The registry is the one piece of process-wide state here, like fsspec's, by design.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .._registry import SchemeRegistry, split_scheme
from ..errors import InvalidArgumentError
from .base import ObjectStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "FSSPEC_PREFIX",
    "open_object_store",
    "register_object_store",
    "storage_option_from_text",
]

#: Entry-point group through which installed packages add object-store schemes.
ENTRY_POINT_GROUP = "s3stream.object_stores"
#: Scheme prefix that routes a URL to fsspec even if the scheme has a built-in store.
FSSPEC_PREFIX = "fsspec+"

_registry: SchemeRegistry[ObjectStore] = SchemeRegistry(
    "object store",
    ENTRY_POINT_GROUP,
    {
        "file": "s3stream.objectstore.local:from_url",
        "memory": "s3stream.objectstore.memory:from_url",
        "s3": "s3stream.objectstore.s3:from_url",
        "s3a": "s3stream.objectstore.s3:from_url",
        "gs": "s3stream.objectstore.gcs:from_url",
        "gcs": "s3stream.objectstore.gcs:from_url",
        "az": "s3stream.objectstore.azure:from_url",
        "azure": "s3stream.objectstore.azure:from_url",
        "abfs": "s3stream.objectstore.azure:from_url",
        "abfss": "s3stream.objectstore.azure:from_url",
    },
)


def open_object_store(url: str, storage_options: Mapping[str, Any] | None = None) -> ObjectStore:
    """Open the object store a URL names, e.g. ``"s3://bucket/prefix"`` or ``"./data"``.

    `storage_options` are passed to the store's factory as keyword arguments (for ``s3://``:
    ``endpoint_url``, credentials, timeouts, ...; for ``file://``: ``fsync``). ``memory://``
    always opens a fresh, empty store: to share one, pass the same instance around.
    """
    scheme, rest = split_scheme(url)
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise InvalidArgumentError(
            f"storage_options must be a mapping, got {type(storage_options).__name__}"
        )
    options = dict(storage_options or {})
    if scheme.startswith(FSSPEC_PREFIX):
        from .fsspec_store import FsspecObjectStore

        return FsspecObjectStore(f"{scheme[len(FSSPEC_PREFIX) :]}://{rest}", **options)
    factory: Callable[..., ObjectStore]
    if scheme in _registry.schemes():
        factory = _registry.resolve(scheme)
    else:
        _require_fsspec_protocol(scheme)
        from .fsspec_store import FsspecObjectStore

        factory = FsspecObjectStore
    store = factory(url, **options)
    if not isinstance(store, ObjectStore):
        raise InvalidArgumentError(
            f"the object store factory for {scheme!r} returned {type(store).__name__}, "
            "not an ObjectStore"
        )
    return store


def register_object_store(
    scheme: str, target: str | Callable[..., ObjectStore], *, clobber: bool = False
) -> None:
    """Make `scheme` open stores through `target`.

    `target` is a factory ``(url, **storage_options) -> ObjectStore`` or its import path
    ``"package.module:factory"`` (imported on first use). Re-registering a scheme needs
    ``clobber=True``.
    """
    _registry.register(scheme, target, clobber=clobber)


def _require_fsspec_protocol(scheme: str) -> None:
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a core dependency
        raise InvalidArgumentError(f"no object store for URL scheme {scheme!r}") from exc
    known = set(fsspec.available_protocols())
    if scheme not in known:
        builtin = ", ".join(_registry.schemes())
        raise InvalidArgumentError(
            f"no object store for URL scheme {scheme!r} (built in: {builtin}; "
            "fsspec does not know it either)"
        )


#: Names of options that are text whatever they look like, in any store (S3's
#: ``endpoint_url``, ``region_name``, ``aws_*_key*``, ``addressing_style``; GCS's ``project``,
#: Azure's ``account_name``/``account_key``/``sas_token``, fsspec's ``username``/``password``,
#: obstore's ``access_key_id``...): ``project=123456789012`` must not become an int.
_TEXT_NAME = re.compile(
    r"key|secret|token|password|passwd|user|name|project|account|region|endpoint|url|"
    r"profile|bucket|container|tenant|client_id|credential|connection_string|style|sas"
)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")
_TRUE, _FALSE = frozenset({"true", "yes", "on"}), frozenset({"false", "no", "off"})


def storage_option_from_text(key: str, text: str) -> Any:
    """A storage option given as text (the CLI's ``-o``, Spark's ``storage.<name>``) as the
    store's option wants it: a bool, an int, a float or text (credentials, names, accounts,
    projects, regions, URLs and ``addressing_style`` stay text, by their names)."""
    if _TEXT_NAME.search(key):
        return text
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text
