"""An object store on Google Cloud Storage, through ``google-cloud-storage`` and the JSON API.

One `google.cloud.storage.Client` per store (created on first use, shared by all threads) over
one authorized HTTP session with a pool of `max_pool_connections`. Every call makes ONE try,
bounded by `connect_timeout_s` and `read_timeout_s` (the library's own retries are switched off
with ``retry=None``): transient failures (408, 429, 5xx, connection errors, timeouts) surface as
`UnavailableError`, and the client's single retry layer (`RetryingObjectStore`, see
`objectstore.stack`) retries them within the call's deadline, as for `S3ObjectStore`.

Conditional create (`put_if_absent`) is an ``objects.insert`` with ``ifGenerationMatch=0``:
Cloud Storage documents that the request then proceeds only if no live object has the name,
and fails with 412 Precondition Failed otherwise, so of concurrent creators anywhere exactly
one wins. Writes are sent as ONE ``uploadType=multipart`` request built here, whatever their
size, rather than through ``Blob.upload_from_string``: that method switches to a resumable
upload above 8 MiB, and the emulator the tests run on (fake-gcs-server) enforces
``ifGenerationMatch`` on multipart uploads only (it ignores it on ``uploadType=media`` and on
resumable uploads), so one code path, the one the tests prove, decides every create. The
metadata carries the body's CRC32C, which Cloud Storage checks before it stores the object
(the emulator computes its own instead).

Errors: a missing bucket is never a missing object (a 404 to a read, stat or delete is checked
once per store with a one-entry listing, which needs only ``storage.objects.list``); a 403 names
the IAM permission the call needs (``storage.objects.get``, ``storage.objects.create``,
``storage.objects.delete``, ``storage.objects.list``); a 401 says the credentials were refused.

`list` is in key order: Cloud Storage documents that listings are in lexicographic order of
the names, so on Google's endpoint the pages are streamed (and checked); other endpoints
(emulators) are collected and sorted.

The store pickles without its client (Spark ships it to executors, each of which builds its own
client on first use); credentials given as a `google.auth` object travel with it, others are
found again where it is unpickled.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from ..errors import InvalidArgumentError, ObjectNotFoundError, S3StreamError, UnavailableError
from ..validation import check_int, check_positive, check_text
from ._common import (
    as_bytes,
    check_endpoint,
    check_location,
    check_storage_options,
    check_suffix_length,
    listed,
    map_in_context,
    split_url,
)
from ._remote import RemoteObjectStore
from .base import ObjectInfo, check_key
from .requests import DELETE_OBJECTS, GET_OBJECT, HEAD_OBJECT, LIST_OBJECTS, PUT_OBJECT

__all__ = ["GcsObjectStore", "from_url"]

#: Google's endpoint for the JSON API (uploads go to ``/upload/storage/v1/...`` on it).
GOOGLE_ENDPOINT = "https://storage.googleapis.com"
#: OAuth scope that covers reading, writing, deleting and listing objects.
READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
#: Values of the `token` option that are not file paths.
ANONYMOUS = "anon"
DEFAULT_CHAIN = "google_default"

#: Entries per listing page (the JSON API's maximum).
_PAGE_SIZE = 1000
#: Deletes sent at once by `delete_many` (the JSON API deletes one object per request).
_DELETE_PARALLELISM = 8

#: What each action of the store needs in IAM (see docs/object-stores.md).
_PERMISSIONS = {
    "write": (
        "objects.insert needs storage.objects.create on the bucket, and storage.objects.delete "
        "to replace an object that exists"
    ),
    "create": "objects.insert needs storage.objects.create on the bucket",
    "read": "objects.get needs storage.objects.get",
    "stat": "objects.get needs storage.objects.get",
    "delete": "objects.delete needs storage.objects.delete",
    "list": "objects.list needs storage.objects.list on the bucket",
}

#: Statuses after which the same request may succeed later (the request was not applied, or
#: the service asks to slow down).
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class GcsObjectStore(RemoteObjectStore[tuple[Any, Any]]):
    """Objects under ``gs://bucket/prefix/``.

    Args:
        bucket: Bucket name.
        prefix: Name prefix inside the bucket (``/``-separated; a trailing ``/`` is implied).
        project: Google Cloud project (needed only by calls that create buckets; object calls
            work without it). None: none.
        endpoint_url: Another JSON-API endpoint (an emulator such as fake-gcs-server);
            None means Google's.
        token: Credentials: None or ``"google_default"`` for Application Default Credentials
            (``google.auth.default``: ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's file, the
            metadata server of GCE/GKE/Cloud Run); ``"anon"`` for anonymous access; the path
            of a credentials JSON file (service account, authorized user, workload identity
            federation); or a ``google.auth.credentials.Credentials`` object.
        connect_timeout_s, read_timeout_s: Socket timeouts per try.
        timeout_s: Longest one try may take in all; lowers the two above to fit, like
            `bound_attempts`. None: only the two above bound it.
        max_pool_connections: HTTP connections kept per store (bounds parallel requests).

    The store's client is the storage client and the authorized session it sends through,
    built together: uploads are sent on the same session.
    """

    scheme = "gs"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        project: str | None = None,
        endpoint_url: str | None = None,
        token: Any = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        timeout_s: float | None = None,
        max_pool_connections: int = 32,
    ) -> None:
        #: Name prefix inside the bucket, empty or ending with ``/``.
        self.prefix = check_location("bucket", bucket, prefix)
        if project is not None:
            check_text("project", project, allow_empty=False)
        check_endpoint("endpoint_url", endpoint_url)
        _check_token(token)
        check_int("max_pool_connections", max_pool_connections, minimum=1)
        super().__init__(connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        if timeout_s is not None:
            check_positive("timeout_s", timeout_s)
        self.bucket = bucket
        self.project = project
        self.endpoint_url = endpoint_url.rstrip("/") if endpoint_url else None
        self._token = token
        self._max_pool_connections = max_pool_connections
        #: The bucket was seen to exist (a 404 is then about the object).
        self._bucket_seen = False
        if timeout_s is not None:
            self.bound_attempts(timeout_s)

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> GcsObjectStore:
        """A store for ``gs://bucket/prefix`` (or ``gcs://``); `storage_options` are the
        keyword arguments of the constructor."""
        scheme, bucket, prefix = split_url(url, ("gs", "gcs"), "a gs://", "bucket")
        options = check_storage_options(
            cls,
            storage_options,
            f"{scheme}://",
            "; fsspec+gcs:// opens gcsfs instead, with gcsfs's options",
        )
        return cls(bucket, prefix, **options)

    # -- client ---------------------------------------------------------------------------------

    def _gcs(self) -> Any:
        """The `google.cloud.storage.Client`."""
        return self._connected()[0]

    def _make_client(self) -> tuple[Any, Any]:
        try:
            import requests.adapters
            from google.api_core.client_options import ClientOptions
            from google.auth.transport.requests import AuthorizedSession
            from google.cloud import storage
        except ImportError as exc:
            raise S3StreamError(
                "GcsObjectStore needs google-cloud-storage: pip install 's3stream[gcs]'"
            ) from exc
        credentials = self._credentials()
        try:
            # The token refresh (a request to Google's token endpoint or the metadata server)
            # is part of a try: bound it like the try.
            session = AuthorizedSession(  # type: ignore[no-untyped-call]
                credentials, refresh_timeout=self._connect_timeout_s + self._read_timeout_s
            )
            # One transport-level retry of a read whose pooled keep-alive connection the server
            # had closed (a reset on reuse, as fake-gcs-server does after a 416): a stale
            # socket, not a failed try. Timeouts and everything else are the retry layer's.
            stale_socket = _stale_socket_retry(
                total=1,
                connect=1,
                read=1,
                status=0,
                other=0,
                allowed_methods=frozenset({"GET", "HEAD"}),
                raise_on_status=False,
                backoff_factor=0,
            )
            adapter = requests.adapters.HTTPAdapter(
                pool_connections=self._max_pool_connections,
                pool_maxsize=self._max_pool_connections,
                max_retries=stale_socket,
            )
            session.mount("https://", adapter)
            session.mount("http://", adapter)
            options = ClientOptions(api_endpoint=self.endpoint_url) if self.endpoint_url else None
            # `_http` is the documented way to give the client a session of one's own (here:
            # a pool sized for the store's threads, and the same session as the uploads).
            client = storage.Client(
                project=self.project,
                credentials=credentials,
                client_options=options,
                _http=session,
            )
            return client, session
        except Exception as exc:
            raise S3StreamError(f"cannot create a GCS client for {self.describe()}: {exc}") from exc

    def _credentials(self) -> Any:
        import google.auth
        from google.auth import exceptions as auth_errors
        from google.auth.credentials import AnonymousCredentials

        token = self._token
        try:
            if token == ANONYMOUS:
                return AnonymousCredentials()  # type: ignore[no-untyped-call]
            if token is None or token == DEFAULT_CHAIN:
                credentials, _ = google.auth.default(scopes=[READ_WRITE_SCOPE])
                return credentials
            if isinstance(token, (str, os.PathLike)):
                credentials, _ = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
                    os.fspath(token), scopes=[READ_WRITE_SCOPE]
                )
                return credentials
            return token
        except auth_errors.DefaultCredentialsError as exc:
            raise S3StreamError(
                f"no usable Google credentials for {self.describe()}: {exc} (set "
                "GOOGLE_APPLICATION_CREDENTIALS, run 'gcloud auth application-default login', "
                "or give the storage option token: 'anon', a credentials file or a "
                "google.auth Credentials object)"
            ) from exc
        except Exception as exc:
            # google-auth raises anything on a file of an unexpected shape (a JSON list:
            # AttributeError).
            raise InvalidArgumentError(
                f"cannot load the Google credentials of token={token!r} for {self.describe()}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _timeout(self) -> tuple[float, float]:
        return (self._connect_timeout_s, self._read_timeout_s)

    def _close_client(self, client: tuple[Any, Any]) -> None:
        # Requests take their timeouts per call, but the session's token refresh timeout is
        # fixed when it is built (`bound_attempts` drops it too).
        client[0].close()  # closes the session it was given too

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"gs://{self.bucket}/{self.prefix}{where}"

    # -- operations -----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        full = self._full_key(key)
        self._insert(key, full, as_bytes(data), only_if_absent=False)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._full_key(key)
        # One try: a try that failed without an answer may have created the object; the retry
        # layer above reads it back when the next try answers 412 (see RetryingObjectStore).
        return self._insert(key, full, as_bytes(data), only_if_absent=True)

    def _insert(self, key: str, full: str, blob: bytes, *, only_if_absent: bool) -> bool:
        """One ``objects.insert`` as a multipart upload; False on 412 (the key existed)."""
        action = "create" if only_if_absent else "write"
        _, session = self._connected()
        base = self.endpoint_url or GOOGLE_ENDPOINT
        url = f"{base}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o?uploadType=multipart"
        if only_if_absent:
            # Cloud Storage documents for objects.insert (every uploadType): with
            # ifGenerationMatch=0 the request succeeds only if there is no live object of that
            # name, else 412 Precondition Failed; the check and the write are one step on the
            # service, so concurrent creators get exactly one success.
            url += "&ifGenerationMatch=0"
        metadata = {
            "name": full,
            "contentType": "application/octet-stream",
            # The service refuses the upload (400) if the bytes it got do not match.
            "crc32c": _crc32c(blob),
        }
        body, content_type = _multipart_body(metadata, blob)
        try:
            self._sent(PUT_OBJECT)
            response = session.request(
                "POST",
                url,
                data=body,
                headers={"Content-Type": content_type},
                timeout=self._timeout(),
            )
        except Exception as exc:
            raise self._translate(exc, action, key) from exc
        status = response.status_code
        if 200 <= status < 300:
            return True
        if status == 412 and only_if_absent:
            return False
        from google.api_core import exceptions as gx

        error = gx.from_http_response(response)  # type: ignore[no-untyped-call]
        if status == 404:
            raise S3StreamError(
                f"cannot {action} {key!r} in {self.describe()}: {self._no_bucket()}"
            )
        raise self._translate(error, action, key) from error

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        full = self._full_key(key)
        if start == 0 and end is None:
            return self._download(key, full, None, None)
        # Byte ranges of the JSON API, like HTTP's, name their last byte (end - 1).
        return self._download(key, full, start, None if end is None else end - 1)

    def get_suffix(self, key: str, length: int) -> bytes:
        full = self._full_key(key)
        check_suffix_length(length)
        # A negative start is a suffix range, ``Range: bytes=-length``: one request.
        return self._download(key, full, -length, None)

    def _download(self, key: str, full: str, first: int | None, last: int | None) -> bytes:
        client = self._gcs()
        blob = client.bucket(self.bucket).blob(full)
        whole = first is None and last is None
        try:
            self._sent(GET_OBJECT)
            data = blob.download_as_bytes(
                start=first,
                end=last,
                # Bytes as stored (no decompressive transcoding), checked against the stored
                # CRC32C when the whole object is read (a range has no checksum to check).
                raw_download=True,
                checksum="crc32c" if whole else None,
                timeout=self._timeout(),
                retry=None,
            )
        except Exception as exc:
            status = _status(exc)
            if status == 416:
                return b""  # the range starts at or past the end (or the object is empty)
            if status == 404:
                self._check_bucket(exc, "read", key)
                raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}") from exc
            raise self._translate(exc, "read", key) from exc
        return bytes(data)

    def head(self, key: str) -> ObjectInfo | None:
        full = self._full_key(key)
        blob = self._gcs().bucket(self.bucket).blob(full)
        try:
            self._sent(HEAD_OBJECT)
            blob.reload(projection="noAcl", timeout=self._timeout(), retry=None)
        except Exception as exc:
            if _status(exc) == 404:
                self._check_bucket(exc, "stat", key)
                return None
            raise self._translate(exc, "stat", key) from exc
        return ObjectInfo(key, int(blob.size or 0))

    def delete_many(self, keys: Iterable[str]) -> None:
        # Validate every key before deleting any; drop duplicates.
        pairs = list(dict.fromkeys((key, self._full_key(key)) for key in keys))
        if not pairs:
            return
        bucket = self._gcs().bucket(self.bucket)
        # After an outage answer no further delete is started (those in flight end within
        # one request's timeout): the call fails anyway, and deleting on against a server
        # that does not answer would take a timeout per eight keys.
        unavailable = threading.Event()

        def delete(pair: tuple[str, str]) -> S3StreamError | None:
            if unavailable.is_set():
                return None
            error = self._delete_one(bucket, *pair)
            if isinstance(error, UnavailableError):
                unavailable.set()
            return error

        if len(pairs) == 1:
            results = [delete(pairs[0])]
        else:
            # One request per object (the JSON API has no multi-object delete outside of
            # batch requests): a few at a time.
            results = map_in_context(
                delete, pairs, min(_DELETE_PARALLELISM, len(pairs)), "s3stream-gcs-delete"
            )
        failures = [f for f in results if f is not None]
        if not failures:
            return
        if len(failures) == 1:
            raise failures[0]
        shown = "; ".join(str(f) for f in failures[:3])
        more = f" and {len(failures) - 3} more" if len(failures) > 3 else ""
        message = f"could not delete {len(failures)} objects in {self.describe()}: {shown}{more}"
        if unavailable.is_set():
            message += " (the deletes not started yet were not tried)"
        if all(isinstance(f, UnavailableError) for f in failures):
            raise UnavailableError(message) from failures[0]
        raise S3StreamError(message) from failures[0]

    def _delete_one(self, bucket: Any, key: str, full: str) -> S3StreamError | None:
        """Delete one object; the error it met (a missing object is none), else None."""
        try:
            self._sent(DELETE_OBJECTS)
            bucket.blob(full).delete(timeout=self._timeout(), retry=None)
        except Exception as exc:
            if _status(exc) == 404:
                try:
                    self._check_bucket(exc, "delete", key)
                except S3StreamError as error:
                    return error
                return None
            return self._translate(exc, "delete", key)
        return None

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Google documents listings in lexicographic order of names; other endpoints
        # (emulators) promise no order.
        documented = (
            "Cloud Storage documents lexicographic order" if self.endpoint_url is None else None
        )
        yield from self._in_key_order(self._list_pages(self.prefix + prefix, prefix), documented)

    def _list_pages(self, full_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        cut = len(self.prefix)
        try:
            pages = iter(
                self._gcs()
                .list_blobs(
                    self.bucket,
                    prefix=full_prefix,
                    page_size=_PAGE_SIZE,
                    fields="items(name,size),nextPageToken",
                    timeout=self._timeout(),
                    retry=None,
                )
                .pages
            )
            while True:
                # Each page is one request (and the iterator sends none after the last).
                try:
                    page = next(pages)
                except StopIteration:
                    break
                except Exception:
                    self._sent(LIST_OBJECTS)
                    raise
                self._sent(LIST_OBJECTS)
                for entry in page:
                    info = listed(entry.name, cut, prefix, int(entry.size or 0))
                    if info is not None:
                        yield info
        except Exception as exc:
            if _status(exc) == 404:
                raise S3StreamError(f"cannot list {self.describe()}: {self._no_bucket()}") from exc
            raise self._translate(exc, "list", None) from exc

    # -- helpers --------------------------------------------------------------------------------

    def _full_key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _no_bucket(self) -> str:
        return f"bucket {self.bucket!r} does not exist (HTTP 404): create it, or fix the URL"

    def _check_bucket(self, exc: BaseException, action: str, key: str) -> None:
        """After a 404 to a call on `key`: raise `S3StreamError` if the bucket is missing, so
        that a missing bucket is never taken for a missing object. Asks the service once per
        store, with a one-entry listing (``storage.objects.list``, which the store needs
        anyway; ``buckets.get`` would need a permission roles/storage.objectUser lacks)."""
        what = f"cannot {action} {key!r} in {self.describe()}"
        if "bucket does not exist" in _message(exc).lower():
            raise S3StreamError(f"{what}: {self._no_bucket()}") from exc
        if self._bucket_seen:
            return
        try:
            self._sent(LIST_OBJECTS)
            pages = self._gcs().list_blobs(
                self.bucket,
                prefix=self.prefix,
                max_results=1,
                fields="items(name),nextPageToken",
                timeout=self._timeout(),
                retry=None,
            )
            next(iter(pages.pages), None)
        except Exception as check:
            status = _status(check)
            if status == 404:
                raise S3StreamError(f"{what}: {self._no_bucket()}") from exc
            if not status:
                raise self._translate(check, action, key) from check
            # Other answers (403 without storage.objects.list, ...) say nothing about the
            # bucket, and will not change: do not ask again.
        self._bucket_seen = True

    def _translate(self, exc: BaseException, action: str, key: str | None) -> S3StreamError:
        """Map an exception of google-cloud-storage, google-auth or requests onto the s3stream
        error kinds."""
        if isinstance(exc, S3StreamError):
            return exc
        what = self._what(action, key)
        status = _status(exc)
        if status:
            detail = f"HTTP {status}: {_message(exc)}"
            if status == 403:
                return S3StreamError(
                    f"cannot {what}: access denied ({detail}); {_PERMISSIONS[action]} (check "
                    "the credentials' IAM roles on the bucket, e.g. roles/storage.objectUser)"
                )
            if status == 401:
                return S3StreamError(
                    f"cannot {what}: the credentials were refused ({detail}): check the token "
                    "storage option or Application Default Credentials"
                )
            if status in _TRANSIENT_STATUSES or status >= 500:
                return UnavailableError(f"cannot {what}: {detail}")
            return S3StreamError(f"cannot {what}: {detail}")
        if _is_transient(exc):
            return UnavailableError(f"cannot {what}: {type(exc).__name__}: {exc}")
        from google.auth import exceptions as auth_errors

        if isinstance(exc, auth_errors.GoogleAuthError):
            # E.g. a 401 answered to anonymous credentials, which cannot be refreshed.
            return S3StreamError(
                f"cannot {what}: the credentials were refused or cannot be refreshed "
                f"({type(exc).__name__}: {exc}): check the token storage option or Application "
                "Default Credentials"
            )
        return S3StreamError(f"cannot {what}: {type(exc).__name__}: {exc}")


def from_url(url: str, **storage_options: Any) -> GcsObjectStore:
    """Registry factory for ``gs://`` and ``gcs://`` URLs."""
    return GcsObjectStore.from_url(url, **storage_options)


def _check_token(token: object) -> None:
    if token is None or token in (ANONYMOUS, DEFAULT_CHAIN):
        return
    if isinstance(token, (str, os.PathLike)):
        if not os.path.isfile(token):
            raise InvalidArgumentError(
                f"token must be 'anon', 'google_default', the path of a credentials JSON file "
                f"or a google.auth Credentials object; no file {os.fspath(token)!r}"
            )
        return
    try:
        from google.auth.credentials import Credentials
    except ImportError as exc:  # pragma: no cover - only without the gcs extra
        raise S3StreamError(
            "GcsObjectStore needs google-cloud-storage: pip install 's3stream[gcs]'"
        ) from exc
    if not isinstance(token, Credentials):
        raise InvalidArgumentError(
            "token must be 'anon', 'google_default', the path of a credentials JSON file or a "
            f"google.auth Credentials object, got {type(token).__name__}"
        )


def _crc32c(data: bytes) -> str:
    """The base64 of the big-endian CRC32C of `data`, as the JSON API's ``crc32c`` field."""
    import google_crc32c

    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode("ascii")


def _multipart_body(metadata: Mapping[str, str], data: bytes) -> tuple[bytes, str]:
    """A ``multipart/related`` body of the object's metadata and bytes, and its content type.

    The boundary may not occur in the data: it is derived from the data's digest (no
    randomness needed), with a counter in the practically impossible case that it does."""
    digest = hashlib.sha256(data).hexdigest()[:32]
    boundary = next(
        b
        for b in (f"s3stream-{digest}-{n}".encode("ascii") for n in itertools.count())
        if b not in data
    )
    body = b"".join(
        (
            b"--" + boundary + b"\r\n",
            b"Content-Type: application/json; charset=UTF-8\r\n\r\n",
            json.dumps(metadata).encode("utf-8"),
            b"\r\n--" + boundary + b"\r\n",
            b"Content-Type: application/octet-stream\r\n\r\n",
            data,
            b"\r\n--" + boundary + b"--\r\n",
        )
    )
    return body, f'multipart/related; boundary="{boundary.decode("ascii")}"'


def _status(exc: BaseException) -> int:
    """The HTTP status of an error the service answered with; 0 for other errors."""
    from google.api_core import exceptions as gx

    if isinstance(exc, gx.GoogleAPICallError):
        return int(exc.code or 0)
    return 0


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return str(message if message else exc).strip()


def _is_transient(exc: BaseException) -> bool:
    import requests
    from google.auth import exceptions as auth_errors

    if isinstance(exc, requests.exceptions.SSLError):
        return False
    if isinstance(exc, auth_errors.RefreshError):
        # A token endpoint that refused the credentials is not transient; one that was
        # unreachable or overloaded says so.
        return bool(getattr(exc, "retryable", False))
    if type(exc).__name__ == "DataCorruption":
        return True  # the bytes were damaged in transit: reading again can succeed
    return isinstance(
        exc,
        (
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
            auth_errors.TransportError,
            ConnectionError,
            TimeoutError,
        ),
    )


def _stale_socket_retry(**options: Any) -> Any:
    """urllib3's `Retry` with `options`, except that a timeout is never retried: one try per
    call keeps every call within its deadline (the retry layer above decides about retrying).
    urllib3 is imported only when a GCS client is built."""
    from urllib3.exceptions import (
        ConnectTimeoutError,
        MaxRetryError,
        NewConnectionError,
        ReadTimeoutError,
    )
    from urllib3.util.retry import Retry

    class StaleSocketRetry(Retry):
        def increment(self, *args: Any, **kwargs: Any) -> Retry:  # type: ignore[override]
            error = kwargs.get("error")
            timed_out = isinstance(error, ReadTimeoutError) or (
                isinstance(error, ConnectTimeoutError)
                and not isinstance(error, NewConnectionError)  # a refusal, not a timeout
            )
            if timed_out:
                # Spent, as urllib3 says when retries run out (requests maps it as usual).
                url = args[1] if len(args) > 1 else kwargs.get("url")
                pool: Any = kwargs.get("_pool")
                raise MaxRetryError(pool, url, error) from error
            return super().increment(*args, **kwargs)

    return StaleSocketRetry(**options)
