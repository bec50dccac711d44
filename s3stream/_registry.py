"""A URL-scheme registry shared by object stores and WALs (after fsspec's).

Implementations are registered by scheme as ``"module:attribute"`` strings and imported only
when first used, so optional dependencies (boto3, s3fs) cost nothing until a URL needs them.
Third parties plug in through an entry-point group, or at run time with `register`.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import unquote

from .errors import InvalidArgumentError
from .validation import check_scheme, check_target

__all__ = ["SchemeRegistry", "path_url", "split_scheme"]

T = TypeVar("T")

#: A plain path starting like a URL whose ``//`` is missing (``s3:/bucket``, ``memory:``).
#: One letter is a Windows drive (``C:\data``), not a scheme.
_SCHEME_WITHOUT_SLASHES = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
#: What makes a plain path look like it carries settings (``./x.wal?capacity_bytes=16MiB``).
_QUERY_IN_PATH = re.compile(r"\?[A-Za-z_][A-Za-z0-9_]*=")


def path_url(path: str | os.PathLike[str]) -> str:
    """The store URL of a local path given as a `Path`: its text, unless that text would read
    as something else (a scheme without ``//``, a ``?query``), then the ``file://`` URL that
    names exactly that path (a directory named ``x?a=1`` was refused as a path with a query;
    a `Path` is a path)."""
    text = os.fspath(path)
    if "://" in text or _SCHEME_WITHOUT_SLASHES.match(text) or _QUERY_IN_PATH.search(text):
        return Path(text).expanduser().absolute().as_uri()
    return text


def split_scheme(url: str) -> tuple[str, str]:
    """Split ``"scheme://rest"`` into ``("scheme", "rest")``; a plain path has scheme ``"file"``.

    A local path (plain or ``file://``) starting with ``~`` is expanded to the home
    directory here, so that everything derived from the URL (the objects' directory, the
    default WAL inside it) agrees on where it is. A plain path that starts like a URL with
    its ``//`` missing (``s3:/bucket``, ``memory:``) is an `InvalidArgumentError` naming the
    URL meant, not a directory of that name (``./s3:/bucket`` is one, if wanted).

    The path of a ``file://`` URL is percent-decoded, as `Path.as_uri` encodes it
    (``file:///data/my%20store`` is the directory ``/data/my store``); a plain path is taken
    as it is.
    """
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"a URL must be a non-empty str, got {url!r}")
    if "://" in url:
        scheme, rest = url.split("://", 1)
        scheme = scheme.lower()
        if scheme != "file":
            return scheme, rest
        # The name limits hold for the path alone, not for a WAL URL's ?query or a #fragment.
        bare = rest.split("?", 1)[0].split("#", 1)[0]
        _check_local_path(_expand_home(unquote(_local_path(bare, url)), url), url)
        return scheme, _expand_home(unquote(_local_path(rest, url)), url)
    typo = _SCHEME_WITHOUT_SLASHES.match(url)
    if typo is not None:
        scheme = typo.group(1).lower()
        path = url[typo.end() :].lstrip("/")
        meant = f"file:///{path}" if scheme == "file" else f"{scheme}://{path}"
        raise InvalidArgumentError(
            f"{url!r} looks like a URL without the '//' after '{typo.group(1)}:' (did you "
            f"mean {meant!r}?); for a local directory of that name write './{url}'"
        )
    if _QUERY_IN_PATH.search(url):
        # Else a directory or a 2 GiB WAL file named with the query, settings unapplied.
        raise InvalidArgumentError(
            f"{url!r} is a plain path, which takes no ?query: a WAL's settings go in a URL "
            "(file:///absolute/path.wal?capacity_bytes=...), a store's in storage_options; a "
            "name that holds '?' is written as %3F in a file:/// URL"
        )
    return "file", _check_local_path(_expand_home(url, url), url)


#: Longest name of one file or directory, and of a whole path, that Linux file systems take
#: (NAME_MAX, PATH_MAX less the NUL).
NAME_MAX, _PATH_MAX = 255, 4095


def _check_local_path(path: str, url: str) -> str:
    """`path`, refused if the OS could not name it: else a check such as ``Path.exists`` raises
    a bare `OSError` (``ENAMETOOLONG``) deep inside an open."""
    raw = os.fsencode(path)
    if len(raw) > _PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise InvalidArgumentError(
            f"{url!r} is too long for a local path: at most {NAME_MAX} bytes per file or "
            f"directory name and {_PATH_MAX} in all"
        )
    return path


def _local_path(rest: str, url: str) -> str:
    """The path of a ``file://`` URL whose part after ``//`` is `rest`: ``file:///abs`` and
    ``file://localhost/abs`` (RFC 8089) name ``/abs``, ``file://~/x`` the home directory's
    ``x``; another host is refused rather than read as a relative path (it once put a store
    in ``./localhost/abs``)."""
    if rest.startswith(("/", "~")):
        return rest
    if not rest:
        raise InvalidArgumentError(f"a file URL needs a path (file:///absolute/path), got {url!r}")
    host, slash, path = rest.partition("/")
    if host.lower() == "localhost":
        return slash + path or "/"
    raise InvalidArgumentError(
        f"a file URL names a path on this machine, file:///absolute/path (three slashes) or "
        f"file://localhost/absolute/path, not a host {host!r}: got {url!r} (for a relative "
        "path, give it without 'file://')"
    )


def _expand_home(path: str, url: str) -> str:
    """`path` with a leading ``~`` or ``~user`` replaced by that home directory."""
    if not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        user = path[1:].split("/", 1)[0]
        raise InvalidArgumentError(f"cannot expand {url!r}: no home directory for user {user!r}")
    return expanded


class SchemeRegistry(Generic[T]):
    """Maps URL schemes to factories, imported lazily; one instance per component kind."""

    def __init__(self, kind: str, entry_point_group: str, builtins: dict[str, str]) -> None:
        self._kind = kind
        self._group = entry_point_group
        self._targets: dict[str, str | Callable[..., T]] = dict(builtins)
        self._lock = threading.Lock()
        self._entry_points_loaded = False

    def register(
        self, scheme: str, target: str | Callable[..., T], *, clobber: bool = False
    ) -> None:
        """Register `target` (a factory, or ``"module:attr"``) for `scheme`; both are checked
        here, once for every kind of component."""
        check_scheme(scheme)
        check_target(target)
        with self._lock:
            if scheme in self._targets and not clobber:
                raise InvalidArgumentError(f"{self._kind} scheme {scheme!r} is already registered")
            self._targets[scheme] = target

    def schemes(self) -> list[str]:
        """All known schemes, sorted."""
        self._load_entry_points()
        return sorted(self._targets)

    def target_name(self, scheme: str) -> str | None:
        """``"module:attr"`` of what `scheme` is registered to (resolved or not), None if
        nothing is: tells a built-in factory from a user's without importing it."""
        self._load_entry_points()
        with self._lock:
            target = self._targets.get(scheme)
        if target is None or isinstance(target, str):
            return target
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"

    def resolve(self, scheme: str) -> Callable[..., T]:
        """The factory for `scheme`, importing it on first use."""
        self._load_entry_points()
        with self._lock:
            target = self._targets.get(scheme)
        if target is None:
            known = ", ".join(self.schemes())
            raise InvalidArgumentError(
                f"no {self._kind} for URL scheme {scheme!r} (known: {known})"
            )
        if isinstance(target, str):
            module_name, _, attr = target.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise InvalidArgumentError(
                    f"the {self._kind} for {scheme!r} needs an optional dependency: {exc}"
                ) from exc
            factory: Callable[..., T] = getattr(module, attr)
            with self._lock:
                self._targets[scheme] = factory
            return factory
        return target

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        found = entry_points(group=self._group)
        with self._lock:
            for ep in found:
                self._targets.setdefault(ep.name, ep.value)
            self._entry_points_loaded = True
