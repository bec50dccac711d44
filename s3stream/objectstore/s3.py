"""An object store on Amazon S3 or any S3-compatible service, through boto3.

One boto3 client per store (created on first use, thread-safe, with a connection pool of
`max_pool_connections`) serves every thread. By default each call makes ONE try, bounded by
`connect_timeout_s` and `read_timeout_s`: transient failures (5xx, 503 SlowDown, throttling,
409 ConditionalRequestConflict, connection errors, timeouts) surface as `UnavailableError`, and
the client's single retry layer (`RetryingObjectStore`, see `objectstore.stack`) retries them
within the call's deadline. The store has no retry loop of its own: stacking botocore's retries
under that layer multiplied the tries and the time a call could take against a frozen server.
`max_attempts` > 1 turns botocore's "standard" retries back on for direct users without a retry
layer (botocore does not retry a 409, and reading a response body is then retried too).

Errors follow AWS's documented answers, not one server's:

* a missing bucket is never a missing object: ``NoSuchBucket`` (404) on any call, and a
  bodiless 404 to a HEAD checked once with ``HeadBucket``, raise `S3StreamError` naming the
  bucket;
* a 403 names the permission the call needs (``s3:GetObject`` for GET and HEAD, ...), and for
  HEAD and GET that S3 answers 403, not 404, for a missing key when the caller lacks
  ``s3:ListBucket``;
* an endpoint that answers HTTP but not S3 (a 404 without an S3 error code, e.g. a web server
  at the wrong port) is reported as such, not as a missing object.

Conditional create (`put_if_absent`) is ``PutObject`` with ``If-None-Match: *`` (botocore >=
1.35.2): S3 answers 412 PreconditionFailed when the key exists, so of concurrent creators
exactly one wins, and 409 ConditionalRequestConflict to a create that raced another conditional
write of the key in flight (retryable: it was not applied).

`list` is in key order on every path: AWS documents that general purpose buckets list in
ascending UTF-8 order, so their pages are streamed (and checked); directory buckets (S3 Express
One Zone, names ending ``--x-s3``) and other services (SeaweedFS lists directory by directory)
are collected and sorted.

The store pickles without its client (Spark ships it to executors, each of which builds its own
client on first use).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from ..clock import Clock, SystemClock
from ..errors import (
    ContendedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ..validation import check_instance, check_int
from ._common import (
    as_bytes,
    check_endpoint,
    check_location,
    check_storage_options,
    check_suffix_length,
    delete_batches,
    listed,
    not_implemented,
    split_url,
)
from ._remote import RemoteObjectStore
from .base import ObjectInfo, check_key
from .requests import (
    DELETE_OBJECTS,
    GET_OBJECT,
    HEAD_BUCKET,
    HEAD_OBJECT,
    LIST_OBJECTS,
    PUT_OBJECT,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3ObjectStore", "from_url", "s3fs_options"]

T = TypeVar("T")

#: Most keys one DeleteObjects request may carry.
DELETE_BATCH = 1000

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "403",
    }
)
#: A GET's body is read in pieces, each checked against the try's time (`_read_body`): the
#: first this large, the next ones sized by the pace so far, at least `_BODY_MIN_PIECE`.
_BODY_FIRST_PIECE = 1 << 16
_BODY_MIN_PIECE = 1 << 14

_RETRYABLE_CODES = frozenset(
    {
        "BandwidthLimitExceeded",
        # 409: a concurrent conditional write of the same key was in flight; AWS asks the
        # client to retry (the request was not applied).
        "ConditionalRequestConflict",
        "InternalError",
        "OperationAborted",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
    }
)
# Denials of a call by policy (a HEAD's 403 has no body: its code is the status), as opposed to
# credentials that are wrong or expired.
_POLICY_DENIED_CODES = frozenset({"AccessDenied", "403", "Forbidden"})

#: What each action of the store needs in an IAM policy (see docs/object-stores.md).
_PERMISSIONS = {
    "write": "PutObject needs s3:PutObject on the key",
    "create": "PutObject needs s3:PutObject on the key",
    "read": (
        "GetObject needs s3:GetObject on the key; S3 also answers 403 instead of 404 for a "
        "key that does not exist when the caller lacks s3:ListBucket on the bucket"
    ),
    "stat": (
        "HeadObject needs s3:GetObject on the key; S3 also answers 403 instead of 404 for a "
        "key that does not exist when the caller lacks s3:ListBucket on the bucket"
    ),
    "delete": "DeleteObjects needs s3:DeleteObject on the keys",
    "list": "ListObjectsV2 needs s3:ListBucket on the bucket",
}

#: Names of directory buckets (S3 Express One Zone) end with this; they do not list in order.
DIRECTORY_BUCKET_SUFFIX = "--x-s3"
#: Hosts of AWS's own S3 endpoints (general purpose buckets there list in key order).
_AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn")

# storage_options accepted by `from_url`, including the names s3fs users already know.
_OPTION_ALIASES = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "endpoint": "endpoint_url",
    "region": "region_name",
    "profile": "profile_name",
}


class S3ObjectStore(RemoteObjectStore["S3Client"]):
    """Objects under ``s3://bucket/prefix/``.

    Args:
        bucket: Bucket name.
        prefix: Key prefix inside the bucket (``/``-separated; a trailing ``/`` is implied).
        endpoint_url: For S3-compatible services (SeaweedFS, MinIO, ...); None means AWS.
        region_name: AWS region; defaults to ``us-east-1`` when `endpoint_url` is given,
            else to boto3's configuration.
        aws_access_key_id, aws_secret_access_key, aws_session_token, profile_name:
            Credentials; None falls back to boto3's chain (environment, config files, roles).
        addressing_style: ``"path"`` or ``"virtual"``; defaults to ``"path"`` when
            `endpoint_url` is given (S3-compatible services rarely have bucket DNS names).
        max_pool_connections: HTTP connections kept per store (bounds parallel requests).
        max_attempts: Tries per request, first one included (botocore "standard" mode); 1
            by default, as the client retries in one layer of its own.
        connect_timeout_s, read_timeout_s: Socket timeouts per try.
        clock, rng: Sleep and jitter between re-reads of a broken-off response body (only
            with `max_attempts` > 1).
        client: A ready boto3 S3 client to use instead of building one; it is not pickled.
    """

    scheme = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile_name: str | None = None,
        addressing_style: str | None = None,
        max_pool_connections: int = 32,
        max_attempts: int = 1,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        client: S3Client | None = None,
    ) -> None:
        #: Key prefix inside the bucket, empty or ending with ``/``.
        self.prefix = check_location("bucket", bucket, prefix)
        check_int("max_pool_connections", max_pool_connections, minimum=1)
        check_int("max_attempts", max_attempts, minimum=1)
        super().__init__(connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        #: This thread's count of tries sent for the request it is making (botocore retries
        #: in the calling thread).
        self._tries = threading.local()
        check_endpoint("endpoint_url", endpoint_url)
        if addressing_style not in (None, "path", "virtual", "auto"):
            raise InvalidArgumentError(
                f"addressing_style must be 'path', 'virtual' or 'auto', got {addressing_style!r}"
            )
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region_name = region_name or ("us-east-1" if endpoint_url else None)
        self._credentials = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        self._profile_name = profile_name
        self._addressing_style = addressing_style or ("path" if endpoint_url else "auto")
        self._max_pool_connections = max_pool_connections
        self._max_attempts = max_attempts
        # Objects, not settings: given as text (`-o client=obstore`, a mix-up with the WAL
        # URL's `?client=`) they failed later with an AttributeError.
        check_instance("clock", clock, Clock, allow_none=True)
        check_instance("rng", rng, random.Random, allow_none=True)
        if isinstance(client, str | bytes | int | float):
            raise InvalidArgumentError(
                f"client must be a boto3 S3 client, not {type(client).__name__} (the S3 WAL's "
                "client is chosen with its URL's ?client=)"
            )
        self._clock = clock if clock is not None else SystemClock()
        # Jitter only spreads retries; a fixed default seed keeps runs reproducible.
        self._rng = rng if rng is not None else random.Random(0)
        self._client = client
        self._client_given = client is not None
        #: The bucket answered a HEAD once (a missing key is then just a missing key).
        self._bucket_seen = False
        #: Whether the bucket lists in key order (decided on the first `list`).
        self._ordered_listing: bool | None = None

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> S3ObjectStore:
        """A store for ``s3://bucket/prefix`` (or ``s3a://``).

        `storage_options` are the keyword arguments of the constructor; the s3fs names
        ``key``, ``secret``, ``token``, ``endpoint``, ``region``, ``profile`` and
        ``client_kwargs={"endpoint_url": ..., "region_name": ...}`` are accepted too.
        """
        _, bucket, prefix = split_url(url, ("s3", "s3a"), "an s3://", "bucket")
        options = check_storage_options(cls, s3fs_options(storage_options), "s3://")
        return cls(bucket, prefix, **options)

    # -- client ---------------------------------------------------------------------------------

    def _s3(self) -> S3Client:
        return self._connected()

    def _make_client(self) -> S3Client:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise S3StreamError("S3ObjectStore needs boto3: pip install 's3stream[s3]'") from exc
        access_key, secret_key, token = self._credentials
        config = Config(
            max_pool_connections=self._max_pool_connections,
            retries={"mode": "standard", "total_max_attempts": self._max_attempts},
            connect_timeout=self._connect_timeout_s,
            read_timeout=self._read_timeout_s,
            s3={"addressing_style": self._addressing_style},  # type: ignore[arg-type]
            user_agent_extra="s3stream",
        )
        if "request_checksum_calculation" in Config.OPTION_DEFAULTS:
            # botocore >= 1.36 by default adds a CRC32 to every PutObject and validates the
            # CRC of every whole-object GetObject in Python ("when_supported"). s3stream does
            # not rely on them: its objects carry crc32c checks of their own, verified on every
            # read (WAL records, data blocks with their index and footer, metadata log frames;
            # the few small JSON markers fail to parse when damaged); and in transit a PUT
            # without a checksum has its body's SHA-256 signed by SigV4 (instead of an unsigned
            # aws-chunked body with a CRC32 trailer on HTTPS), which S3 verifies. Skipping them
            # lifted 8 MiB GETs by 15-30% (bench/object_client_bench.py) and spares
            # S3-compatible services that refuse aws-chunked uploads. Checksums an API requires
            # (DeleteObjects') stay. botocore < 1.36 has neither setting nor those defaults.
            config = config.merge(
                Config(
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                )
            )
        try:
            # A private session: boto3's default session is not safe to share between threads.
            session = boto3.session.Session(
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=token,
                region_name=self.region_name,
                profile_name=self._profile_name,
            )
            client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        except Exception as exc:
            raise S3StreamError(f"cannot create an S3 client for {self.describe()}: {exc}") from exc
        # Every try botocore sends, its own retries included (a connection error carries no
        # RetryAttempts to count them by).
        client.meta.events.register("before-send.s3", self._count_try)
        return client

    def _count_try(self, **_: Any) -> None:
        self._tries.n = getattr(self._tries, "n", 0) + 1

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_tries"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._tries = threading.local()

    def _close_client(self, client: S3Client) -> None:
        client.close()

    def _report(self, request: str, outcome: object) -> None:
        """Report one request and the tries botocore added to it (`max_attempts` > 1): as
        many as were sent, else as its answer or its error says."""
        tries = self._tries
        sent, tries.n = getattr(tries, "n", 0), 0
        if self._meters:
            if sent:
                count = sent
            elif isinstance(outcome, BaseException):
                count = 1 + _error_details(outcome)[2]
            else:
                count = 1 + _retry_attempts(outcome)
            self._sent(request, count)

    def _send(self, request: str, fn: Callable[[], T]) -> T:
        """Send one request (`fn`, a boto3 call) and report it."""
        self._tries.n = 0
        try:
            response = fn()
        except Exception as exc:
            self._report(request, exc)
            raise
        self._report(request, response)
        return response

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    # -- operations -----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        full = self._full_key(key)
        blob = as_bytes(data)
        client = self._s3()
        self._call(
            "write",
            key,
            lambda: self._send(
                PUT_OBJECT, lambda: client.put_object(Bucket=self.bucket, Key=full, Body=blob)
            ),
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._full_key(key)
        blob = as_bytes(data)
        client = self._s3()
        try:
            self._send(
                PUT_OBJECT,
                lambda: client.put_object(Bucket=self.bucket, Key=full, Body=blob, IfNoneMatch="*"),
            )
            return True
        except Exception as exc:
            code, status, retries = _error_details(exc)
            if status == 412 or code == "PreconditionFailed":
                # After a try botocore retried (a 5xx or timeout, only with max_attempts > 1),
                # the object that exists may be our own: read it back.
                return self._holds(key, blob) if retries > 0 else False
            if code == "ConditionalRequestConflict" or status == 409:
                # Contention, not an outage: the retry layer above tries again soon, and then
                # sees 200 or 412.
                raise ContendedError(
                    f"cannot create {key!r} in {self.describe()}: a concurrent conditional "
                    f"write of the key was in flight ({code or 'HTTP 409'}); retry"
                ) from exc
            raise self._translate(exc, "create", key) from exc

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        full = self._full_key(key)
        if start == 0 and end is None:
            return self._get_object(key, full, None)
        last = "" if end is None else str(end - 1)
        return self._get_object(key, full, f"bytes={start}-{last}", slice(start, end))

    def get_suffix(self, key: str, length: int) -> bytes:
        full = self._full_key(key)
        check_suffix_length(length)
        return self._get_object(key, full, f"bytes=-{length}", slice(-length, None))

    def _get_object(
        self, key: str, full: str, byte_range: str | None, part: slice | None = None
    ) -> bytes:
        """The object's bytes, or the `byte_range` of them (`part`: the same range as a slice
        of the whole, for a server that ignores Range and answers with everything)."""
        client = self._s3()
        extra = {"Range": byte_range} if byte_range else {}
        for attempt in range(self._max_attempts):
            started = self._clock.monotonic()
            try:
                response = self._send(
                    GET_OBJECT,
                    lambda: client.get_object(Bucket=self.bucket, Key=full, **extra),  # type: ignore[arg-type]
                )
            except Exception as exc:
                code, status, _ = _error_details(exc)
                if status == 416 or code == "InvalidRange":
                    return b""  # the range starts at or past the end (or the object is empty)
                raise self._translate(exc, "read", key) from exc
            body = response["Body"]
            try:
                data = self._read_body(body, key, started)
                if part is not None and not response.get("ContentRange"):
                    # 200 with the whole object (a proxy or service that ignores Range):
                    # the range is cut here, so a ranged read never returns other bytes.
                    data = data[part]
                return data
            except Exception as exc:
                # The headers arrived but the body broke off; botocore does not retry that.
                if not _is_transient(exc) or attempt + 1 >= self._max_attempts:
                    raise self._translate(exc, "read", key) from exc
            finally:
                body.close()
            self._backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_body(self, body: Any, key: str, started: float) -> bytes:
        """A response body, read within one try's time from `started` (connect plus read
        timeout): botocore's read timeout bounds each socket read, not the body, so a slow
        but live link would hold a call for as long as the body takes. The first piece
        measures the link; each next one is sized to take at most half the time left at that
        pace (on a fast link: the rest at once)."""
        budget = self._connect_timeout_s + self._read_timeout_s
        clock = self._clock
        limit = started + budget
        chunks = []
        size = _BODY_FIRST_PIECE
        got = 0
        began = clock.monotonic()
        while chunk := body.read(size):
            chunks.append(chunk)
            got += len(chunk)
            now = clock.monotonic()
            if now > limit:
                raise UnavailableError(
                    f"cannot read {key!r} in {self.describe()}: the body did not arrive "
                    f"within {budget:g} s (a slow link)"
                )
            pace = got / max(now - began, 1e-6)
            size = max(_BODY_MIN_PIECE, int(pace * (limit - now) / 2))
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def head(self, key: str) -> ObjectInfo | None:
        full = self._full_key(key)
        client = self._s3()
        try:
            response = self._send(
                HEAD_OBJECT, lambda: client.head_object(Bucket=self.bucket, Key=full)
            )
        except Exception as exc:
            code, status, _ = _error_details(exc)
            if status == 404 and code != "NoSuchBucket" and _speaks_s3(exc):
                # A HEAD answer has no body, so a missing bucket looks like a missing key:
                # ask once per store whether the bucket is there.
                self._check_bucket_once(client, key)
                return None
            raise self._translate(exc, "stat", key) from exc
        return ObjectInfo(key, int(response["ContentLength"]))

    def _check_bucket_once(self, client: S3Client, key: str) -> None:
        if self._bucket_seen:
            return
        try:
            self._send(HEAD_BUCKET, lambda: client.head_bucket(Bucket=self.bucket))
        except Exception as exc:
            _, status, _ = _error_details(exc)
            if status == 404:
                raise S3StreamError(
                    f"cannot stat {key!r} in {self.describe()}: {_no_bucket(self.bucket)}"
                ) from exc
            if not status:
                return  # no answer (a timeout): ask again at the next miss
            # Other answers (403 without s3:ListBucket, ...) say nothing about the key, and
            # will not change: do not ask again.
        self._bucket_seen = True

    def delete_many(self, keys: Iterable[str]) -> None:
        batches = delete_batches(keys, DELETE_BATCH, self.prefix)
        client = self._s3()
        failures: list[tuple[str, str]] = []
        for batch in batches:
            request = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
            response = self._call(
                "delete",
                batch[0],
                lambda request=request: self._send(  # type: ignore[misc]
                    DELETE_OBJECTS,
                    lambda: client.delete_objects(Bucket=self.bucket, Delete=request),
                ),
            )
            for error in response.get("Errors", []):
                code = str(error.get("Code", "?"))
                if code not in _NOT_FOUND_CODES:
                    failures.append((str(error.get("Key", "?")), code))
        if failures:
            shown = ", ".join(f"{k!r} ({c})" for k, c in failures[:5])
            more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
            message = (
                f"could not delete {len(failures)} objects in {self.describe()}: {shown}{more}"
            )
            if all(code in _RETRYABLE_CODES for _, code in failures):
                raise UnavailableError(message)
            raise S3StreamError(message)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # AWS documents UTF-8 byte order, which is code point order, which is key order, for
        # general purpose buckets; directory buckets list in no documented order, and some
        # S3-compatible services (SeaweedFS) directory by directory ("a/b" before "a-c").
        documented = (
            "AWS documents key order for general purpose buckets"
            if self._lists_in_key_order()
            else None
        )
        yield from self._in_key_order(self._list_pages(prefix), documented)

    def _lists_in_key_order(self) -> bool:
        """Whether the bucket's listings come in key order: AWS documents it for general
        purpose buckets on its own endpoints, and not for directory buckets."""
        ordered = self._ordered_listing
        if ordered is None:
            endpoint = self.endpoint_url or getattr(self._s3().meta, "endpoint_url", None)
            host = (urlsplit(endpoint).hostname or "") if isinstance(endpoint, str) else ""
            ordered = host.endswith(_AWS_HOSTS) and not self.bucket.endswith(
                DIRECTORY_BUCKET_SUFFIX
            )
            self._ordered_listing = ordered
        return ordered

    def _list_pages(self, prefix: str) -> Iterator[ObjectInfo]:
        client = self._s3()
        cut = len(self.prefix)
        try:
            paginator = client.get_paginator("list_objects_v2")
            pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix))
            while True:
                # Each page is one request.
                self._tries.n = 0
                try:
                    page = next(pages)
                except StopIteration:
                    break
                except Exception as exc:
                    self._report(LIST_OBJECTS, exc)
                    raise
                self._report(LIST_OBJECTS, page)
                for entry in page.get("Contents", []):
                    info = listed(entry["Key"], cut, prefix, int(entry["Size"]))
                    if info is not None:
                        yield info
        except Exception as exc:
            raise self._translate(exc, "list", None) from exc

    # -- helpers --------------------------------------------------------------------------------

    def _full_key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _call(self, action: str, key: str | None, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:
            raise self._translate(exc, action, key) from exc

    def _backoff(self, attempt: int) -> None:
        cap = min(2.0, 0.05 * (2**attempt))
        self._clock.sleep(self._rng.uniform(0, cap))

    def _translate(self, exc: Exception, action: str, key: str | None) -> S3StreamError:
        """Map a boto3/botocore exception onto the s3stream error kinds."""
        if isinstance(exc, S3StreamError):
            return exc
        from botocore import exceptions as bx

        what = self._what(action, key)
        if isinstance(exc, bx.ClientError):
            code, status, retries = _error_details(exc)
            message = exc.response.get("Error", {}).get("Message", "")
            detail = f"{code} (HTTP {status}){': ' + message if message else ''}"
            if code == "NoSuchBucket":
                return S3StreamError(f"cannot {what}: {_no_bucket(self.bucket)}")
            if code == "InvalidBucketName":
                return S3StreamError(f"cannot {what}: invalid bucket name {self.bucket!r}")
            speaks_s3 = _speaks_s3(exc)
            if code == "NoSuchKey" or (speaks_s3 and (code in _NOT_FOUND_CODES or status == 404)):
                return ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
            if not speaks_s3 and status in (404, 405, 501):
                # Not a missing object: a server that knows no S3 (a 502/503 page of a proxy
                # in front of real S3 stays a transient error below).
                return S3StreamError(
                    f"cannot {what}: the endpoint did not answer like S3 ({detail}, no S3 "
                    "error code or request id): check endpoint_url (is it an S3 server, on "
                    "the right port?)"
                )
            if code in _DENIED_CODES or status == 403:
                need = _PERMISSIONS.get(action) if code in _POLICY_DENIED_CODES else None
                hint = f"; {need}" if need else ""
                return S3StreamError(
                    f"cannot {what}: access denied, {detail}{hint} (check the credentials, "
                    "their IAM policy and the bucket policy)"
                )
            if status == 501 or code == "NotImplemented":
                return not_implemented(what, detail, action)
            if code in _RETRYABLE_CODES or status >= 500 or status == 429:
                return UnavailableError(f"cannot {what}: {detail} after {retries + 1} tries")
            return S3StreamError(f"cannot {what}: {detail}")
        if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
            return S3StreamError(f"cannot {what}: no usable AWS credentials ({exc})")
        if isinstance(exc, bx.ParamValidationError):
            return InvalidArgumentError(f"cannot {what}: {exc}")
        if isinstance(exc, bx.SSLError):
            return S3StreamError(f"cannot {what}: TLS failed ({exc})")
        if _is_transient(exc):
            return UnavailableError(
                f"cannot {what}: {exc} (after up to {self._max_attempts} tries)"
            )
        return S3StreamError(f"cannot {what}: {exc}")


def from_url(url: str, **storage_options: Any) -> S3ObjectStore:
    """Registry factory for ``s3://`` and ``s3a://`` URLs."""
    return S3ObjectStore.from_url(url, **storage_options)


def s3fs_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`storage_options` with the s3fs names (`_OPTION_ALIASES`, and ``client_kwargs``'s
    ``endpoint_url`` and ``region_name``) as the keyword arguments of the S3 stores'
    constructors; other names as they are."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name == "client_kwargs":
            if not isinstance(value, Mapping):
                raise InvalidArgumentError(
                    f"storage option client_kwargs must be a mapping, got {value!r}"
                )
            for inner, inner_value in value.items():
                if inner not in ("endpoint_url", "region_name"):
                    raise InvalidArgumentError(f"unsupported client_kwargs entry {inner!r}")
                out[inner] = inner_value
            continue
        out[_OPTION_ALIASES.get(name, name)] = value
    return out


def _no_bucket(bucket: str) -> str:
    return f"bucket {bucket!r} does not exist (NoSuchBucket): create it, or fix the URL"


def _error_details(exc: BaseException) -> tuple[str, int, int]:
    """(error code, HTTP status, retries botocore made) of a ClientError; ("", 0, 0) else."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0, 0
    error = response.get("Error", {})
    meta = response.get("ResponseMetadata", {})
    code = str(error.get("Code", ""))
    status = int(meta.get("HTTPStatusCode") or 0)
    if not status and code.isdigit():
        status = int(code)
    return code, status, int(meta.get("RetryAttempts") or 0)


def _retry_attempts(response: object) -> int:
    """Retries botocore made before a successful answer."""
    meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
    return int(meta.get("RetryAttempts") or 0) if isinstance(meta, dict) else 0


def _speaks_s3(exc: BaseException) -> bool:
    """Whether an error response came from an S3 server: AWS documents that every response
    carries ``x-amz-request-id``, and error bodies an S3 error code; a web server that is not
    S3 sends neither (its 404 page parses to the bare status as the code)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
    if any(h.lower() in _REQUEST_ID_HEADERS for h in headers):
        return True
    code = str(response.get("Error", {}).get("Code", ""))
    return bool(code) and not code.isdigit() and code not in _HTTP_REASON_CODES


#: Request-id headers of AWS APIs: S3's own, and the one of AWS's other APIs, which AWS API
#: models (moto) also send for S3. A web server that is not S3 sends none of them.
_REQUEST_ID_HEADERS = frozenset({"x-amz-request-id", "x-amz-id-2", "x-amzn-requestid"})

#: Codes botocore makes up from a bare HTTP status line when the body has no S3 error.
_HTTP_REASON_CODES = frozenset({"NotFound", "Not Found", "BadRequest", "Forbidden"})


def _is_transient(exc: BaseException) -> bool:
    from botocore import exceptions as bx

    if isinstance(exc, bx.SSLError):
        return False
    return isinstance(
        exc,
        (
            bx.ConnectionError,
            bx.HTTPClientError,
            bx.IncompleteReadError,
            OSError,
        ),
    )
