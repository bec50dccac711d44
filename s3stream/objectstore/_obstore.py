"""What the stores built on obstore (Rust ``object_store``, GIL-free) share: the client's life
cycle, the operations whose requests are the same on every service, and reading obstore's errors.

`ObstoreObjectStore` is the base of `AzureObjectStore` and `ObstoreS3ObjectStore`, on
`RemoteObjectStore` (one obstore client per store, built on first use, rebuilt after
`bound_attempts`, not pickled). It makes ONE try per call by default (obstore's retries off:
the client's retry layer, `RetryingObjectStore`, is the only one), implements `put`,
`put_if_absent`, `get`, `head` and `list` through obstore, and maps obstore's errors onto the
s3stream error kinds where every service means the same (`_translate`). A subclass builds the
client and says what its service means: `describe`, `_service_error` (the errors only it
knows: a missing bucket or container, denied or refused credentials), `_no_root` (the error of
a missing bucket or container), `_check_root_once` (whether a HEAD's bodiless 404 was a
missing bucket or container), `_create_conflict` and `_create_refused_as_existing` (whether a
failed conditional create was "exists", a retryable conflict, or another refusal),
`delete_many`, and `get_suffix` where the service has suffix ranges.

obstore reports the HTTP status and the service's error body only in its messages (``... status
code: 412 Precondition Failed: <?xml ...><Code>PreconditionFailed</Code>...``):
`status_of` and `code_of` read them from there.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from ..errors import (
    ContendedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ..validation import check_int
from ._common import as_bytes, listed, not_implemented
from ._remote import RemoteObjectStore
from .base import ObjectInfo, check_key
from .requests import GET_OBJECT, HEAD_OBJECT, LIST_OBJECTS, PUT_OBJECT

__all__ = [
    "Failure",
    "ObstoreObjectStore",
    "code_of",
    "first_line",
    "is_past_the_end",
    "looks_transient",
    "status_of",
]

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
#: Words of obstore's messages for failures without an answer (connect, timeout, cut body).
_TRANSIENT_TEXT = ("error sending request", "timed out", "timeout", "connection", "body")


@dataclasses.dataclass(frozen=True)
class Failure:
    """What an obstore error says, read once for `_translate`."""

    #: What failed: ``read 'k' in az://...``.
    what: str
    #: Its message's first line.
    text: str
    #: The HTTP status, if the service answered.
    status: int | None
    #: The service's error code, if its body had one.
    code: str | None

    @property
    def http(self) -> str:
        return f"HTTP {self.status}" if self.status else "no HTTP status"

    @property
    def detail(self) -> str:
        """The code and status, for messages: ``AccessDenied (HTTP 403)``."""
        return f"{self.code} ({self.http})" if self.code else self.http


class ObstoreObjectStore(RemoteObjectStore[Any]):
    """Base of the stores on obstore (see the module docstring).

    Args:
        max_attempts: Tries per request, the first included; 1 by default, as the client
            retries in one layer of its own (requests are reported to meters once per call:
            obstore does not report its extra tries).
        connect_timeout_s: Longest connect per try.
        timeout_s: Longest try, from connecting to the end of the response body (obstore has
            one timeout for the whole request, not one per socket read).
    """

    #: Objects per listing request (for request accounting: obstore does not report pages).
    list_page_size: ClassVar[int]
    #: Error codes of the service after which the same request may succeed later.
    retryable_codes: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, max_attempts: int, connect_timeout_s: float, timeout_s: float) -> None:
        check_int("max_attempts", max_attempts, minimum=1)
        # The second timeout bounds the whole try (`_read_timeout_s` holds it).
        super().__init__(
            connect_timeout_s=connect_timeout_s, read_timeout_s=timeout_s, read_name="timeout_s"
        )
        self._max_attempts = max_attempts
        #: The bucket or container answered once (a HEAD's 404 is then a missing object).
        self._root_seen = False

    # -- client ---------------------------------------------------------------------------------

    def _build_client(
        self,
        store_class: Callable[..., Any],
        root: str,
        config: Mapping[str, str | bool | None],
        *,
        service: str,
        endpoint: str | None,
        hint: str = "",
    ) -> Any:
        """An obstore `store_class` on `root` (bucket, container) under this store's prefix,
        with `config` (None values left out), this store's timeouts, and no retries unless
        `max_attempts` > 1; an ``http://`` `endpoint` allows plain HTTP. Building sends no
        request. `S3StreamError` naming the `service` (and `hint`) if obstore refuses."""
        client_options = {
            "connect_timeout": datetime.timedelta(seconds=self._connect_timeout_s),
            "timeout": datetime.timedelta(seconds=self._read_timeout_s),
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
        }
        retry_config = {
            "max_retries": self._max_attempts - 1,
            "retry_timeout": datetime.timedelta(seconds=self._max_attempts * self._read_timeout_s),
        }
        try:
            return store_class(
                root,
                prefix=self.prefix.rstrip("/") or None,
                config={name: value for name, value in config.items() if value is not None},
                client_options=client_options,
                retry_config=retry_config,
            )
        except Exception as exc:
            raise S3StreamError(
                f"cannot configure {service} for {self.describe()}: {first_line(exc)}{hint}"
            ) from exc

    @property
    def attempt_timeout_s(self) -> float | None:
        # obstore's timeout runs from connecting to the end of the body: one try's bound.
        return self._read_timeout_s * self._max_attempts

    def _bounded_timeouts(self, seconds: float) -> tuple[float, float]:
        # The second timeout is the whole try's, connect included.
        return min(self._connect_timeout_s, seconds / 2), min(self._read_timeout_s, seconds)

    # -- what a service means -------------------------------------------------------------------

    def _translate(
        self, exc: Exception, action: str, key: str | None, failure: Failure | None = None
    ) -> S3StreamError:
        """Map an obstore exception of `action` on `key` onto the s3stream error kinds: the
        service's own meanings first (`_service_error`), then what every service means.
        `failure`: what the error says, when it is not obstore's (read from its message)."""
        if isinstance(exc, S3StreamError):
            return exc
        from obstore import exceptions as ox

        if failure is None:
            what = self._what(action, key)
            failure = Failure(what, first_line(exc), status_of(exc), code_of(exc))
        known = self._service_error(exc, action, key, failure)
        if known is not None:
            return known
        what, text, status, detail = failure.what, failure.text, failure.status, failure.detail
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
        if isinstance(exc, ox.InvalidPathError | ValueError):
            return InvalidArgumentError(f"cannot {what}: {text}")
        if status is not None:
            if status == 501:
                return not_implemented(what, f"{detail}: {text}", action)
            if failure.code in self.retryable_codes or status in (408, 429) or status >= 500:
                return UnavailableError(f"cannot {what}: {detail}: {text}")
            return S3StreamError(f"cannot {what}: {detail}: {text}")
        if looks_transient(exc):
            return UnavailableError(
                f"cannot {what}: {text} (after up to {self._max_attempts} tries)"
            )
        return S3StreamError(f"cannot {what}: {text}")

    @abc.abstractmethod
    def _service_error(
        self, exc: Exception, action: str, key: str | None, failure: Failure
    ) -> S3StreamError | None:
        """What `exc` means on this service where that is the service's own (a missing bucket
        or container, refused or denied credentials); None for the rest."""

    @abc.abstractmethod
    def _no_root(self) -> str:
        """Why a call failed when the bucket or container does not exist."""

    @abc.abstractmethod
    def _check_root_once(self, key: str) -> None:
        """After a HEAD's 404 (which has no body): raise if the bucket or container is
        missing; asks the service once per store (`_root_seen`)."""

    def _create_conflict(self, exc: Exception) -> bool:
        """Whether a conditional create that obstore reported as "already exists" was in
        truth a conflict with another write in flight, not applied (retryable)."""
        del exc
        return False

    def _create_refused_as_existing(self, exc: Exception) -> bool:
        """Whether a conditional create that obstore reported as "already exists" (any 409 or
        412) was refused because the key exists; if not, nothing was created and the error
        stands."""
        del exc
        return True

    # -- operations -----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        self._put(key, as_bytes(data), "overwrite")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        blob = as_bytes(data)
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            self._put(key, blob, "create")
        except S3StreamError as exc:
            cause = exc.__cause__
            if not isinstance(cause, AlreadyExistsError | PreconditionError):
                raise
            if self._create_conflict(cause):
                # Not applied: the retry layer above tries again, and then sees a 2xx or a
                # plain "exists".
                raise ContendedError(
                    f"cannot create {key!r} in {self.describe()}: a concurrent conditional "
                    f"write of the key was in flight ({code_of(cause) or 'HTTP 409'}); retry"
                ) from cause
            if not self._create_refused_as_existing(cause):
                raise  # e.g. Azure's 409 ContainerBeingDeleted: nothing was created
            # After a try obstore retried (only with max_attempts > 1), the object that
            # exists may be our own: read it back.
            return self._holds(key, blob) if self._max_attempts > 1 else False
        return True

    def _put(self, key: str, blob: bytes, mode: str) -> None:
        import obstore

        store = self._connected()
        self._sent(PUT_OBJECT)
        try:
            # One single-request upload (up to 5 GiB): atomic for readers, and conditional
            # (If-None-Match: *) for mode "create".
            obstore.put(store, key, blob, mode=mode, use_multipart=False)  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            # A PUT has no object to miss: only the bucket or container can be missing.
            raise S3StreamError(
                f"cannot write {key!r} in {self.describe()}: {self._no_root()}"
            ) from exc
        except Exception as exc:
            action = "create" if mode == "create" else "write"
            raise self._translate(exc, action, key) from exc

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        options: dict[str, Any] = {}
        if end is not None:
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}
        return self._get(key, options)

    def _get(self, key: str, options: dict[str, Any]) -> bytes:
        """One GET with obstore's `options` (a range); b"" for a range past the end."""
        import obstore

        store = self._connected()
        self._sent(GET_OBJECT)
        try:
            return bytes(obstore.get(store, key, options=options).bytes())  # type: ignore[arg-type]
        except Exception as exc:
            if is_past_the_end(exc):
                return b""  # the range starts at or past the end (or the object is empty)
            if "non-partial response" in str(exc) or "bytes 0--1/0" in str(exc):
                # A 200 to a ranged GET: some services (moto) answer a range of an empty
                # object so, which obstore refuses; Azurite gives a GET of an empty blob a
                # Content-Range obstore cannot parse. Any other object is an error still.
                info = self.head(key)
                if info is not None and info.size == 0:
                    return b""
            raise self._translate(exc, "read", key) from exc

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        import obstore

        store = self._connected()
        self._sent(HEAD_OBJECT)
        try:
            meta = obstore.head(store, key)
        except FileNotFoundError:
            # A HEAD's 404 has no body: a missing bucket or container looks like a missing key.
            self._check_root_once(key)
            return None
        except Exception as exc:
            raise self._translate(exc, "stat", key) from exc
        return ObjectInfo(key, int(meta["size"]))

    def _probe_root(self, key: str) -> None:
        """`_check_root_once` by listing under `key` (the page almost always empty): a list
        request answers the missing bucket or container by name."""
        if self._root_seen:
            return
        import obstore

        self._sent(LIST_OBJECTS)
        try:
            next(iter(obstore.list(self._connected(), key, chunk_size=1)), None)
        except Exception as exc:
            error = self._translate(exc, "stat", key)
            if isinstance(error, UnavailableError):
                return  # no answer: ask again at the next miss
            raise error from exc
        self._root_seen = True

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        import obstore

        # obstore lists whole path segments (``a`` lists ``a/...``, not ``a-b``): ask for the
        # directory part of the prefix and filter by string prefix. Then sort: not every
        # service lists in key order (SeaweedFS lists directory by directory), and sorting
        # costs nothing next to the listing.
        directory = prefix.rpartition("/")[0]
        found: list[ObjectInfo] = []
        count = 0
        try:
            for chunk in obstore.list(self._connected(), directory or None, chunk_size=1000):
                for meta in chunk:
                    count += 1
                    info = listed(str(meta["path"]), 0, prefix, int(meta["size"]))
                    if info is not None:
                        found.append(info)
        except Exception as exc:
            from obstore import exceptions as ox

            if isinstance(exc, ox.InvalidPathError):
                # A name under the prefix (made by another tool) that obstore cannot parse
                # fails its whole listing: no argument of the caller's was wrong.
                raise S3StreamError(
                    f"cannot {self._what('list', None)}: obstore cannot read the name of an "
                    f"object under the prefix: {first_line(exc)}"
                ) from exc
            raise self._translate(exc, "list", None) from exc
        finally:
            self._sent(LIST_OBJECTS, max(1, -(-count // self.list_page_size)))
        yield from sorted(found, key=lambda info: info.key)


def first_line(exc: BaseException) -> str:
    """The message of an obstore error without the multi-line debug dump of the Rust error
    obstore appends."""
    return str(exc).split("\n", 1)[0].strip() or type(exc).__name__


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an obstore error reports, if it got an answer."""
    found = _STATUS.search(str(exc))
    return int(found.group(1)) if found else None


def code_of(exc: BaseException) -> str | None:
    """The service's error code (``<Code>`` of its XML error body), if any."""
    found = _CODE.search(str(exc))
    return found.group(1) if found else None


def is_past_the_end(exc: BaseException) -> bool:
    """A ranged read that starts at or past the end: the service's 416, or obstore's own
    check of the range the service returned."""
    if isinstance(exc, FileNotFoundError):
        return False
    return status_of(exc) == 416 or "Wanted range starting at" in str(exc)


def looks_transient(exc: BaseException) -> bool:
    """Whether an obstore error without an HTTP answer is a failure to connect, a timeout or
    a broken-off body (worth another try), from its message."""
    from obstore import exceptions as ox

    text = first_line(exc).lower()
    return isinstance(exc, ox.GenericError | OSError) and any(
        hint in text for hint in _TRANSIENT_TEXT
    )
