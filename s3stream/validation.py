"""Argument checks shared by every public entry point.

One function per kind of argument, each returning the checked (or normalized) value and
raising `InvalidArgumentError` whose message names the argument. Calls check their arguments
first, before any side effect, so a caller's mistake fails that call only and changes
nothing. Checks are exact about types: a ``bool`` is not an int (``True`` as a size is
always a mistake), a float is not an int, and text must be encodable as UTF-8 (everything
the library stores — tags, properties, header names, node ids — is written as UTF-8, and a
lone surrogate such as ``"\\ud800"`` would otherwise fail deep inside an encoder).

This module imports nothing from s3stream but `errors`, so any module may use it.
"""

from __future__ import annotations

import math
import re
import reprlib
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, SupportsIndex, TypeGuard, TypeVar

import zstandard

from .errors import InvalidArgumentError, OffsetOutOfRangeError

__all__ = [
    "I64_MAX",
    "MAX_DURATION_MS",
    "MAX_DURATION_S",
    "MAX_MAP_ITEMS",
    "MAX_TAGS",
    "MAX_TAGS_BYTES",
    "MAX_TAG_KEY_BYTES",
    "MAX_TAG_VALUE_BYTES",
    "ZSTD_MAX_LEVEL",
    "ZSTD_MIN_LEVEL",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_instance",
    "check_int",
    "check_node_id",
    "check_number",
    "check_options",
    "check_positive",
    "check_read_args",
    "check_scheme",
    "check_seconds",
    "check_str_map",
    "check_tags",
    "check_target",
    "check_text",
    "check_timeout",
    "check_zstd_level",
    "is_node_id",
]

T = TypeVar("T")

#: Largest value any int argument may take unless it says otherwise: every count, size and
#: offset is stored or computed as a signed 64-bit integer somewhere.
I64_MAX = (1 << 63) - 1
#: Longest wait the platform's locks and conditions accept (larger ones raise OverflowError
#: inside a wait, possibly on a background thread): the bound of every timeout and interval.
MAX_DURATION_S = float(threading.TIMEOUT_MAX)
MAX_DURATION_MS = int(MAX_DURATION_S * 1000)
#: zstd levels libzstd accepts: ``ZSTD_minCLevel()`` (negative levels are its "fast" modes,
#: 0 its default, 3) up to ``ZSTD_maxCLevel()``; 23 and above make the compressor raise.
ZSTD_MIN_LEVEL = -(1 << 17)
ZSTD_MAX_LEVEL: int = zstandard.MAX_COMPRESSION_LEVEL
#: Most items any mapping of str to str is read for (`check_str_map`): a mapping whose
#: ``items()`` never ends (or whose ``len()`` lies) is refused, not read forever.
MAX_MAP_ITEMS = 65536
# Limits on a new stream's tags (`check_tags`). A stream's tags are written in its create
# entry and again in every metadata checkpoint, and are held in memory (and decoded on every
# replay) by every client and reader for as long as the stream lives, so one careless tag would
# tax every later read of the log. The bounds leave room for any real use: labels, a schema id
# or URL, a small JSON config; a payload belongs in the stream's data, not its tags.
#: Most tags one stream may have: a per-tag cost (a dict entry, two encoded strings) that the
#: byte limits alone would not bound (a thousand tags of a few bytes each).
MAX_TAGS = 1000
#: Longest tag key, in UTF-8 bytes: as S3's limit on an object key.
MAX_TAG_KEY_BYTES = 1024
#: Longest tag value, in UTF-8 bytes (64 KiB): room for a schema or a small config document.
MAX_TAG_VALUE_BYTES = 64 * 1024
#: Most UTF-8 bytes of all of one stream's tag keys and values together (256 KiB, as the
#: Kubernetes bound on an object's annotations): what the other limits would allow at most
#: (1,000 x 65 KiB) would make one stream's tags 65 MiB; the encoded entry adds only a few
#: bytes of framing per tag.
MAX_TAGS_BYTES = 256 * 1024

# Node ids become path segments of object keys and WAL names. fullmatch, not match with
# ``$``: ``$`` also matches before a trailing newline, which would let "n1\n" through.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# URL schemes a registry accepts (RFC 3986's syntax, lower case: lookups are by lower case).
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


# Reprs for messages are cut short: an argument may be megabytes (a payload, a long string).
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def _show(value: object) -> str:
    """`value` for an error message: its repr, cut short."""
    return _REPR.repr(value)


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int = I64_MAX) -> int:
    """`value` if it is an int (exactly: not a bool, nor numpy's integers) in
    ``[minimum, maximum]``.

    Only a plain int is taken, since callers keep the value they passed (offsets, counts,
    epochs end up in arithmetic and in encoders that take plain ints only); an integer of
    another type (``numpy.int64`` out of an array or a data frame) is refused with a hint to
    convert it."""
    if type(value) is not int or value < minimum:
        bound = f">= {minimum}" if maximum == I64_MAX else f"in [{minimum}, {maximum}]"
        hint = ""
        if (
            type(value) is not int
            and not isinstance(value, bool)
            and isinstance(value, SupportsIndex)
        ):
            hint = f" (an integer of type {type(value).__name__}: pass int(...) of it)"
        raise InvalidArgumentError(f"{name} must be an int {bound}, got {_show(value)}{hint}")
    if value > maximum:
        # Said as such: "must be >= 0" for 10**30 would send the caller looking for a sign.
        raise InvalidArgumentError(
            f"{name} is too large: it must be an int <= {maximum}, got {_show(value)}"
        )
    return value


def check_bool(name: str, value: object) -> bool:
    """`value` if it is a bool (not 0/1, not None)."""
    if type(value) is not bool:
        raise InvalidArgumentError(f"{name} must be a bool, got {_show(value)}")
    return value


def check_number(
    name: str, value: object, *, minimum: float = 0.0, maximum: float = math.inf
) -> float:
    """A finite number (an int or a float, not a bool) in ``[minimum, maximum]``, as a float.

    NaN is refused: it compares false with every bound, so it would pass a plain ``< 0``
    test and then poison whatever arithmetic uses it (a rate, a probability).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {_show(value)}")
    number = _as_float(value)
    if not (math.isfinite(number) and minimum <= number <= maximum):
        bound = f">= {minimum:g}" if maximum == math.inf else f"in [{minimum:g}, {maximum:g}]"
        raise InvalidArgumentError(f"{name} must be a finite number {bound}, got {_show(value)}")
    return number


def _as_float(value: int | float) -> float:
    """`value` as a float; an int too large for one is infinite (refused as such), not an
    `OverflowError` traceback."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_positive(name: str, value: object) -> float:
    """A finite number > 0 (an int or a float, not a bool) as a float: a timeout or an
    interval that must not be zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {_show(value)}")
    number = _as_float(value)
    if not (math.isfinite(number) and number > 0):
        # One message for 0, -1 and NaN alike (it said ">= 0" for -1, then refused 0).
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {_show(value)}")
    return number


def check_seconds(name: str, value: object) -> float:
    """A finite number of seconds >= 0 (an int or a float, not a bool) as a float.

    NaN and infinity are refused: NaN compares false with every deadline (a wait that never
    ends or never starts), and an infinite or huge wait overflows the platform's timers.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds, got {_show(value)}")
    seconds = _as_float(value)
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_S):
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds in [0, {MAX_DURATION_S:.0f}], "
            f"got {_show(value)}"
        )
    return seconds


#: The shortest wait of a loop that waits between looks (a tail's long poll, a reader's poll).
MIN_POLL_S = 0.001


def check_poll(name: str, value: object) -> float:
    """`check_seconds`, at least `MIN_POLL_S`: the wait of a loop that looks again after it
    (a shorter one, 0 or ``1e-9``, makes it spin: a core busy and, on a store, a request
    each time)."""
    seconds = check_seconds(name, value)
    if seconds < MIN_POLL_S:
        raise InvalidArgumentError(
            f"{name} must be at least {MIN_POLL_S} s (a shorter wait makes a loop that spins), "
            f"got {_show(value)}"
        )
    return seconds


def check_timeout(name: str, value: object) -> float | None:
    """None (the call's default deadline) or `check_seconds`."""
    return None if value is None else check_seconds(name, value)


def _text_and_size(
    name: str, value: object, max_bytes: int | None, allow_empty: bool, key: str | None = None
) -> tuple[str, int]:
    """`check_text`, also giving the text's UTF-8 size (for limits on a sum of texts). With
    `key`, `value` is the value of that key in the map `name`: the name ``name[key]`` is only
    made for an error, as maps are checked on the append path (batch properties)."""
    if type(value) is not str:
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{_label(name, key)} must be a str, got {_show(value)}")
        # A str subclass is copied into an exact str before anything else touches it:
        # ``str.__str__`` copies the characters without calling any override (``__str__``,
        # ``encode``, ``__len__``, ``__eq__``, ``__hash__``), and what is stored is then a
        # plain str. A subclass instance kept in metadata structs, which are not tracked by the
        # garbage collector, could keep a reference cycle (through its ``__dict__``) alive
        # forever, and its overrides could make it compare or hash differently from the text
        # stored in the log.
        value = str.__str__(value)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{_label(name, key)} must be encodable as UTF-8 (no lone surrogates), "
            f"got {_show(value)}"
        ) from exc
    if not allow_empty and not value:
        raise InvalidArgumentError(f"{_label(name, key)} must be a non-empty str")
    if max_bytes is not None and size > max_bytes:
        raise InvalidArgumentError(
            f"{_label(name, key)} must be at most {max_bytes} UTF-8 bytes, got {size}: "
            f"{_show(value)}"
        )
    return value, size


def _label(name: str, key: str | None) -> str:
    return name if key is None else f"{name}[{_show(key)}]"


def check_text(
    name: str, value: object, *, max_bytes: int | None = None, allow_empty: bool = True
) -> str:
    """`value` as an exact str (a copy if it is an instance of a str subclass) if it is a str
    encodable as UTF-8, non-empty unless `allow_empty`, and at most `max_bytes` bytes once
    encoded."""
    return _text_and_size(name, value, max_bytes, allow_empty)[0]


def check_str_map(
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    max_items: int = MAX_MAP_ITEMS,
    max_key_bytes: int | None = None,
    max_value_bytes: int | None = None,
    max_total_bytes: int | None = None,
) -> dict[str, str]:
    """A copy of `value`, a mapping of str to str (all UTF-8 encodable), as a plain dict of
    exact str (see `check_text`); None gives ``{}`` when `allow_none`.

    Limits: at most `max_items` items (`MAX_MAP_ITEMS` unless given: a mapping that never
    stops yielding is refused rather than read forever), each key at most `max_key_bytes` and each
    value at most `max_value_bytes` UTF-8 bytes, and keys and values together at most
    `max_total_bytes`. Items are checked as they are iterated, so a huge mapping is refused
    after looking at no more than the limits allow.
    """
    if value is None and allow_none:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a mapping of str to str, got {_show(value)}")
    out: dict[str, str] = {}
    total = 0
    key_name = f"{name} key"
    for count, item in enumerate(_items(name, value), 1):
        if count > max_items:
            raise InvalidArgumentError(
                f"{name} must have at most {max_items} items, got more than {max_items}"
            )
        if type(item) is not tuple or len(item) != 2:
            raise InvalidArgumentError(
                f"{name} must be a mapping of str to str, but its items() gave {_show(item)}"
            )
        k, v = item
        key, key_size = _text_and_size(key_name, k, max_key_bytes, True)
        if key in out:
            # Only keys of a str subclass whose __eq__/__hash__ set apart equal text get here:
            # one would silently replace the other.
            raise InvalidArgumentError(f"{name} has the key {_show(key)} more than once")
        text, value_size = _text_and_size(name, v, max_value_bytes, True, key)
        out[key] = text
        total += key_size + value_size
        if max_total_bytes is not None and total > max_total_bytes:
            raise InvalidArgumentError(
                f"{name} must total at most {max_total_bytes} UTF-8 bytes of keys and values, "
                f"got more than {max_total_bytes} (at key {_show(key)})"
            )
    return out


def _items(name: str, value: Mapping[Any, Any]) -> Iterator[object]:
    """The items of a caller's mapping; whatever its own code raises while they are read (a
    broken ``items()``, a ``__getitem__`` refusing a key its ``__iter__`` gave) is refused as
    bad input, with the mapping's error as the cause."""
    try:
        it = iter(value.items())
    except Exception as exc:
        raise InvalidArgumentError(f"{name}: its items() failed: {exc!r}") from exc
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise InvalidArgumentError(f"{name}: reading its items failed: {exc!r}") from exc
        yield item


def check_tags(name: str, value: object) -> dict[str, str]:
    """A new stream's tags (`check_str_map`, None for none) within the limits `MAX_TAGS`,
    `MAX_TAG_KEY_BYTES`, `MAX_TAG_VALUE_BYTES` and `MAX_TAGS_BYTES`."""
    return check_str_map(
        name,
        value,
        allow_none=True,
        max_items=MAX_TAGS,
        max_key_bytes=MAX_TAG_KEY_BYTES,
        max_value_bytes=MAX_TAG_VALUE_BYTES,
        max_total_bytes=MAX_TAGS_BYTES,
    )


def check_options(name: str, value: object) -> dict[str, Any]:
    """A copy of `value`, a mapping with str keys (values are the backend's to judge), or
    ``{}`` for None."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(f"{name} must be a mapping with str keys, got {_show(value)}")
    return dict(value)


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """`value` if it is one of `choices` (strings)."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {sorted(choices)}, got {_show(value)}")
    return value


def check_instance(name: str, value: T, cls: type, *, allow_none: bool = False) -> T:
    """`value` if it is an instance of `cls` (which may be abstract), or None if `allow_none`;
    typed as given, since callers check values their signature already declares."""
    if allow_none and value is None:
        return value
    if not isinstance(value, cls):
        raise InvalidArgumentError(f"{name} must be a {cls.__name__}, not {type(value).__name__}")
    return value


def check_callable(name: str, value: object) -> Callable[..., Any]:
    """`value` if it is callable."""
    if not callable(value):
        raise InvalidArgumentError(f"{name} must be callable, got {_show(value)}")
    return value


def check_zstd_level(name: str, value: object) -> int:
    """`value` if libzstd accepts it as a compression level (see `ZSTD_MIN_LEVEL`)."""
    return check_int(name, value, minimum=ZSTD_MIN_LEVEL, maximum=ZSTD_MAX_LEVEL)


def is_node_id(value: object) -> TypeGuard[str]:
    """Whether `value` is a valid node id (see `check_node_id`)."""
    return isinstance(value, str) and _NODE_ID.fullmatch(value) is not None


def check_node_id(value: object, name: str = "node_id") -> str:
    """`value` if it is a node id: letters, digits and ``._-``, not starting with one of
    ``._-``, at most 64 characters (it becomes part of object keys and file names)."""
    if not is_node_id(value):
        raise InvalidArgumentError(
            f"{name} must be 1 to 64 letters, digits or '._-' (starting with a letter or "
            f"digit), got {_show(value)}"
        )
    return value


def check_scheme(value: object, name: str = "scheme") -> str:
    """`value` if it is a URL scheme as registries key them: a lower-case letter, then
    lower-case letters, digits, ``+``, ``.`` or ``-`` (``s3``, ``object+file``)."""
    if not isinstance(value, str) or _SCHEME.fullmatch(value) is None:
        raise InvalidArgumentError(
            f"{name} must be lower-case letters, digits, '+', '.' or '-' (starting with a "
            f"letter), got {_show(value)}"
        )
    return value


def check_target(value: object, name: str = "target") -> object:
    """`value` if it can stand for a factory: a callable, or its import path
    ``"package.module:attribute"`` (imported when first used)."""
    if not (callable(value) or (isinstance(value, str) and ":" in value)):
        raise InvalidArgumentError(
            f"{name} must be a callable or 'module:attribute', got {_show(value)}"
        )
    return value


def check_read_args(
    start_offset: object, end_offset: object, max_bytes: object
) -> tuple[int, int | None, int]:
    """The arguments of a read (`Stream.fetch`, `Stream.read_records`, `StreamClient.read`),
    checked: offsets ints >= 0, `end_offset` None or not below `start_offset`, `max_bytes`
    an int >= 1."""
    start = check_int("start_offset", start_offset)
    end = None if end_offset is None else check_int("end_offset", end_offset)
    if end is not None and end < start:
        raise InvalidArgumentError(f"end_offset {end} is below start_offset {start}")
    return start, end, check_int("max_bytes", max_bytes, minimum=1)


def check_offset_in_range(stream_id: int, start: int, first: int, last: int) -> None:
    """The one rule for where a read may begin: at an offset of ``[first, last]`` (`last`,
    the end, reads nothing); raises `OffsetOutOfRangeError` otherwise (trimmed away, or not
    written yet)."""
    if not first <= start <= last:
        raise OffsetOutOfRangeError(
            f"offset {start} is outside [{first}, {last}] of stream {stream_id}"
        )
