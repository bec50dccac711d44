"""Settings from text: the one parser of settings mappings, WAL URL queries and ``S3STREAM_*``
environment variables (docs/configuration.md).

A setting has one name everywhere: its field name in the settings class, dotted for the
sections of `ClientSettings` (``upload_threshold_bytes``, ``compaction.interval_ms``,
``file_wal.capacity_bytes``). A WAL URL's query configures that WAL alone, so it uses the names
inside its section (``?capacity_bytes=1GiB``); an environment variable is ``S3STREAM_`` and the
name in upper case with ``__`` for the dot (``S3STREAM_COMPACTION__INTERVAL_MS``).

Text values follow one rule per kind of field, chosen by its type and the unit in its name:

- sizes (``*_bytes``, ``*bytes_per_s``): a whole number of bytes, optionally with a
  1024-based unit ``KiB``, ``MiB``, ``GiB`` or ``TiB`` (any case): ``65536``, ``64KiB``.
  ``k``, ``KB``, ``M``, ``MB``, ``G``, ``GB``... are refused as ambiguous (1000 or 1024?);
- durations (``*_ms``): a whole number of milliseconds, optionally with a unit ``ms``, ``s``,
  ``min`` or ``h``: ``30000``, ``30s``, ``5min``. ``1k`` is refused;
- other ints (counts, levels): a whole number, optionally signed: ``4``, ``-5``;
- bools: ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` (any case);
- strs: the text as it is (the settings class checks it).

Values that are not text (from a mapping) are taken as they are, and every result is checked
by the settings class itself, so the same `InvalidArgumentError` guards every source. Every
error names the setting and where it came from. An unknown name is an error in a mapping and a
query; in the environment, whose ``S3STREAM_`` namespace the CLI and the test kit share, an
unknown name close to a setting's is an error (a typo) and any other is logged and skipped.

Nothing here reads the environment on its own: callers pass the mapping (`s3stream.open` reads
``os.environ`` when called, unless given ``environ=``).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import re
import types
import typing
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from .errors import InvalidArgumentError
from .settings import ClientSettings, CompactionSettings, FileWalSettings, ObjectWalSettings
from .units import SIZE_UNITS

__all__ = [
    "ENV_PREFIX",
    "env_var",
    "parse_bool",
    "parse_duration_ms",
    "parse_int",
    "parse_size",
    "setting_names",
    "settings_from_environ",
    "settings_from_mapping",
    "settings_from_query",
]

S = TypeVar("S")

_log = logging.getLogger(__name__)

#: Prefix of the environment variables that hold settings.
ENV_PREFIX = "S3STREAM_"
#: Variables of the ``S3STREAM_`` namespace that are not settings (the CLI's and the test
#: kit's): never reported.
_ENV_NOT_SETTINGS = frozenset(
    {
        "S3STREAM_URL",
        "S3STREAM_METADATA",
        "S3STREAM_ENDPOINT_URL",
        "S3STREAM_REGION",
        "S3STREAM_HYPOTHESIS_PROFILE",
    }
)

#: What each settings class is called in messages.
_LABELS: dict[type, str] = {
    ClientSettings: "client",
    CompactionSettings: "compaction",
    FileWalSettings: "file WAL",
    ObjectWalSettings: "object WAL",
}
#: Older spellings still accepted, by class: the short names of the first WAL URL queries,
#: and the compactor's `stream_split_bytes` (now `stream_set_split_bytes`: the name meant
#: something else in `ClientSettings`).
_ALIASES: dict[type, dict[str, str]] = {
    FileWalSettings: {
        "capacity": "capacity_bytes",
        "direct": "direct_io",
        "max_group": "max_group_bytes",
        "recovery_window": "recovery_window_bytes",
    },
    ObjectWalSettings: {
        "batch_interval_ms": "wal_batch_interval_ms",
        "batch_max_bytes": "wal_batch_max_bytes",
    },
    CompactionSettings: {"stream_split_bytes": "stream_set_split_bytes"},
}
#: Aliases that warn: the meaning of the old name was ambiguous.
_DEPRECATED = frozenset({(CompactionSettings, "stream_split_bytes")})

# Bounded digit runs: int() of thousands of digits is slow (and refused past 4300).
# re.ASCII: `\d` would also take other scripts' digits ("١٢"), which the grammar does not.
_SIZE = re.compile(r"\s*(\d{1,30})\s*([A-Za-z]*)\s*", re.ASCII)
_DURATION = re.compile(r"\s*(\d{1,30})\s*([A-Za-z]*)\s*", re.ASCII)
_INT = re.compile(r"\s*([+-]?\d{1,30})\s*", re.ASCII)
_SI_UNITS = frozenset({"k", "kb", "m", "mb", "g", "gb", "t", "tb"})
_DURATION_UNITS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


# ------------------------------------------------------------------------------ values


def parse_size(text: str, *, name: str = "size") -> int:
    """Bytes in `text`: a whole number, optionally with a unit KiB, MiB, GiB or TiB (1024-based,
    any case): ``"65536"``, ``"64KiB"``, ``"2GiB"``. Decimal-looking units (``k``, ``MB``,
    ``G``) are refused: whether they mean 1000 or 1024 is exactly the doubt this rule removes."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        digits, unit = match.groups()
        if not unit:
            return int(digits)
        for suffix, factor in SIZE_UNITS.items():
            if unit.lower() == suffix.lower():
                return int(digits) * factor
        if unit.lower() in _SI_UNITS:
            meant = unit[0].upper() + "iB"
            raise InvalidArgumentError(
                f"{name}: {text!r} is ambiguous (1000- or 1024-based?); write {digits}{meant} "
                f"({digits} x {SIZE_UNITS[meant]} bytes) or a number of bytes"
            )
    raise InvalidArgumentError(
        f"{name} must be a size: a whole number of bytes, optionally with a unit KiB, MiB, GiB "
        f"or TiB (1024-based), e.g. 65536 or 64KiB; got {text!r}"
    )


def parse_duration_ms(text: str, *, name: str = "duration") -> int:
    """Milliseconds in `text`: a whole number, optionally with a unit ms, s, min or h:
    ``"30000"``, ``"30s"``, ``"5min"``. No fractions (``"1.5s"``: write ``"1500ms"``)."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        digits, unit = match.groups()
        factor = _DURATION_UNITS.get(unit.lower(), 0) if unit else 1
        if factor:
            return int(digits) * factor
    raise InvalidArgumentError(
        f"{name} must be a duration: a whole number of milliseconds, optionally with a unit ms, "
        f"s, min or h, e.g. 30000, 30s or 5min; got {text!r}"
    )


def parse_int(text: str, *, name: str = "value") -> int:
    """The whole number in `text`, optionally signed (no units, no ``1_000``, no ``1e3``)."""
    match = _INT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgumentError(f"{name} must be a whole number, e.g. 4; got {text!r}")
    return int(match.group(1))


def parse_bool(text: str, *, name: str = "value") -> bool:
    """`text` as a bool: true/false, 1/0, yes/no, on/off (any case)."""
    lowered = text.strip().lower() if isinstance(text, str) else None
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidArgumentError(
        f"{name} must be true or false (or 1/0, yes/no, on/off); got {text!r}"
    )


# ------------------------------------------------------------------------------ fields


class _Kind(enum.Enum):
    SIZE = "size"
    DURATION = "duration"
    INT = "int"
    BOOL = "bool"
    STR = "str"
    SECTION = "section"


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kind: _Kind
    #: The settings class of a section.
    section: type | None = None


def _fields(cls: type) -> dict[str, _Field]:
    """The settings of `cls` by name, with the rule their text follows (from the annotation,
    and the unit in the name for ints)."""
    if cls not in _LABELS:
        raise InvalidArgumentError(f"{cls!r} is not a settings class")
    hints = typing.get_type_hints(cls)
    out: dict[str, _Field] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType):  # ``FileWalSettings | None``
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if hint in _LABELS:
            out[f.name] = _Field(f.name, _Kind.SECTION, hint)
        elif hint is bool:
            out[f.name] = _Field(f.name, _Kind.BOOL)
        elif hint is str:
            out[f.name] = _Field(f.name, _Kind.STR)
        elif hint is int and f.name.endswith("_ms"):
            out[f.name] = _Field(f.name, _Kind.DURATION)
        elif hint is int and f.name.endswith(("_bytes", "bytes_per_s")):
            out[f.name] = _Field(f.name, _Kind.SIZE)
        elif hint is int:
            out[f.name] = _Field(f.name, _Kind.INT)
        else:  # a new kind of field needs a rule here
            raise TypeError(f"{cls.__name__}.{f.name}: no text rule for {hint!r}")
    return out


def setting_names(cls: type) -> list[str]:
    """Every setting name of `cls`, sections dotted (``compaction.interval_ms``), sorted."""
    names: list[str] = []
    for f in _fields(cls).values():
        if f.section is not None:
            names.extend(f"{f.name}.{sub}" for sub in setting_names(f.section))
        else:
            names.append(f.name)
    return sorted(names)


def env_var(name: str) -> str:
    """The environment variable of setting `name`: ``compaction.interval_ms`` ->
    ``S3STREAM_COMPACTION__INTERVAL_MS``."""
    return ENV_PREFIX + name.replace(".", "__").upper()


def _parse_value(field: _Field, value: object, what: str) -> object:
    """`value` for `field`: text by the field's rule, anything else as it is (the settings
    class checks it)."""
    if not isinstance(value, str):
        return value
    if field.kind is _Kind.SIZE:
        return parse_size(value, name=what)
    if field.kind is _Kind.DURATION:
        return parse_duration_ms(value, name=what)
    if field.kind is _Kind.INT:
        return parse_int(value, name=what)
    if field.kind is _Kind.BOOL:
        return parse_bool(value, name=what)
    return value


def _unknown(cls: type, path: str, name: str, source: str, *, aliases: bool) -> str:
    """The message for an unknown setting `name` of `cls` (`path`: its section's prefix)."""
    candidates = setting_names(cls) + (list(_ALIASES.get(cls, ())) if aliases else [])
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    hint = f" (did you mean {path + close[0]!r}?)" if close else ""
    known = [f.name + (".*" if f.section else "") for f in _fields(cls).values()]
    return (
        f"{source}: unknown {_LABELS[cls]} setting {path + name!r}{hint}; known: "
        f"{', '.join(path + n for n in sorted(known))}"
    )


# ------------------------------------------------------------------------------ sources


def _collect(
    cls: type,
    items: Iterable[tuple[str, object, str]],
    source: str,
    *,
    aliases: bool,
    prefix: str = "",
    into: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Changes to `cls` from ``(dotted name, value, what to call it)`` items, as a tree of
    dicts by field name (a section's changes under its name), added to `into`; `prefix`: the
    dotted path of `cls` in messages. A setting given twice (also once dotted and once in a
    nested mapping) is refused."""
    changes: dict[str, Any] = {} if into is None else into
    for name, value, what in items:
        target_cls, tree, path = cls, changes, prefix
        parts = name.split(".")
        for i, part in enumerate(parts):
            fields = _fields(target_cls)
            field = fields.get(part)
            if field is None and aliases and part in _ALIASES.get(target_cls, {}):
                if (target_cls, part) in _DEPRECATED:
                    warnings.warn(
                        f"setting {path + part!r} is deprecated: use "
                        f"{path + _ALIASES[target_cls][part]!r}",
                        DeprecationWarning,
                        stacklevel=3,
                    )
                field = fields[_ALIASES[target_cls][part]]
            if field is None:
                raise InvalidArgumentError(
                    _unknown(target_cls, path, part, source, aliases=aliases)
                )
            last = i == len(parts) - 1
            if field.section is not None and not last:
                sub = tree.setdefault(field.name, {})
                if not isinstance(sub, dict):
                    raise InvalidArgumentError(f"{source}: {path + field.name!r} given twice")
                target_cls, tree, path = field.section, sub, f"{path}{field.name}."
                continue
            if not last:
                raise InvalidArgumentError(
                    _unknown(target_cls, path, ".".join(parts[i:]), source, aliases=aliases)
                )
            if field.section is not None and isinstance(value, Mapping):
                sub = tree.setdefault(field.name, {})
                if not isinstance(sub, dict):
                    raise InvalidArgumentError(f"{source}: {path + field.name!r} given twice")
                nested = [(str(k), v, f"{what}[{k!r}]") for k, v in value.items()]
                _collect(
                    field.section,
                    nested,
                    source,
                    aliases=aliases,
                    prefix=f"{path}{field.name}.",
                    into=sub,
                )
                continue
            if field.name in tree:
                raise InvalidArgumentError(
                    f"{source}: setting {path + field.name!r} given twice (as {name!r})"
                )
            if field.section is not None:
                tree[field.name] = value  # a whole section object (the class checks it)
            else:
                tree[field.name] = _parse_value(field, value, what)
    return changes


def _apply(cls: type[S], base: S | None, changes: Mapping[str, Any], source: str) -> S:
    """`base` (default: ``cls()``) with `changes`, checked by the settings classes; their
    messages are prefixed with `source`."""
    if base is None:
        base = cls()
    elif not isinstance(base, cls):
        raise InvalidArgumentError(f"base must be a {cls.__name__}, not {type(base).__name__}")
    if not changes:
        return base
    fields = _fields(cls)
    values: dict[str, Any] = {}
    for name, change in changes.items():
        section = fields[name].section
        if section is not None and isinstance(change, dict):
            current = getattr(base, name)
            values[name] = _apply(section, current if current is not None else None, change, source)
        else:
            values[name] = change
    try:
        return dataclasses.replace(base, **values)  # type: ignore[type-var]
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{source}: {exc}") from exc


def settings_from_mapping(
    cls: type[S], values: Mapping[str, object], *, base: S | None = None, source: str = "settings"
) -> S:
    """`base` (default ``cls()``) with the settings `values` names: dotted names
    (``{"compaction.interval_ms": "5min"}``) or nested mappings (``{"compaction":
    {"interval_ms": 300000}}``); text values follow the module's rules, others are taken as
    they are. Unknown names are an `InvalidArgumentError` naming them."""
    if not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values):
        raise InvalidArgumentError(
            f"{source} must be a mapping of setting names to values, got {type(values).__name__}"
        )
    items = [(k, v, f"{source}[{k!r}]") for k, v in values.items()]
    return _apply(cls, base, _collect(cls, items, source, aliases=True), source)


def settings_from_query(
    cls: type[S], query: str, *, base: S | None = None, url: str | None = None
) -> S:
    """`base` (default ``cls()``) with the settings of a URL query (``capacity_bytes=1GiB&
    direct_io=1``); a name given twice, or unknown, is an `InvalidArgumentError` naming the
    URL (`url`, else the query)."""
    where = f"URL {url!r}" if url is not None else f"query {query!r}"
    items = [
        (k, v, f"{k} in {where}")
        for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=False)
    ]
    return _apply(cls, base, _collect(cls, items, where, aliases=True), where)


def settings_from_environ(cls: type[S], environ: Mapping[str, str], *, base: S | None = None) -> S:
    """`base` (default ``cls()``) with the settings of ``S3STREAM_*`` variables in `environ`
    (``S3STREAM_COMPACTION__INTERVAL_MS=5min``). A variable whose name is close to a
    setting's is a typo, `InvalidArgumentError`; other unknown ones are logged and skipped."""
    by_var = {env_var(n): n for n in setting_names(cls)}
    items: list[tuple[str, object, str]] = []
    for var in sorted(environ):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() in _ENV_NOT_SETTINGS:
            continue
        name = by_var.get(var.upper())
        if name is None:
            close = difflib.get_close_matches(var.upper(), list(by_var), n=1, cutoff=0.85)
            if close:
                raise InvalidArgumentError(
                    f"environment variable {var}: no such setting (did you mean {close[0]}, "
                    f"setting {by_var[close[0]]!r}?)"
                )
            _log.warning("environment variable %s names no s3stream setting: ignored", var)
            continue
        items.append((name, environ[var], f"{var} (setting {name!r})"))
    source = "environment (S3STREAM_*)"
    return _apply(cls, base, _collect(cls, items, source, aliases=False), source)
