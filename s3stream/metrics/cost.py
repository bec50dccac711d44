"""Object-store prices and what requests and stored bytes cost at them.

`PriceTable` holds one provider's prices; `S3_STANDARD_US_EAST_1`, the default, is Amazon S3
Standard in us-east-1: $0.005 per 1,000 PUT, COPY, POST and LIST requests, $0.0004 per 1,000
GET and all other requests, DELETE free, $0.023 per GB-month stored (first 50 TB; AWS bills
storage in binary GB, 2**30 bytes). Make your own for another provider, region or tier:
``PriceTable(name="r2", put_per_1000=0.0045, get_per_1000=0.00036, storage_gb_month=0.015)``.

A month is 730 hours here, as AWS prices monthly amounts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import InvalidArgumentError
from ..units import GiB
from ..validation import check_number, check_text

__all__ = [
    "DEFAULT_CLASSES",
    "GIB",
    "PRICE_TABLES",
    "S3_STANDARD_US_EAST_1",
    "SECONDS_PER_MONTH",
    "CostReport",
    "PriceTable",
    "RequestClass",
    "RequestCost",
    "price",
]

#: Bytes in the GB of a GB-month.
GIB = GiB
#: Seconds in the month of "$ per month" (730 hours).
SECONDS_PER_MONTH = 730 * 3600


class RequestClass(enum.Enum):
    """How a provider bills a request."""

    #: PUT, COPY, POST and LIST requests.
    PUT = "put"
    #: GET, HEAD and every other request.
    GET = "get"
    #: DELETE requests (free on S3).
    DELETE = "delete"


#: S3 API names and their class. ``DeleteObjects`` (multi-object delete) is a POST: priced as
#: one, which may overstate it; an unknown name is in the GET class ("all other requests").
DEFAULT_CLASSES: Mapping[str, RequestClass] = MappingProxyType(
    {
        "PutObject": RequestClass.PUT,
        "CopyObject": RequestClass.PUT,
        "PostObject": RequestClass.PUT,
        "CreateMultipartUpload": RequestClass.PUT,
        "UploadPart": RequestClass.PUT,
        "CompleteMultipartUpload": RequestClass.PUT,
        "ListObjectsV2": RequestClass.PUT,
        "ListObjects": RequestClass.PUT,
        "DeleteObjects": RequestClass.PUT,
        "GetObject": RequestClass.GET,
        "HeadObject": RequestClass.GET,
        "HeadBucket": RequestClass.GET,
        "DeleteObject": RequestClass.DELETE,
    }
)


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices of one object-store offering, in US dollars (see the module docstring)."""

    name: str = "aws-s3-standard-us-east-1"
    #: Per 1,000 requests of the PUT class.
    put_per_1000: float = 0.005
    #: Per 1,000 requests of the GET class.
    get_per_1000: float = 0.0004
    #: Per 1,000 DELETE requests.
    delete_per_1000: float = 0.0
    #: Per GB-month stored (GB = 2**30 bytes).
    storage_gb_month: float = 0.023
    #: The class of each request name; names not in it are in the GET class.
    classes: Mapping[str, RequestClass] = field(default_factory=lambda: DEFAULT_CLASSES, repr=False)

    def __post_init__(self) -> None:
        # Checked here, not at pricing: a bad table would otherwise raise in every `cost()`
        # and in every scrape of the cost gauge (taking the other metrics of it down).
        check_text("name", self.name)
        for name in ("put_per_1000", "get_per_1000", "delete_per_1000", "storage_gb_month"):
            check_number(name, getattr(self, name))
        if not isinstance(self.classes, Mapping):
            raise InvalidArgumentError(
                "classes must be a mapping of request names to RequestClass, got "
                f"{type(self.classes).__name__}"
            )
        for request, cls in self.classes.items():
            if not isinstance(request, str) or not isinstance(cls, RequestClass):
                raise InvalidArgumentError(
                    "classes must map request names (str) to RequestClass members, got "
                    f"{request!r}: {cls!r}"
                )

    def request_class(self, request: str) -> RequestClass:
        """How request `request` (an S3 API name) is billed."""
        return self.classes.get(request, RequestClass.GET)

    def per_request(self, request: str) -> float:
        """Dollars for one request `request`."""
        cls = self.request_class(request)
        per_1000 = {
            RequestClass.PUT: self.put_per_1000,
            RequestClass.GET: self.get_per_1000,
            RequestClass.DELETE: self.delete_per_1000,
        }[cls]
        return per_1000 / 1000

    def storage_per_month(self, stored_bytes: float) -> float:
        """Dollars per month for keeping `stored_bytes` stored."""
        return stored_bytes / GIB * self.storage_gb_month


S3_STANDARD_US_EAST_1 = PriceTable()

#: Price tables by name.
PRICE_TABLES: Mapping[str, PriceTable] = MappingProxyType(
    {S3_STANDARD_US_EAST_1.name: S3_STANDARD_US_EAST_1}
)


@dataclass(frozen=True, slots=True)
class RequestCost:
    """Requests of one S3 API name made for one purpose, over the report's window."""

    purpose: str
    request: str
    request_class: RequestClass
    #: Requests in the window, and since counting began.
    count: int
    total: int
    per_second: float
    usd_per_month: float


@dataclass(frozen=True, slots=True)
class CostReport:
    """What object storage costs per month at the current rate.

    Request cost is each request kind's rate (requests in the window / the window's seconds)
    x `SECONDS_PER_MONTH` x its price; storage cost is `stored_bytes` x the GB-month price.
    """

    prices: PriceTable
    #: Seconds the request rate was measured over (0: no time has passed, rates are 0).
    window_s: float
    requests: tuple[RequestCost, ...]
    stored_bytes: int
    requests_usd_per_month: float
    storage_usd_per_month: float

    @property
    def usd_per_month(self) -> float:
        """Requests and storage together."""
        return self.requests_usd_per_month + self.storage_usd_per_month

    def by_purpose(self) -> dict[str, float]:
        """Request dollars per month, by purpose."""
        out: dict[str, float] = {}
        for r in self.requests:
            out[r.purpose] = out.get(r.purpose, 0.0) + r.usd_per_month
        return out

    def count(self, request: str | None = None, purpose: str | None = None) -> int:
        """Requests in the window, of one name and/or purpose (None: all)."""
        return sum(
            r.count
            for r in self.requests
            if (request is None or r.request == request)
            and (purpose is None or r.purpose == purpose)
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (for ``s3stream inspect --cost``)."""
        return {
            "prices": self.prices.name,
            "window_s": round(self.window_s, 3),
            "stored_bytes": self.stored_bytes,
            "usd_per_month": round(self.usd_per_month, 6),
            "requests_usd_per_month": round(self.requests_usd_per_month, 6),
            "storage_usd_per_month": round(self.storage_usd_per_month, 6),
            "requests": [
                {
                    "purpose": r.purpose,
                    "request": r.request,
                    "class": r.request_class.value,
                    "count": r.count,
                    "total": r.total,
                    "per_second": round(r.per_second, 6),
                    "usd_per_month": round(r.usd_per_month, 6),
                }
                for r in self.requests
            ],
        }


def price(
    prices: PriceTable,
    window_s: float,
    counts: Mapping[tuple[str, str], tuple[int, int]],
    stored_bytes: int,
) -> CostReport:
    """A `CostReport` of `counts`, ``(purpose, request) -> (in the window, total)``, made
    over `window_s` seconds, and of `stored_bytes`."""
    lines = []
    for (purpose, request), (count, total) in sorted(counts.items()):
        rate = count / window_s if window_s > 0 else 0.0
        lines.append(
            RequestCost(
                purpose=purpose,
                request=request,
                request_class=prices.request_class(request),
                count=count,
                total=total,
                per_second=rate,
                usd_per_month=rate * SECONDS_PER_MONTH * prices.per_request(request),
            )
        )
    return CostReport(
        prices=prices,
        window_s=window_s,
        requests=tuple(lines),
        stored_bytes=stored_bytes,
        requests_usd_per_month=sum(r.usd_per_month for r in lines),
        storage_usd_per_month=prices.storage_per_month(stored_bytes),
    )
