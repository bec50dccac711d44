"""`store_cost`: what a store's contents cost to keep, from a listing (``s3stream inspect
--cost``).

A running client prices its own traffic (`ClientMetrics.cost`); an inspection has no traffic
to measure, only what is stored: it lists the store once (one LIST request per 1,000 objects)
and prices the bytes under each top-level prefix (``data``, ``meta``, ``wal``, ...). Given a
`StreamReader`, it also splits the data objects by what the metadata says of them: live,
replaced and awaiting deletion, or not listed at all (orphans the sweeper will delete).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidArgumentError
from ..objectstore.base import ObjectStore
from .cost import S3_STANDARD_US_EAST_1, PriceTable

__all__ = ["AreaUsage", "StoreCost", "store_cost"]

_PAGE = 1000


@runtime_checkable
class _Reader(Protocol):
    """What `store_cost` uses of a `StreamReader` (not imported: the reader imports this
    package's neighbours)."""

    @property
    def object_store(self) -> ObjectStore: ...

    def objects(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class AreaUsage:
    """Objects and bytes under one top-level prefix of the store."""

    prefix: str
    objects: int
    bytes: int


@dataclass(frozen=True, slots=True)
class StoreCost:
    """A store's contents and their monthly storage cost."""

    prices: PriceTable
    areas: tuple[AreaUsage, ...]
    stored_bytes: int
    storage_usd_per_month: float
    #: LIST requests the listing took (and their cost, a one-off).
    list_requests: int
    list_usd: float
    #: With a reader: bytes of data objects the metadata lists as live, as replaced (deleted
    #: after the deletion delay; those still in the store), and of data-area objects it does
    #: not list (orphans); else None.
    live_bytes: int | None = None
    deleting_bytes: int | None = None
    orphan_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        out: dict[str, Any] = {
            "prices": self.prices.name,
            "stored_bytes": self.stored_bytes,
            "storage_usd_per_month": round(self.storage_usd_per_month, 6),
            "list_requests": self.list_requests,
            "list_usd": round(self.list_usd, 6),
            "areas": [
                {"prefix": a.prefix, "objects": a.objects, "bytes": a.bytes} for a in self.areas
            ],
        }
        if self.live_bytes is not None:
            out.update(
                live_bytes=self.live_bytes,
                deleting_bytes=self.deleting_bytes,
                orphan_bytes=self.orphan_bytes,
            )
        return out


def store_cost(
    source: ObjectStore | _Reader,
    *,
    prices: PriceTable = S3_STANDARD_US_EAST_1,
    data_prefix: str = "data",
) -> StoreCost:
    """List `source` (an `ObjectStore`, or a `StreamReader`: its store) and price what it
    holds at `prices`. `data_prefix` names the data area (``data``, or ``{namespace}/data``)
    for the live / replaced / orphan split a reader allows."""
    reader = source if isinstance(source, _Reader) else None
    store = reader.object_store if reader is not None else source
    if not isinstance(store, ObjectStore):
        raise InvalidArgumentError(
            f"source must be an ObjectStore or a StreamReader, got {source!r}"
        )
    areas: dict[str, list[int]] = {}
    data_sizes: dict[str, int] = {}
    listed = 0
    for info in store.list():
        listed += 1
        area = info.key.split("/", 1)[0]
        usage = areas.setdefault(area, [0, 0])
        usage[0] += 1
        usage[1] += info.size
        if info.key.startswith(data_prefix + "/"):
            data_sizes[info.key] = info.size
    stored = sum(b for _, b in areas.values())
    list_requests = max(1, -(-listed // _PAGE))
    live = deleting = orphans = None
    if reader is not None:
        # By key, not by subtracting totals: an object the metadata still lists as being
        # deleted but a purge removed already (a crash between the purge's delete and its
        # commit) hid as many bytes of orphans.
        objects = reader.objects()
        known = {o.key for o in objects}
        live = sum(o.size for o in objects if o.live)
        deleting = sum(data_sizes.get(o.key, 0) for o in objects if not o.live)
        orphans = sum(size for key, size in data_sizes.items() if key not in known)
    return StoreCost(
        prices=prices,
        areas=tuple(AreaUsage(k, n, b) for k, (n, b) in sorted(areas.items())),
        stored_bytes=stored,
        storage_usd_per_month=prices.storage_per_month(stored),
        list_requests=list_requests,
        list_usd=list_requests * prices.per_request("ListObjectsV2"),
        live_bytes=live,
        deleting_bytes=deleting,
        orphan_bytes=orphans,
    )
