"""`ObjectStoreTests`: the `ObjectStore` contract as a pytest base class, and its state machine.

A third party proves an object store with a subclass that makes an empty store::

    class TestMyStore(ObjectStoreTests):
        def make_store(self, tmp_path):
            return MyStore(tmp_path / "objects")

Tests are grouped by the prefix of their name (``test_put_*``, ``test_get_*``, ``test_suffix_*``,
``test_head_*``, ``test_list_*``, ``test_delete_*``, ``test_conditional_*``, ``test_keys_*``,
``test_input_*``, ``test_concurrency_*``, ``test_backdoor_*``, ``test_capabilities_*``).
Optional backdoor hooks (`raw_get`, `raw_put`) check that the store really keeps what the API
reports, and `reopen_store` that a new instance sees the objects (and, for a store that claims
``atomic_create`` in its `capabilities`, that creators on different instances race fairly).
`test_state_machine` runs `ObjectStoreStateMachine`, which checks the store against a dict.

Keys never make one key a directory prefix of another (``a`` and ``a/b``): a local-directory
store cannot hold both, so the contract leaves that case out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from ..clock import SystemClock
from ..errors import InvalidArgumentError, ObjectNotFoundError, S3StreamError
from ..objectstore.base import ObjectInfo, ObjectStore, ObjectStoreCapabilities
from ..objectstore.wrappers import RetryingObjectStore
from . import MISSING_DEPENDENCIES_MESSAGE

try:
    import pytest
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

from ._binding import bind_state_machine
from .profiles import kit_settings
from .strategies import EDGE_SIZES, INVALID_KEYS, filler, object_data, object_keys

__all__ = ["ObjectStoreStateMachine", "ObjectStoreTests", "make_object_store_state_machine"]

#: Keys whose order differs between "sorted by key" and "walk directories by name".
_ORDERING_KEYS = (
    "a-b/x.0",
    "a.0",
    "a/x.0",
    "a/y.1",
    "a/z/x.0",
    "ab/x.0",
    "b/a/x.0",
    "Z.0",
    "\u00fc/x.0",
)
_UNUSUAL_KEYS = (
    "with space/x.0",
    "plus+sign.0",
    "per%20cent.0",
    "\u00fcn\u00ef/c\u00f6d\u00e9.0",
    "tilde~.0",
    "quote'.0",
    "eq=amp&.0",
    "semi;colon.0",
    "star*.0",
    "paren(1).0",
)


def _show(data: bytes | None) -> str:
    if data is None:
        return "<no object>"
    return f"<{len(data)} bytes {data[:12].hex()}{'...' if len(data) > 12 else ''}>"


def _expect_error(
    kind: type[BaseException], what: str, action: Callable[..., object], *args: object
) -> None:
    """`action(*args)` must raise `kind`."""
    try:
        action(*args)
    except kind:
        return
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__name__}: {exc}; expected {kind.__name__}"
        ) from exc
    raise AssertionError(f"{what} did not raise {kind.__name__}")


def _listed(store: ObjectStore, prefix: str = "") -> list[ObjectInfo]:
    found = list(store.list(prefix))
    for info in found:
        assert isinstance(info, ObjectInfo), f"list() yielded {info!r}, not an ObjectInfo"
    return found


def _assert_listing(store: ObjectStore, prefix: str, expected: dict[str, bytes]) -> None:
    got = [(i.key, i.size) for i in _listed(store, prefix)]
    want = sorted((k, len(v)) for k, v in expected.items() if k.startswith(prefix))
    if got == want:
        return
    keys = [k for k, _ in got]
    if sorted(keys) == [k for k, _ in want] and keys != sorted(keys):
        raise AssertionError(f"list({prefix!r}) is not in key order: {keys}")
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    raise AssertionError(
        f"list({prefix!r}) differs: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
        f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''} ({len(got)} listed, "
        f"{len(want)} expected)"
    )


def _create_after(barrier: threading.Barrier, store: ObjectStore, key: str, data: bytes) -> bool:
    barrier.wait(timeout=30)
    return store.put_if_absent(key, data)


def _assert_get(store: ObjectStore, key: str, expected: bytes, what: str = "") -> None:
    got = store.get(key)
    assert type(got) is bytes, f"get({key!r}) returned {type(got).__name__}, not bytes"
    assert got == expected, f"get({key!r}){what} returned {_show(got)}, expected {_show(expected)}"


class ObjectStoreTests:
    """Every test of the `ObjectStore` contract; subclass it as ``TestSomething``.

    Required hook: `make_store`. Optional hooks: `raw_get`, `raw_put`, `reopen_store`.
    """

    #: Objects in the listing/bulk-delete test: above 1000, the page size of S3 listings
    #: and the batch limit of S3 multi-object deletes.
    many_keys: ClassVar[int] = 1005
    #: Size of the large-object test.
    large_object_bytes: ClassVar[int] = (8 << 20) + 17
    #: Threads racing in the conditional-create test, and how many rounds they race.
    race_threads: ClassVar[int] = 8
    race_rounds: ClassVar[int] = 5
    #: Threads used to write many objects quickly.
    parallelism: ClassVar[int] = 8
    #: Whether the store's service may answer any call with a transient `UnavailableError`
    #: (a server on a network resets a connection now and then): the state machine, whose
    #: long random programs would meet one sooner or later, then calls the store through
    #: `RetryingObjectStore`, as the client does, instead of failing on it.
    transient_errors: ClassVar[bool] = False

    # -- hooks ------------------------------------------------------------------------------

    def make_store(self, tmp_path: Path) -> ObjectStore:
        """A new, empty store (each call: its own bucket prefix, directory, ...)."""
        raise NotImplementedError("ObjectStoreTests subclasses must implement make_store()")

    def raw_get(self, store: ObjectStore, key: str) -> bytes | None:
        """Optional backdoor: the stored bytes of `key` read without the store's API (None if
        there is no object)."""
        raise NotImplementedError

    def raw_put(self, store: ObjectStore, key: str, data: bytes) -> None:
        """Optional backdoor: write an object without the store's API."""
        raise NotImplementedError

    def reopen_store(self, store: ObjectStore) -> ObjectStore:
        """Optional: a new store instance over the same storage as `store`."""
        raise NotImplementedError

    def has_hook(self, name: str) -> bool:
        """Whether the subclass implements the optional hook `name`."""
        return getattr(type(self), name) is not getattr(ObjectStoreTests, name)

    def _store(self, tmp_path: Path) -> ObjectStore:
        store = self.make_store(tmp_path)
        assert isinstance(store, ObjectStore), f"make_store() returned {store!r}"
        leftovers = [i.key for i in itertools.islice(store.list(""), 5)]
        assert not leftovers, f"make_store() must return an empty store; it holds {leftovers}"
        return store

    def _put_many(self, store: ObjectStore, objects: dict[str, bytes]) -> None:
        with ThreadPoolExecutor(self.parallelism) as pool:
            list(pool.map(store.put, objects.keys(), objects.values()))

    # -- put and get ------------------------------------------------------------------------

    def test_put_get_round_trip(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {f"sizes/s{size}.0": filler(size, size) for size in EDGE_SIZES}
        for key, data in objects.items():
            assert store.put(key, data) is None, "put() must return None"
        for key, data in objects.items():
            _assert_get(store, key, data)

    def test_put_overwrites(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("k.0", b"first version")
        store.put("k.0", b"second")
        _assert_get(store, "k.0", b"second", " after an overwrite")
        info = store.head("k.0")
        assert info == ObjectInfo("k.0", 6), f"head() after an overwrite returned {info!r}"

    def test_put_empty_object(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("empty.0", b"")
        _assert_get(store, "empty.0", b"")
        assert store.get("empty.0", 0, 10) == b""
        assert store.get_suffix("empty.0", 5) == b""
        assert store.head("empty.0") == ObjectInfo("empty.0", 0)
        assert [(i.key, i.size) for i in _listed(store)] == [("empty.0", 0)]

    def test_put_large_object(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        size = self.large_object_bytes
        data = filler(size, 1)
        store.put("big/object.0", data)
        _assert_get(store, "big/object.0", data)
        mid = size // 2
        assert store.get("big/object.0", mid - 1000, mid + 1000) == data[mid - 1000 : mid + 1000]
        assert store.get_suffix("big/object.0", 4096) == data[-4096:]
        assert store.head("big/object.0") == ObjectInfo("big/object.0", size)

    def test_put_mutable_buffers_are_copied_or_rejected(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        for kind in (bytearray, memoryview):
            buf = bytearray(b"original contents")
            arg = buf if kind is bytearray else memoryview(buf)
            key = f"{kind.__name__}.0"
            try:
                store.put(key, arg)  # type: ignore[arg-type]
            except InvalidArgumentError:
                continue
            buf[:] = b"CHANGED CONTENTS!"
            _assert_get(store, key, b"original contents", f" of a {kind.__name__} changed later")

    def test_put_is_atomic_for_readers(self, tmp_path: Path) -> None:
        """A reader sees the old object or the whole new one, never a mix or a prefix."""
        store = self._store(tmp_path)
        versions = [filler(256 << 10, 10), filler(256 << 10, 11)]
        store.put("atomic.0", versions[0])
        stop = threading.Event()
        seen: list[bytes] = []

        def reader() -> None:
            while not stop.is_set():
                got = store.get("atomic.0")
                if got not in versions:
                    seen.append(got)
                    return

        with ThreadPoolExecutor(3) as pool:
            readers = [pool.submit(reader) for _ in range(3)]
            try:
                for i in range(20):
                    store.put("atomic.0", versions[i % 2])
            finally:
                stop.set()
            for r in readers:
                r.result()
        assert not seen, f"a reader saw {_show(seen[0])}, neither the old nor the new object"

    # -- ranged reads -----------------------------------------------------------------------

    def test_get_ranges(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        data = filler(1000, 2)
        store.put("r.0", data)
        cases: list[tuple[int, int | None]] = [
            (0, None),
            (0, 1000),
            (0, 5000),
            (10, 20),
            (0, 1),
            (999, None),
            (999, 1000),
            (1000, None),
            (1000, 1000),
            (1500, None),
            (1500, 2000),
            (5, 5),
            (0, 0),
        ]
        for start, end in cases:
            got = store.get("r.0", start, end)
            want = data[start:end]
            assert got == want, (
                f"get('r.0', {start}, {end}) of a 1000-byte object returned {_show(got)}, "
                f"expected {_show(want)}"
            )

    def test_get_rejects_bad_ranges(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("r.0", b"0123456789")
        for start, end in [(-1, None), (5, 4), ("0", None), (0, "9"), (1.0, None), (None, 3)]:
            what = f"get('r.0', {start!r}, {end!r})"
            _expect_error(InvalidArgumentError, what, store.get, "r.0", start, end)

    def test_get_missing_raises_not_found(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("gone.0", b"soon deleted")
        store.delete_many(["gone.0"])
        for key in ("never.0", "gone.0", "no/such/dir.0"):
            _expect_error(ObjectNotFoundError, f"get({key!r})", store.get, key)
            _expect_error(ObjectNotFoundError, f"get({key!r}, 2, 5)", store.get, key, 2, 5)
            _expect_error(ObjectNotFoundError, f"get_suffix({key!r})", store.get_suffix, key, 3)

    # -- suffix reads -----------------------------------------------------------------------

    def test_suffix_reads(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        data = filler(1000, 3)
        store.put("s.0", data)
        for length in (1, 10, 999, 1000, 1001, 1 << 20):
            got = store.get_suffix("s.0", length)
            assert got == data[-length:], (
                f"get_suffix('s.0', {length}) of a 1000-byte object returned {_show(got)}"
            )

    def test_suffix_rejects_bad_lengths(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("s.0", b"0123456789")
        for length in (0, -1, "3", 1.5, None):
            what = f"get_suffix('s.0', {length!r})"
            _expect_error(InvalidArgumentError, what, store.get_suffix, "s.0", length)

    # -- head -------------------------------------------------------------------------------

    def test_head_reports_size(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        assert store.head("h.0") is None, "head() of a missing key must return None"
        store.put("h.0", b"12345")
        info = store.head("h.0")
        assert info == ObjectInfo("h.0", 5), f"head('h.0') returned {info!r}"
        store.delete_many(["h.0"])
        assert store.head("h.0") is None, "head() of a deleted key must return None"
        assert store.head("d/h.0") is None

    # -- list -------------------------------------------------------------------------------

    def test_list_is_in_key_order_with_sizes(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {key: filler(i * 3, i) for i, key in enumerate(_ORDERING_KEYS)}
        self._put_many(store, objects)
        _assert_listing(store, "", objects)

    def test_list_prefix_is_a_string_prefix(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {key: filler(i, i) for i, key in enumerate(_ORDERING_KEYS)}
        self._put_many(store, objects)
        for prefix in ("a", "a/", "a-", "a.", "a/x", "a/z/", "ab", "b/", "b/a/x.0", "nothing", ""):
            _assert_listing(store, prefix, objects)

    def test_list_and_delete_many_keys(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {f"many/{i % 3}/k{i:05d}.0": filler(i % 17, i) for i in range(self.many_keys)}
        self._put_many(store, objects)
        _assert_listing(store, "", objects)
        _assert_listing(store, "many/1/", objects)
        store.delete_many(objects)
        _assert_listing(store, "", {})

    # -- delete -----------------------------------------------------------------------------

    def test_delete_many(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {f"d/{i}.0": b"x" * i for i in range(6)}
        self._put_many(store, objects)
        store.delete_many([])
        store.delete_many(["d/0.0", "d/0.0", "missing.0", "d/none/x.0"])
        store.delete_many(k for k in ("d/1.0", "d/2.0"))
        for key in ("d/0.0", "d/1.0", "d/2.0"):
            del objects[key]
            assert store.head(key) is None, f"{key!r} survived delete_many()"
        _assert_listing(store, "", objects)
        for key, data in objects.items():
            _assert_get(store, key, data, " after other keys were deleted")

    # -- conditional create -----------------------------------------------------------------

    def test_conditional_create(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        assert store.put_if_absent("c.0", b"first") is True, "creating a new key must give True"
        assert store.put_if_absent("c.0", b"second") is False, "an existing key must give False"
        _assert_get(store, "c.0", b"first", " after a refused put_if_absent")
        store.put("p.0", b"by put")
        assert store.put_if_absent("p.0", b"other") is False
        _assert_get(store, "p.0", b"by put")
        store.delete_many(["c.0"])
        assert store.put_if_absent("c.0", b"third") is True, "a deleted key can be created again"
        _assert_get(store, "c.0", b"third")
        assert store.put_if_absent("e/empty.0", b"") is True
        assert store.put_if_absent("e/empty.0", b"x") is False
        _assert_get(store, "e/empty.0", b"")

    def test_conditional_create_race(self, tmp_path: Path) -> None:
        """Of racing creators of one key, exactly one wins, and its data is what is stored."""
        store = self._store(tmp_path)
        n = self.race_threads
        for round_ in range(self.race_rounds):
            key = f"race/{round_}.0"
            barrier = threading.Barrier(n)
            payloads = [f"writer {t} round {round_}".encode() * (t + 1) for t in range(n)]

            with ThreadPoolExecutor(n) as pool:
                results = list(
                    pool.map(_create_after, [barrier] * n, [store] * n, [key] * n, payloads)
                )
            winners = [t for t, won in enumerate(results) if won is True]
            assert all(type(r) is bool for r in results), f"put_if_absent returned {results}"
            assert len(winners) == 1, (
                f"{len(winners)} of {n} racing put_if_absent({key!r}) calls returned True"
            )
            _assert_get(store, key, payloads[winners[0]], " (the race winner's data)")

    # -- capabilities -----------------------------------------------------------------------

    def test_capabilities_record(self, tmp_path: Path) -> None:
        """`capabilities` is a frozen `ObjectStoreCapabilities` of bools (and a scheme) that
        does not change while the store is used; the listing claim holds (the contract, and
        s3stream's orphan sweeper and list retries, need key order)."""
        store = self._store(tmp_path)
        caps = store.capabilities
        assert isinstance(caps, ObjectStoreCapabilities), (
            f"capabilities is {caps!r}, not an ObjectStoreCapabilities"
        )
        for f in dataclasses.fields(caps):
            value = getattr(caps, f.name)
            kind = str if f.name == "scheme" else bool
            assert type(value) is kind, f"capabilities.{f.name} is {value!r}, not a {kind}"
        with pytest.raises(dataclasses.FrozenInstanceError):
            caps.atomic_create = not caps.atomic_create  # type: ignore[misc]
        assert caps.ordered_listing, (
            "the ObjectStore contract asks for listings in key order; sort them in list()"
        )
        store.put("caps/a.0", b"a")
        assert store.capabilities == caps, "capabilities changed after a write"
        text = repr(store)
        assert isinstance(text, str) and text, "repr() must return a non-empty str"

    def test_capabilities_atomic_create_holds_across_instances(self, tmp_path: Path) -> None:
        """A store that claims ``atomic_create`` gives one winner among creators that use
        different instances over the same storage (as different processes do), not only
        among threads sharing one instance."""
        store = self._store(tmp_path)
        if not store.capabilities.atomic_create:
            pytest.skip(f"{store.describe()} does not claim atomic_create")
        if not self.has_hook("reopen_store"):
            pytest.skip(f"{type(self).__name__} does not implement reopen_store()")
        n = self.race_threads
        others = [self.reopen_store(store) for _ in range(n - 1)]
        stores = [store, *others]
        try:
            for round_ in range(self.race_rounds):
                key = f"xrace/{round_}.0"
                barrier = threading.Barrier(n)
                payloads = [f"instance {t} round {round_}".encode() for t in range(n)]
                with ThreadPoolExecutor(n) as pool:
                    results = list(
                        pool.map(_create_after, [barrier] * n, stores, [key] * n, payloads)
                    )
                winners = [t for t, won in enumerate(results) if won is True]
                assert len(winners) == 1, (
                    f"{len(winners)} of {n} store instances racing put_if_absent({key!r}) got "
                    "True, yet the store claims atomic_create"
                )
                _assert_get(store, key, payloads[winners[0]], " (the race winner's data)")
        finally:
            for other in others:
                with contextlib.suppress(Exception):
                    other.close()

    # -- keys and arguments -----------------------------------------------------------------

    def test_keys_unusual_characters(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        objects = {key: key.encode() for key in _UNUSUAL_KEYS}
        for key, data in objects.items():
            store.put(key, data)
        for key, data in objects.items():
            _assert_get(store, key, data)
            assert store.head(key) == ObjectInfo(key, len(data)), f"head({key!r})"
        _assert_listing(store, "", objects)
        store.delete_many(objects)
        _assert_listing(store, "", {})

    def test_keys_invalid_are_refused(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        store.put("good.0", b"ok")
        for bad in INVALID_KEYS:
            _expect_error(InvalidArgumentError, f"put({bad!r})", store.put, bad, b"x")
            what = f"put_if_absent({bad!r})"
            _expect_error(InvalidArgumentError, what, store.put_if_absent, bad, b"x")
            _expect_error(InvalidArgumentError, f"get({bad!r})", store.get, bad)
            _expect_error(InvalidArgumentError, f"get_suffix({bad!r})", store.get_suffix, bad, 1)
            _expect_error(InvalidArgumentError, f"head({bad!r})", store.head, bad)
            _expect_error(InvalidArgumentError, f"delete_many([{bad!r}])", store.delete_many, [bad])
        _assert_listing(store, "", {"good.0": b"ok"})

    def test_input_data_must_be_bytes(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        for bad in ("text", None, 5, [1, 2]):
            _expect_error(InvalidArgumentError, f"put(key, {bad!r})", store.put, "x.0", bad)
            what = f"put_if_absent(key, {bad!r})"
            _expect_error(InvalidArgumentError, what, store.put_if_absent, "y.0", bad)
        _assert_listing(store, "", {})

    def test_input_list_prefix_must_be_str(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        for bad in (None, 5, b"a"):
            _expect_error(InvalidArgumentError, f"list({bad!r})", _listed, store, bad)

    # -- concurrency ------------------------------------------------------------------------

    def test_concurrency_puts_and_gets(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)

        def work(t: int) -> dict[str, bytes]:
            mine = {f"t{t}/k{i}.0": filler(100 + i, t * 100 + i) for i in range(15)}
            for key, data in mine.items():
                store.put(key, data)
            for key, data in mine.items():
                _assert_get(store, key, data, " under concurrent writers")
            return mine

        with ThreadPoolExecutor(self.parallelism) as pool:
            results = list(pool.map(work, range(self.parallelism)))
        _assert_listing(store, "", {k: v for part in results for k, v in part.items()})

    # -- backdoors --------------------------------------------------------------------------

    def test_backdoor_objects_are_stored(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        if not self.has_hook("raw_get"):
            pytest.skip(f"{type(self).__name__} does not implement raw_get()")
        data = filler(3000, 4)
        store.put("bd/put.0", data)
        assert self.raw_get(store, "bd/put.0") == data, "put() did not store the bytes"
        assert store.put_if_absent("bd/pia.0", data[:10]) is True
        assert self.raw_get(store, "bd/pia.0") == data[:10], "put_if_absent() stored other bytes"
        store.delete_many(["bd/put.0"])
        assert self.raw_get(store, "bd/put.0") is None, "delete_many() left the object stored"

    def test_backdoor_stored_objects_are_served(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        if not self.has_hook("raw_put"):
            pytest.skip(f"{type(self).__name__} does not implement raw_put()")
        data = filler(3000, 5)
        self.raw_put(store, "bd/raw.0", data)
        _assert_get(store, "bd/raw.0", data, " of an object written behind the store's back")
        assert store.head("bd/raw.0") == ObjectInfo("bd/raw.0", 3000)
        assert store.put_if_absent("bd/raw.0", b"other") is False
        _assert_listing(store, "", {"bd/raw.0": data})

    def test_backdoor_reopened_store_sees_objects(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        if not self.has_hook("reopen_store"):
            pytest.skip(f"{type(self).__name__} does not implement reopen_store()")
        objects = {"ro/a.0": b"alpha", "ro/b.0": b""}
        self._put_many(store, objects)
        again = self.reopen_store(store)
        for key, data in objects.items():
            _assert_get(again, key, data, " from a new store instance")
        _assert_listing(again, "", objects)

    def test_describe(self, tmp_path: Path) -> None:
        text = self._store(tmp_path).describe()
        assert isinstance(text, str) and text, "describe() must return a non-empty str"

    # -- the state machine ------------------------------------------------------------------

    def test_state_machine(self, tmp_path: Path, pytestconfig: pytest.Config) -> None:
        """Random programs of puts, conditional creates, reads, deletes and lists vs a dict."""
        machine = make_object_store_state_machine(self, tmp_path)
        run_state_machine_as_test(machine, settings=kit_settings(pytestconfig))

    @classmethod
    def state_machine(cls) -> type[Any]:
        """The state machine as a `unittest.TestCase` class (for use outside an
        ObjectStoreTests run: the hooks must then work on an instance made without fixtures)."""
        case: type[Any] = make_object_store_state_machine(cls()).TestCase
        return type(case.__name__, (case,), {"settings": kit_settings(None)})


_LIST_PREFIXES = ("", "a", "a/", "a-", "ab", "b/", "z", "\u00fc", "a/x", "x.", "b/a/")


class ObjectStoreStateMachine(RuleBasedStateMachine):
    """Checks an object store against a dict of key to bytes, operation by operation.

    Bind it to the hooks of an `ObjectStoreTests` instance with
    `make_object_store_state_machine`; each run gets an empty store from `make_store`.
    """

    hooks: ClassVar[ObjectStoreTests]
    new_directory: ClassVar[Callable[[], Path]]

    def __init__(self) -> None:
        super().__init__()
        self.directory = type(self).new_directory()
        store = self.hooks._store(self.directory)
        if self.hooks.transient_errors:
            store = RetryingObjectStore(store, clock=SystemClock(), rng=random.Random(0))
        self.store = store
        self.model: dict[str, bytes] = {}

    def _key(self, data: st.DataObject) -> str:
        if self.model:
            existing: bool = data.draw(st.booleans(), label="existing key")
            if existing:
                return data.draw(st.sampled_from(sorted(self.model)), label="key")
        return data.draw(object_keys(), label="key")

    @rule(data=st.data(), payload=object_data(4096))
    def put(self, data: st.DataObject, payload: bytes) -> None:
        """Write (or overwrite) an object."""
        key = self._key(data)
        self.store.put(key, payload)
        self.model[key] = payload

    @rule(data=st.data(), payload=object_data(4096))
    def put_if_absent(self, data: st.DataObject, payload: bytes) -> None:
        """Create an object unless the key exists."""
        key = self._key(data)
        created = self.store.put_if_absent(key, payload)
        assert created is (key not in self.model), (
            f"put_if_absent({key!r}) returned {created!r} with the key "
            f"{'present' if key in self.model else 'absent'}"
        )
        self.model.setdefault(key, payload)

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        """Read a whole object, or a range of it."""
        key = self._key(data)
        expected = self.model.get(key)
        size = 0 if expected is None else len(expected)
        start, end = data.draw(
            st.just((0, None))
            | st.tuples(st.integers(0, size + 8), st.none())
            | st.integers(0, size + 8).flatmap(
                lambda s: st.tuples(st.just(s), st.integers(s, size + 16))
            ),
            label="range",
        )
        try:
            got: bytes | None = self.store.get(key, start, end)
        except ObjectNotFoundError:
            got = None
        want = None if expected is None else expected[start:end]
        assert got == want, (
            f"get({key!r}, {start}, {end}) gave {_show(got)}, expected {_show(want)}"
        )

    @rule(data=st.data(), length=st.integers(1, 5000))
    def get_suffix(self, data: st.DataObject, length: int) -> None:
        """Read the tail of an object."""
        key = self._key(data)
        expected = self.model.get(key)
        try:
            got: bytes | None = self.store.get_suffix(key, length)
        except ObjectNotFoundError:
            got = None
        want = None if expected is None else expected[-length:]
        assert got == want, f"get_suffix({key!r}, {length}) gave {_show(got)}"

    @rule(data=st.data())
    def head(self, data: st.DataObject) -> None:
        """Ask for an object's size."""
        key = self._key(data)
        expected = self.model.get(key)
        want = None if expected is None else ObjectInfo(key, len(expected))
        got = self.store.head(key)
        assert got == want, f"head({key!r}) gave {got!r}, expected {want!r}"

    @rule(data=st.data())
    def delete_many(self, data: st.DataObject) -> None:
        """Delete a few keys, present or not."""
        keys = [self._key(data) for _ in range(data.draw(st.integers(0, 4), label="count"))]
        self.store.delete_many(keys)
        for key in keys:
            self.model.pop(key, None)

    @rule(prefix=st.sampled_from(_LIST_PREFIXES))
    def list_prefix(self, prefix: str) -> None:
        """List a prefix."""
        _assert_listing(self.store, prefix, self.model)

    def teardown(self) -> None:
        try:
            _assert_listing(self.store, "", self.model)
        finally:
            # Each run's objects go at once: hundreds of runs add up (on a shared bucket too).
            with contextlib.suppress(S3StreamError):
                self.store.delete_many(list(self.model))
            shutil.rmtree(self.directory, ignore_errors=True)


def make_object_store_state_machine(
    hooks: ObjectStoreTests, directory: Path | None = None
) -> type[ObjectStoreStateMachine]:
    """An `ObjectStoreStateMachine` bound to `hooks`; each run gets a new directory for
    `make_store`, below `directory` if given, else in a temporary directory; it is removed
    after the run."""
    return bind_state_machine(ObjectStoreStateMachine, hooks, directory, "s3stream-store-kit-")
