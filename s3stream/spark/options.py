"""Reader options: parse the string options Spark passes into one validated, picklable value.

Names follow Spark's Kafka source where they apply. Spark lower-cases option keys, so lookups
here are by lower-case name; messages use the documented spelling. Every bad value raises
`InvalidArgumentError` naming the option. Numbers, sizes and bools follow the rules of every
other s3stream setting (`s3stream.settings_parse`): ``maxPartitionBytes`` takes ``128MiB``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError
from ..metadata.registry import check_metadata_url
from ..objectstore.registry import storage_option_from_text
from ..settings_parse import parse_bool, parse_int, parse_size
from ..units import MiB
from ..validation import check_int

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "SourceOptions",
    "StreamSelection",
    "include_headers",
    "parse_options",
]

#: Offset value meaning "the stream's start offset" in offsets JSON (as in Kafka).
EARLIEST = -2
#: Offset value meaning "the stream's end offset" in offsets JSON (as in Kafka).
LATEST = -1

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


# Documented spelling of every option, by the lower-case key Spark hands over.
_KNOWN = {
    name.lower(): name
    for name in (
        "path",
        "storageOptions",
        "metadataPrefix",
        "metadata",
        "streamIds",
        "subscribe",
        "subscribePattern",
        "assign",
        "tags",
        "topicTag",
        "partitionTag",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "minPartitions",
        "maxPartitionBytes",
        "failOnDataLoss",
        "includeHeaders",
        "maxOffsetsPerTrigger",
        "useArrow",
        "arrowBatchRows",
        "fetchConcurrency",
    )
}
_STORAGE_PREFIX = "storage."


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where reading starts or ends: ``"earliest"``, ``"latest"`` or per-stream offsets.

    `per_stream` maps stream ids to an offset (or `EARLIEST` / `LATEST`); `per_topic` maps
    Kafka-style ``topic -> partition -> offset`` and is resolved through the stream tags.
    Streams named by neither take `default` ("earliest" or "latest").
    """

    option: str
    default: str
    per_stream: Mapping[int, int] = field(default_factory=dict)
    per_topic: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    @property
    def is_json(self) -> bool:
        """Whether offsets were given per stream or per topic/partition."""
        return bool(self.per_stream or self.per_topic)


@dataclass(frozen=True, slots=True)
class StreamSelection:
    """Which streams to read. Empty fields select nothing by that criterion; all empty: all."""

    stream_ids: tuple[int, ...] = ()
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the reader needs, validated. Small and picklable (sent to executors)."""

    url: str
    storage_options: Mapping[str, Any]
    metadata_prefix: str
    selection: StreamSelection
    topic_tag: str
    partition_tag: str
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    min_partitions: int | None
    max_partition_bytes: int
    fail_on_data_loss: bool
    include_headers: bool
    max_offsets_per_trigger: int | None
    use_arrow: bool
    arrow_batch_rows: int
    fetch_concurrency: int
    #: ``endingTimestamp`` (batch reads): each stream ends at its first offset at or after it.
    ending_timestamp: int | None = None
    #: ``metadata``: where the metadata log lives if not in the store (``postgresql://...``).
    metadata: str | None = None


def _bad(option: str, value: object, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"option {option}: {why} (got {value!r})")


def _int(
    opts: Mapping[str, str], name: str, default: int | None, minimum: int, *, size: bool = False
) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    parse = parse_size if size else parse_int
    value = parse(str(raw), name=f"option {name}")
    if value < minimum:
        raise _bad(name, raw, f"must be >= {minimum}")
    return value


def _timestamp(opts: Mapping[str, str], name: str) -> int | None:
    """A time option: milliseconds since the epoch, any i64 (before 1970 is negative)."""
    value = _int(opts, name, None, minimum=_I64_MIN)
    if value is not None and value > _I64_MAX:
        raise _bad(name, opts.get(name.lower()), f"must be <= {_I64_MAX} (ms since the epoch)")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    return parse_bool(str(raw), name=f"option {name}")


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys)
    except ValueError as exc:
        raise _bad(name, raw, f"is not valid JSON ({exc})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (`json` keeps the last without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _offset_value(name: str, where: str, value: object) -> int:
    if type(value) is not int or value < EARLIEST:
        raise InvalidArgumentError(
            f"option {name}: offset of {where} must be an int >= 0, or -2 (earliest) or "
            f"-1 (latest), got {value!r}"
        )
    return value


def _stream_id(name: str, text: object) -> int:
    try:
        sid = int(str(text).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name}: {text!r} is not a stream id") from None
    if sid < 0:
        raise InvalidArgumentError(f"option {name}: stream id {sid} is negative")
    return check_int(f"option {name}: stream id", sid)


def _offsets(
    opts: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]
) -> OffsetSpec:
    raw = opts.get(name.lower())
    if raw is None:
        return OffsetSpec(name, default)
    text = str(raw).strip()
    if text.lower() in allowed:
        return OffsetSpec(name, text.lower())
    if text.lower() in ("earliest", "latest"):
        raise _bad(name, raw, f"must be one of {', '.join(allowed)} or JSON")
    if not text.startswith("{"):
        # A word, not JSON: most likely a misspelt one of the allowed words.
        close = difflib.get_close_matches(text.lower(), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _bad(
            name, raw, f'must be one of {", ".join(allowed)}{hint} or JSON such as {{"0": 42}}'
        )
    data = _json(name, text)
    if not isinstance(data, dict) or not data:
        raise _bad(name, raw, 'must be a non-empty JSON object such as {"0": 42}')
    per_stream: dict[int, int] = {}
    per_topic: dict[str, dict[int, int]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            parts: dict[int, int] = {}
            for pkey, pvalue in value.items():
                try:
                    part = int(pkey)
                except ValueError:
                    raise InvalidArgumentError(
                        f"option {name}: partition {pkey!r} of topic {key!r} is not an int"
                    ) from None
                parts[part] = _offset_value(name, f"topic {key!r} partition {part}", pvalue)
            per_topic[key] = parts
        else:
            sid = _stream_id(name, key)
            if sid in per_stream:
                # "0" and " 0" are one stream: the last would win without a word.
                raise _bad(name, raw, f"names stream {sid} twice")
            per_stream[sid] = _offset_value(name, f"stream {sid}", value)
    if per_stream and per_topic:
        raise _bad(name, raw, "mixes stream ids and topics; use one form")
    return OffsetSpec(name, default, per_stream, per_topic)


def _selection(opts: Mapping[str, str]) -> StreamSelection:
    given = [
        n for n in ("streamIds", "subscribe", "subscribePattern", "assign") if n.lower() in opts
    ]
    if len(given) > 1:
        raise InvalidArgumentError(
            f"options {' and '.join(given)} conflict: give at most one of streamIds, "
            "subscribe, subscribePattern, assign"
        )
    ids: tuple[int, ...] = ()
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] = {}
    tags: dict[str, str] = {}
    raw = opts.get("streamids")
    if raw is not None:
        text = str(raw).strip()
        items = _json("streamIds", text) if text.startswith("[") else text.split(",")
        if not isinstance(items, list) or not items:
            raise _bad("streamIds", raw, "must list stream ids, e.g. 0,3,7")
        ids = tuple(sorted({_stream_id("streamIds", item) for item in items}))
    raw = opts.get("subscribe")
    if raw is not None:
        topics = tuple(t.strip() for t in str(raw).split(",") if t.strip())
        if not topics:
            raise _bad("subscribe", raw, "must list topics, e.g. orders,payments")
    raw = opts.get("subscribepattern")
    if raw is not None:
        try:
            re.compile(str(raw))
        except re.error as exc:
            raise _bad(
                "subscribePattern", raw, f"is not a valid regular expression ({exc})"
            ) from None
        pattern = str(raw)
    raw = opts.get("assign")
    if raw is not None:
        data = _json("assign", str(raw))
        if not isinstance(data, dict) or not data:
            raise _bad("assign", raw, 'must be a JSON object such as {"orders": [0, 1]}')
        for topic, parts in data.items():
            if not isinstance(parts, list) or not all(type(p) is int for p in parts):
                raise _bad("assign", raw, f"partitions of {topic!r} must be a list of ints")
            assign[topic] = tuple(sorted(set(parts)))
    raw = opts.get("tags")
    if raw is not None:
        data = _json("tags", str(raw))
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise _bad("tags", raw, 'must be a JSON object of strings such as {"env": "prod"}')
        tags = dict(data)
    return StreamSelection(ids, topics, pattern, assign, tags)


def _storage_options(opts: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    raw = opts.get("storageoptions")
    if raw is not None:
        data = _json("storageOptions", str(raw))
        if not isinstance(data, dict):
            raise _bad("storageOptions", raw, "must be a JSON object")
        out.update(data)
    for key, value in opts.items():
        if key.startswith(_STORAGE_PREFIX):
            if len(key) == len(_STORAGE_PREFIX):
                raise _bad(key, value, "names no storage option (storage.<name>=<value>)")
            # Spark hands every option over as text ("2.5"): typed as the CLI's -o values.
            name = key[len(_STORAGE_PREFIX) :]
            out[name] = storage_option_from_text(name, value) if isinstance(value, str) else value
    return out


def _metadata_url(opts: Mapping[str, str]) -> str | None:
    """The ``metadata`` option: a metadata-store URL, or None (the log is in the store)."""
    raw = opts.get("metadata")
    if raw is None or not str(raw).strip():
        return None
    try:
        return check_metadata_url(str(raw).strip())
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"option metadata: {exc}") from None


def include_headers(options: Mapping[str, str]) -> bool:
    """Just the ``includeHeaders`` option (the schema depends on it and nothing else)."""
    return _bool({str(k).lower(): v for k, v in options.items()}, "includeHeaders", False)


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate Spark's reader `options` (keys in any case) into `SourceOptions`.

    `streaming` selects the defaults that differ (``startingOffsets`` is "earliest" for
    batch reads and "latest" for streams, as in Kafka) and the options that are allowed.
    """
    opts = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith(_STORAGE_PREFIX))
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN.values()))} "
            f"and {_STORAGE_PREFIX}<name> for storage options"
        )
    url = opts.get("path")
    if not url or not str(url).strip():
        raise InvalidArgumentError(
            'option path: give the store URL, e.g. spark.read.format("s3stream").load("s3://bucket/prefix")'
        )
    if streaming and "endingoffsets" in opts:
        raise InvalidArgumentError("option endingOffsets is not supported by streaming queries")
    if not streaming and "maxoffsetspertrigger" in opts:
        raise InvalidArgumentError("option maxOffsetsPerTrigger applies to streaming queries only")
    if streaming and "endingtimestamp" in opts:
        raise InvalidArgumentError("option endingTimestamp is not supported by streaming queries")
    starting_ts = _timestamp(opts, "startingTimestamp")
    if starting_ts is not None and "startingoffsets" in opts:
        raise InvalidArgumentError(
            "options startingOffsets and startingTimestamp conflict: give one"
        )
    ending_ts = _timestamp(opts, "endingTimestamp")
    if ending_ts is not None and "endingoffsets" in opts:
        raise InvalidArgumentError("options endingOffsets and endingTimestamp conflict: give one")
    if starting_ts is not None and ending_ts is not None and ending_ts < starting_ts:
        raise InvalidArgumentError(
            f"option endingTimestamp: {ending_ts} is below startingTimestamp {starting_ts}"
        )
    prefix = str(opts.get("metadataprefix", "meta")).strip()
    if not prefix or prefix.startswith("/") or prefix.endswith("/"):
        raise _bad("metadataPrefix", prefix, "must be a key prefix without leading or trailing /")
    metadata = _metadata_url(opts)
    topic_tag = str(opts.get("topictag", "topic"))
    partition_tag = str(opts.get("partitiontag", "partition"))
    for name, value in (("topicTag", topic_tag), ("partitionTag", partition_tag)):
        if not value:
            raise _bad(name, value, "must be a non-empty tag name")
    return SourceOptions(
        url=str(url).strip(),
        storage_options=_storage_options(opts),
        metadata_prefix=prefix,
        metadata=metadata,
        selection=_selection(opts),
        topic_tag=topic_tag,
        partition_tag=partition_tag,
        starting=_offsets(
            opts,
            "startingOffsets",
            "latest" if streaming else "earliest",
            ("earliest", "latest"),
        ),
        ending=_offsets(opts, "endingOffsets", "latest", ("latest",)),
        starting_timestamp=starting_ts,
        ending_timestamp=ending_ts,
        min_partitions=_int(opts, "minPartitions", None, minimum=1),
        max_partition_bytes=_int(opts, "maxPartitionBytes", 128 * MiB, minimum=1, size=True)
        or 128 * MiB,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, minimum=1),
        use_arrow=_bool(opts, "useArrow", True),
        arrow_batch_rows=_int(opts, "arrowBatchRows", 65536, minimum=1) or 65536,
        fetch_concurrency=_int(opts, "fetchConcurrency", 4, minimum=1) or 4,
    )
