"""Small argument checks and parsing shared by the object-store implementations: keys and
prefixes, a remote store's location (bucket or container, prefix, endpoint) and its URL and
``storage_options``; what an answer both S3 clients read alike means (`not_implemented`)."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .._registry import split_scheme
from ..errors import InvalidArgumentError, S3StreamError
from ..validation import check_text
from .base import ObjectInfo, check_key

__all__ = [
    "as_bytes",
    "check_endpoint",
    "check_location",
    "check_optional_text",
    "check_prefix",
    "check_storage_options",
    "check_suffix_length",
    "delete_batches",
    "listed",
    "map_in_context",
    "not_implemented",
    "split_url",
]


T = TypeVar("T")
R = TypeVar("R")


def map_in_context(fn: Callable[[T], R], items: Iterable[T], threads: int, name: str) -> list[R]:
    """``[fn(item) for item in items]``, run on up to `threads` threads, each call in a copy
    of the caller's context variables: the purpose a request is counted under
    (`MetricsObjectStore`) and the caller's deadline (`_call_deadline`) are context
    variables, which a plain pool's threads would not see."""
    context = contextvars.copy_context()

    def run(item: T) -> R:
        # One copy per call: a context cannot be entered by two threads at once.
        return context.copy().run(fn, item)

    with ThreadPoolExecutor(threads, name) as pool:
        return list(pool.map(run, items))


def as_bytes(data: bytes) -> bytes:
    """`data` as immutable bytes; bytearray and memoryview are copied (callers may reuse them)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise InvalidArgumentError(f"data must be bytes, got {type(data).__name__}")


def check_prefix(prefix: str) -> str:
    """Validate a `list` prefix: any str (it need not end at a ``/``)."""
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, got {prefix!r}")
    return prefix


def check_suffix_length(length: int) -> int:
    """Validate the `length` argument of `get_suffix`."""
    if type(length) is not int or length <= 0:
        raise InvalidArgumentError(f"suffix length must be an int > 0, got {length!r}")
    return length


def check_location(noun: str, root: object, prefix: object) -> str:
    """Check a remote store's `root` (its bucket or container, named `noun` in errors) and
    key `prefix` inside it (by `check_key`'s rules: no ``\\``, UTF-8, ...); the prefix
    normalized: empty or ending with ``/`` (a trailing ``/`` is implied, leading ones
    dropped)."""
    if not isinstance(root, str) or not root or "/" in root or "\\" in root:
        raise InvalidArgumentError(
            f"{noun} must be a non-empty name without '/' or '\\', got {root!r}"
        )
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, got {prefix!r}")
    stripped = prefix.strip("/")
    if stripped:
        try:
            check_key(stripped)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"invalid prefix {prefix!r}: {exc}") from exc
    return f"{stripped}/" if stripped else ""


def check_optional_text(**values: object) -> None:
    """Each of `values` (by argument name) that is not None: a non-empty str."""
    for name, value in values.items():
        if value is not None:
            check_text(name, value, allow_empty=False)


def check_endpoint(name: str, value: str | None) -> str | None:
    """`value` if it is None or an ``http://`` or ``https://`` URL naming a host."""
    if value is None:
        return None
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(f"{name} must be an http:// or https:// URL, got {value!r}")
    return value


def split_url(url: str, schemes: Collection[str], kind: str, noun: str) -> tuple[str, str, str]:
    """(scheme, authority, prefix) of ``scheme://authority/prefix``, the store URL of one of
    `schemes`; `InvalidArgumentError` for another scheme (``not {kind} URL``) or a URL that
    names no authority (no `noun`: bucket, container)."""
    scheme, rest = split_scheme(url)
    if scheme not in schemes:
        raise InvalidArgumentError(f"not {kind} URL: {url!r}")
    authority, _, prefix = rest.partition("/")
    if not authority:
        raise InvalidArgumentError(f"the URL {url!r} names no {noun}")
    if "?" in rest or "#" in rest:
        # Taken as part of the prefix, the store's objects would land under a prefix other
        # code (the default WAL's URL) reads as ending before the '?': two places at once.
        raise InvalidArgumentError(
            f"the store URL {url!r} has a query or fragment ('?' or '#'): a store's options "
            "go in storage_options (a WAL's own URL takes its settings in its query)"
        )
    return scheme, authority, prefix


def check_storage_options(
    cls: type, options: Mapping[str, Any], where: str, hint: str = ""
) -> dict[str, Any]:
    """`options` as keyword arguments of `cls`'s constructor (its keyword-only parameters);
    `InvalidArgumentError` naming the unknown ones and the known (for `where`, the scheme,
    and `hint` after them)."""
    params = inspect.signature(cls).parameters
    known = {p.name for p in params.values() if p.kind is p.KEYWORD_ONLY}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidArgumentError(
            f"unknown storage_options for {where}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))}{hint})"
        )
    return dict(options)


def delete_batches(keys: Iterable[str], size: int, prefix: str = "") -> list[list[str]]:
    """The batches (of at most `size`) in which `delete_many` deletes `keys`, each with
    `prefix` before it: every key checked before any is deleted, duplicates dropped (S3
    reports them as errors)."""
    unique = list(dict.fromkeys(prefix + check_key(key) for key in keys))
    return [unique[i : i + size] for i in range(0, len(unique), size)]


def listed(name: str, cut: int, prefix: str, size: int) -> ObjectInfo | None:
    """The entry a listing names (`name` with the store's own prefix, its first `cut`
    characters), as `list(prefix)` yields it; None for names `list` skips: not under `prefix`
    (some services normalize the prefix: ``a//`` lists ``a/``), or not a valid key (e.g.
    ``dir/`` markers made by consoles: never our objects)."""
    key = name[cut:]
    if not key.startswith(prefix):
        return None
    try:
        check_key(key)
    except InvalidArgumentError:
        return None
    return ObjectInfo(key, size)


def not_implemented(what: str, detail: str, action: str) -> S3StreamError:
    """The error of a 501 (AWS's NotImplemented: a request the service does not implement,
    e.g. a conditional write where it has none): permanent, no retry changes it. `what`
    names the call, `detail` the answer, `action` the kind of call ("create": a
    conditional write, which s3stream needs)."""
    need = "; s3stream needs conditional writes (If-None-Match)" if action == "create" else ""
    return S3StreamError(
        f"cannot {what}: the service does not implement this request ({detail}){need}"
    )
