"""A new stream's tags are bounded (`MAX_TAGS`, `MAX_TAG_KEY_BYTES`, `MAX_TAG_VALUE_BYTES`,
`MAX_TAGS_BYTES` in ``s3stream/validation.py``) and stored as plain str: at each limit a
create is accepted, one past it is refused with an `InvalidArgumentError` naming the tag or the
limit, and nothing is created. Real clients on a local directory."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import s3stream
import s3stream.aio as aio
from s3stream import InvalidArgumentError, RecordBatch, StreamClient
from s3stream.validation import (
    MAX_TAG_KEY_BYTES,
    MAX_TAG_VALUE_BYTES,
    MAX_TAGS,
    MAX_TAGS_BYTES,
    check_str_map,
)


def _open(tmp_path: Path) -> StreamClient:
    return s3stream.open(str(tmp_path / "store"), environ={})


@pytest.fixture
def client(tmp_path: Path) -> Iterator[StreamClient]:
    with _open(tmp_path) as c:
        yield c


def test_the_limits() -> None:
    assert (MAX_TAGS, MAX_TAG_KEY_BYTES, MAX_TAG_VALUE_BYTES, MAX_TAGS_BYTES) == (
        1000,
        1024,
        64 * 1024,
        256 * 1024,
    )
    # The total is the binding bound on size: the other limits together would allow far more.
    assert MAX_TAGS_BYTES < MAX_TAGS * (MAX_TAG_KEY_BYTES + MAX_TAG_VALUE_BYTES)
    assert MAX_TAGS_BYTES >= MAX_TAG_KEY_BYTES + MAX_TAG_VALUE_BYTES  # one tag of each maximum


def _total_tags(extra: int) -> dict[str, str]:
    """Four tags of keys and values totalling ``MAX_TAGS_BYTES + extra`` UTF-8 bytes."""
    last = MAX_TAGS_BYTES - 4 - 3 * MAX_TAG_VALUE_BYTES + extra
    return {**{k: "v" * MAX_TAG_VALUE_BYTES for k in "abc"}, "d": "v" * last}


# (id, tags at the limit, tags one past it, what the refusal's message says)
LIMITS: list[tuple[str, dict[str, str], dict[str, str], str]] = [
    (
        "count",
        {f"k{i}": "" for i in range(MAX_TAGS)},
        {f"k{i}": "" for i in range(MAX_TAGS + 1)},
        f"tags must have at most {MAX_TAGS} items",
    ),
    (
        # Bytes, not characters: "é" is two UTF-8 bytes.
        "key-bytes",
        {"é" * (MAX_TAG_KEY_BYTES // 2): "v"},
        {"é" * (MAX_TAG_KEY_BYTES // 2) + "x": "v"},
        f"tags key must be at most {MAX_TAG_KEY_BYTES} UTF-8 bytes, got {MAX_TAG_KEY_BYTES + 1}",
    ),
    (
        "value-bytes",
        {"schema": "s" * MAX_TAG_VALUE_BYTES},
        {"schema": "s" * (MAX_TAG_VALUE_BYTES - 1) + "é"},
        f"tags['schema'] must be at most {MAX_TAG_VALUE_BYTES} UTF-8 bytes, "
        f"got {MAX_TAG_VALUE_BYTES + 1}",
    ),
    (
        "total-bytes",
        _total_tags(0),
        _total_tags(1),
        f"tags must total at most {MAX_TAGS_BYTES} UTF-8 bytes of keys and values",
    ),
]


@pytest.mark.parametrize(
    ("ok", "bad", "message"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS]
)
def test_each_limit_at_and_one_past(
    tmp_path: Path, ok: dict[str, str], bad: dict[str, str], message: str
) -> None:
    with _open(tmp_path) as client:
        seq = client.metadata.seq
        with pytest.raises(InvalidArgumentError) as err:
            client.create_stream(bad)
        assert message in str(err.value)
        assert len(str(err.value)) < 400  # the oversized text is cut short in the message
        assert client.metadata.seq == seq  # no metadata entry
        assert client.list_streams() == []

        stream = client.create_stream(ok)
        assert dict(stream.tags) == ok
        sid = stream.stream_id
    with _open(tmp_path) as client:
        (info,) = client.list_streams()
        assert (info.stream_id, dict(info.tags)) == (sid, ok)


@pytest.mark.parametrize(("bad", "message"), [c[2:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_create_streams_names_the_item_and_creates_nothing(
    client: StreamClient, bad: dict[str, str], message: str
) -> None:
    seq = client.metadata.seq
    with pytest.raises(InvalidArgumentError) as err:
        client.create_streams([None, {"topic": "t"}, bad, {"topic": "u"}])
    assert message.replace("tags", "tags[2]", 1) in str(err.value)
    assert client.metadata.seq == seq
    assert client.list_streams() == []
    # Each item has the limits on its own: many streams at the limit are fine.
    streams = client.create_streams([{"k": "v" * MAX_TAG_VALUE_BYTES}] * 3)
    assert [len(s.tags["k"]) for s in streams] == [MAX_TAG_VALUE_BYTES] * 3


class _Endless(Mapping[str, str]):
    """A mapping that claims one item and iterates forever."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[str]:
        i = 0
        while True:
            yield f"k{i}"
            i += 1

    def __getitem__(self, key: str) -> str:
        return "v"


def test_an_endless_mapping_is_refused_not_a_hang(client: StreamClient) -> None:
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_TAGS} items"):
        client.create_stream(_Endless())
    assert client.list_streams() == []


class _Sneaky(str):
    """A str subclass as a careless or hostile caller might pass: it holds a reference cycle
    (through its __dict__) and overrides equality, hashing, conversion and encoding."""

    def __init__(self, text: str) -> None:
        self.me = self

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def __hash__(self) -> int:
        return id(self)

    def __str__(self) -> str:
        return "overridden"

    def __len__(self) -> int:
        return 0

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b""


class _SneakyMap(Mapping[str, str]):
    """A Mapping (not a dict) that also sits in a reference cycle."""

    def __init__(self, items: dict[str, str]) -> None:
        self.items_ = items
        self.me = self

    def __len__(self) -> int:
        return len(self.items_)

    def __iter__(self) -> Iterator[str]:
        return iter(self.items_)

    def __getitem__(self, key: str) -> str:
        return self.items_[key]


def _assert_plain(tags: Mapping[str, str], expected: dict[str, str]) -> None:
    assert dict(tags) == expected
    for k, v in tags.items():
        assert type(k) is str and type(v) is str, (type(k), type(v))


def test_str_subclasses_are_stored_as_plain_str(tmp_path: Path) -> None:
    key, value, other = _Sneaky("topic"), _Sneaky("orders"), _Sneaky("0")
    refs = [weakref.ref(x) for x in (key, value, other)]
    tags = _SneakyMap({key: value, "partition": other})
    map_ref = weakref.ref(tags)
    expected = {"topic": "orders", "partition": "0"}
    with _open(tmp_path) as client:
        stream = client.create_stream(tags)
        (batch_stream,) = client.create_streams([tags])
        for s in (stream, batch_stream):
            _assert_plain(s.tags, expected)
            _assert_plain(client.metadata.get_stream(s.stream_id).tags, expected)
        infos = client.list_streams({"topic": "orders"})
        assert [i.stream_id for i in infos] == [stream.stream_id, batch_stream.stream_id]
        for info in infos:
            _assert_plain(info.tags, expected)
        # Nothing the client keeps refers to the caller's objects: once the caller drops
        # them, the collector frees their cycles (they never reached a gc=False struct).
        del key, value, other, tags
        gc.collect()
        assert [r() for r in refs] == [None, None, None]
        assert map_ref() is None
        # A filter of str subclasses finds the plain str stored.
        assert [i.stream_id for i in client.list_streams({_Sneaky("topic"): "orders"})] == [
            stream.stream_id,
            batch_stream.stream_id,
        ]
    with _open(tmp_path) as client:
        infos = client.list_streams()
        assert len(infos) == 2
        for info in infos:
            _assert_plain(info.tags, expected)
            _assert_plain(client.metadata.get_stream(info.stream_id).tags, expected)


def test_keys_equal_as_text_are_refused_not_merged(client: StreamClient) -> None:
    # Two keys a dict keeps apart (their __eq__/__hash__ say so) but that are the same text:
    # storing both would silently keep one value.
    tags = {_Sneaky("topic"): "a", _Sneaky("topic"): "b"}
    assert len(tags) == 2
    with pytest.raises(InvalidArgumentError, match="tags has the key 'topic' more than once"):
        client.create_stream(tags)
    with pytest.raises(InvalidArgumentError, match=r"tags\[1\] has the key 'topic' more than"):
        client.create_streams([None, tags])
    assert client.list_streams() == []


def test_the_other_str_maps_get_plain_str_too() -> None:
    # Batch properties, list_streams filters and the metadata layer share check_str_map; header
    # names use check_text.
    got = check_str_map("properties", {_Sneaky("k"): _Sneaky("v")})
    assert got == {"k": "v"}
    assert [type(x) for x in (*got, *got.values())] == [str, str]
    batch = s3stream.RecordBatch(b"x", properties={_Sneaky("k"): _Sneaky("v")})
    _assert_plain(batch.properties, {"k": "v"})
    ((name, _),) = s3stream.Record(b"v", headers=((_Sneaky("h"), b"x"),)).headers
    assert type(name) is str and name == "h"
    # Exact str keys and values are kept as they are: no copy on the hot path.
    key, value = "k" * 10, "v" * 10
    ((k2, v2),) = check_str_map("properties", {key: value}).items()
    assert k2 is key and v2 is value


def test_limits_apply_to_new_tags_only(tmp_path: Path) -> None:
    # A log written before the limits (or by another tool) stays readable, and list_streams
    # filters are not new tags: neither is bounded.
    big = {"k": "v" * (MAX_TAG_VALUE_BYTES + 1)}
    with _open(tmp_path) as client:
        (meta,) = client.metadata.create_streams([big])
        assert client.list_streams(big)[0].stream_id == meta.stream_id
    with _open(tmp_path) as client:
        assert [dict(i.tags) for i in client.list_streams()] == [big]


def test_aio_refuses_the_same(tmp_path: Path) -> None:
    async def main() -> None:
        async with await aio.open(str(tmp_path / "store"), environ={}) as client:
            seq = client.sync.metadata.seq
            for _, _, bad, message in LIMITS:
                with pytest.raises(InvalidArgumentError) as err:
                    await client.create_stream(bad)
                assert message in str(err.value)
                with pytest.raises(InvalidArgumentError) as err:
                    await client.create_streams([None, bad])
                assert message.replace("tags", "tags[1]", 1) in str(err.value)
            assert client.sync.metadata.seq == seq
            assert await client.list_streams() == []
            stream = await client.create_stream({_Sneaky("topic"): _Sneaky("orders")})
            _assert_plain(stream.tags, {"topic": "orders"})
            (info,) = await client.list_streams()
            _assert_plain(info.tags, {"topic": "orders"})

    asyncio.run(main())


def test_a_mapping_that_yields_no_pairs_or_never_ends_is_refused_as_properties() -> None:
    """Batch properties go through the same check: items that are not pairs, or a mapping
    that never stops yielding, raise `InvalidArgumentError` (not ValueError, not a hang)."""
    from s3stream.validation import MAX_MAP_ITEMS

    class NotPairs(Mapping[str, str]):
        def __getitem__(self, key: str) -> str:
            return "v"

        def __iter__(self) -> Iterator[str]:
            return iter(["k"])

        def __len__(self) -> int:
            return 1

        def items(self) -> Any:
            return [("a", "b", "c")]

    class Endless(Mapping[str, str]):
        def __getitem__(self, key: str) -> str:
            return "v"

        def __iter__(self) -> Iterator[str]:
            return (f"k{i}" for i in itertools.count())

        def __len__(self) -> int:
            return 1

    with pytest.raises(InvalidArgumentError, match="items"):
        RecordBatch(b"x", properties=NotPairs())

    class Broken(NotPairs):
        def items(self) -> Any:
            return 5  # not iterable

    class StrPairs(NotPairs):
        def items(self) -> Any:
            return ["ab"]  # two characters are not a (key, value) pair

    class Refusing(Endless):
        def __iter__(self) -> Iterator[str]:
            return iter(["k"])

        def __getitem__(self, key: str) -> str:
            raise KeyError(key)

    for odd in (Broken(), StrPairs(), Refusing()):
        with pytest.raises(InvalidArgumentError):
            RecordBatch(b"x", properties=odd)
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_MAP_ITEMS} items"):
        RecordBatch(b"x", properties=Endless())
