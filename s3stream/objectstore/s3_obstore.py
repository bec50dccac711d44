"""An object store on Amazon S3 or any S3-compatible service, through obstore (Rust
``object_store``, GIL-free) instead of boto3: the S3 WAL's client by default (docs/s3-wal.md).

Why a second S3 store: a 1 KiB PUT costs about half the time through obstore as through boto3
on the same server (bench/object_client_bench.py: p50 ~1.0 ms against ~2.1 ms, with botocore's
optional checksums off as well), and the S3 WAL's latency is one small PUT. `S3ObjectStore`
(boto3) stays the data store's client: it knows profiles, the whole botocore credential chain,
directory buckets and streamed ordered listings, which large reads and writes do not need
obstore for.

Same contract and AWS semantics as `S3ObjectStore` (see there), through
`ObstoreObjectStore`:

* conditional create (`put_if_absent`) is ``PutObject`` with ``If-None-Match: *`` (obstore's
  ``mode="create"``): 412 PreconditionFailed means the key exists (False); 409
  ConditionalRequestConflict (a create that raced another conditional write in flight, not
  applied) raises `UnavailableError`, retried by the client's retry layer;
* a missing bucket is never a missing object: ``NoSuchBucket`` on any call, a PUT's 404, and a
  HEAD's bodiless 404 after one listing per store raise `S3StreamError` naming the bucket;
* a 403 names the permission the call needs;
* `list` is in key order (collected and sorted: obstore lists by path segment, and
  S3-compatible services need not list in order);
* each call makes ONE try by default (obstore's retries off), bounded by `connect_timeout_s`
  and `read_timeout_s` (obstore's timeout for the whole try, connect and body included).

Credentials: the keys given, else obstore's chain (``AWS_*`` environment variables, web
identity, ECS and EC2 instance metadata); AWS config-file profiles are not read (use
`S3ObjectStore` for ``profile_name``). The store pickles without its client.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, S3StreamError
from ._common import (
    check_endpoint,
    check_location,
    check_optional_text,
    check_storage_options,
    check_suffix_length,
    delete_batches,
    split_url,
)
from ._obstore import Failure, ObstoreObjectStore, code_of, status_of
from .base import check_key
from .requests import DELETE_OBJECTS
from .s3 import _PERMISSIONS, _RETRYABLE_CODES, DELETE_BATCH, _no_bucket, s3fs_options

if TYPE_CHECKING:
    from obstore.store import S3Store

__all__ = ["ObstoreS3ObjectStore", "from_url"]

#: Codes that mean the credentials themselves are wrong or expired, not a policy's denial.
_CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
)

#: `S3ObjectStore` storage options this store cannot honour, and what to do instead.
_UNSUPPORTED = {
    "profile_name": "obstore reads no AWS config-file profiles: give the keys, or use the "
    "environment's credentials",
    "client": "a boto3 client cannot drive obstore",
    "max_pool_connections": "obstore pools connections on its own, without a cap",
    "clock": "obstore retries on its own clock",
    "rng": "obstore retries on its own clock",
}


class ObstoreS3ObjectStore(ObstoreObjectStore):
    """Objects under ``s3://bucket/prefix/``, through obstore.

    Args:
        bucket: Bucket name.
        prefix: Key prefix inside the bucket (``/``-separated; a trailing ``/`` is implied).
        endpoint_url: For S3-compatible services (SeaweedFS, MinIO, ...); None means AWS.
            An ``http://`` endpoint allows plain HTTP.
        region_name: AWS region; defaults to ``us-east-1`` when `endpoint_url` is given, else
            to obstore's (``AWS_REGION``/``AWS_DEFAULT_REGION``, then ``us-east-1``).
        aws_access_key_id, aws_secret_access_key, aws_session_token: Credentials; None falls
            back to obstore's chain (see the module docstring).
        addressing_style: ``"path"`` or ``"virtual"``; defaults to ``"path"`` when
            `endpoint_url` is given, else to ``"virtual"`` (``"auto"`` means the default).
        max_attempts, connect_timeout_s: As for `ObstoreObjectStore`.
        read_timeout_s: `ObstoreObjectStore`'s `timeout_s`: the longest try, from connecting
            to the end of the response body.
    """

    scheme = "s3"
    #: Keys per ListObjectsV2 page (AWS's maximum).
    list_page_size = 1000
    retryable_codes = _RETRYABLE_CODES

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
        addressing_style: str | None = None,
        max_attempts: int = 1,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
    ) -> None:
        #: Key prefix inside the bucket, empty or ending with ``/``.
        self.prefix = check_location("bucket", bucket, prefix)
        check_optional_text(
            region_name=region_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
        )
        check_endpoint("endpoint_url", endpoint_url)
        if endpoint_url is None:
            # botocore's variables, read here as boto3 reads them for `S3ObjectStore`, so that
            # both clients of one client reach the same service (and an http:// one is allowed).
            endpoint_url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
                "AWS_ENDPOINT_URL"
            )
            check_endpoint("AWS_ENDPOINT_URL", endpoint_url)
        if addressing_style not in (None, "path", "virtual", "auto"):
            raise InvalidArgumentError(
                f"addressing_style must be 'path', 'virtual' or 'auto', got {addressing_style!r}"
            )
        super().__init__(
            max_attempts=max_attempts,
            connect_timeout_s=connect_timeout_s,
            timeout_s=read_timeout_s,
        )
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region_name = region_name or ("us-east-1" if endpoint_url else None)
        self._credentials = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        style = addressing_style if addressing_style in ("path", "virtual") else None
        self._path_style = style == "path" or (style is None and endpoint_url is not None)
        # Built now, so that a configuration obstore refuses fails at open; building sends no
        # request.
        self._client = self._make_client()

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> ObstoreS3ObjectStore:
        """A store for ``s3://bucket/prefix`` (or ``s3a://``).

        `storage_options` are the keyword arguments of the constructor, with the s3fs names
        `S3ObjectStore` accepts too (``key``, ``secret``, ``token``, ``endpoint``, ``region``,
        ``client_kwargs={"endpoint_url": ..., "region_name": ...}``); others are refused.
        """
        _, bucket, prefix = split_url(url, ("s3", "s3a"), "an s3://", "bucket")
        return cls(bucket, prefix, **normalize_options(storage_options))

    # -- client ---------------------------------------------------------------------------------

    def _make_client(self) -> S3Store:
        try:
            from obstore.store import S3Store
        except ImportError as exc:
            raise S3StreamError(
                "ObstoreS3ObjectStore needs obstore: pip install 's3stream[s3]'"
            ) from exc
        access_key, secret_key, token = self._credentials
        # No optional checksums, as `S3ObjectStore` (s3stream checks crc32c of its own); the
        # body's SHA-256 is signed (obstore's default), which S3 verifies.
        config: dict[str, str | bool | None] = {
            "virtual_hosted_style_request": not self._path_style,
            # If-None-Match: * on a create (S3 has it since August 2024).
            "conditional_put": "etag",
            "endpoint": self.endpoint_url,
            "region": self.region_name,
            "access_key_id": access_key,
            "secret_access_key": secret_key,
            "session_token": token,
        }
        store: S3Store = self._build_client(
            S3Store, self.bucket, config, service="S3", endpoint=self.endpoint_url
        )
        return store

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where} (obstore)"

    # -- operations -----------------------------------------------------------------------------

    def get_suffix(self, key: str, length: int) -> bytes:
        check_key(key)
        check_suffix_length(length)
        return self._get(key, {"range": {"suffix": length}})

    def _check_root_once(self, key: str) -> None:
        # ListObjectsV2 answers 404 NoSuchBucket without the bucket.
        self._probe_root(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        import obstore

        for batch in delete_batches(keys, DELETE_BATCH):
            self._sent(DELETE_OBJECTS)
            try:
                # One DeleteObjects (quiet): S3 reports no error for a key that is missing.
                obstore.delete(self._connected(), batch)
            except Exception as exc:
                raise self._translate(exc, "delete", batch[0]) from exc

    # -- errors ---------------------------------------------------------------------------------

    def _no_root(self) -> str:
        return _no_bucket(self.bucket)

    def _create_conflict(self, exc: Exception) -> bool:
        # obstore reports both 412 (the key exists) and 409 (ConditionalRequestConflict: a
        # concurrent conditional write was in flight, this one not applied) as "already
        # exists"; only the status tells them apart.
        return status_of(exc) == 409 or code_of(exc) == "ConditionalRequestConflict"

    def _service_error(
        self, exc: Exception, action: str, key: str | None, failure: Failure
    ) -> S3StreamError | None:
        from obstore import exceptions as ox

        what, status, code, detail = failure.what, failure.status, failure.code, failure.detail
        if code == "NoSuchBucket" or (action == "list" and status == 404):
            return S3StreamError(f"cannot {what}: {self._no_root()}")
        if code == "InvalidBucketName":
            return S3StreamError(f"cannot {what}: invalid bucket name {self.bucket!r}")
        if isinstance(exc, FileNotFoundError) and action == "read" and code is None:
            # A GET's 404 from S3 names its error (NoSuchKey); a bare one comes from a web
            # server that is not S3.
            return S3StreamError(
                f"cannot {what}: the endpoint did not answer like S3 ({failure.http}, no S3 "
                "error code): check endpoint_url (is it an S3 server, on the right port?)"
            )
        if code in _CREDENTIAL_CODES or isinstance(exc, ox.UnauthenticatedError) or status == 401:
            return S3StreamError(
                f"cannot {what}: the AWS credentials were refused, {detail} (check the keys, "
                "their expiry, and the region)"
            )
        if isinstance(exc, ox.PermissionDeniedError) or status == 403:
            need = _PERMISSIONS.get(action)
            hint = f"; {need}" if need else ""
            return S3StreamError(
                f"cannot {what}: access denied, {detail}{hint} (check the credentials, their "
                "IAM policy and the bucket policy)"
            )
        return None


def from_url(url: str, **storage_options: Any) -> ObstoreS3ObjectStore:
    """A factory for ``s3://`` and ``s3a://`` URLs, as `S3ObjectStore`'s ``from_url``."""
    return ObstoreS3ObjectStore.from_url(url, **storage_options)


def normalize_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`S3ObjectStore`'s storage options (s3fs names included) as this store's keywords;
    `InvalidArgumentError` naming any it cannot honour, and why."""
    out = s3fs_options(options)
    refused = sorted(set(out) & set(_UNSUPPORTED))
    if refused:
        reasons = "; ".join(f"{name}: {_UNSUPPORTED[name]}" for name in refused)
        raise InvalidArgumentError(
            f"storage_options the obstore S3 client does not take: {reasons} (or choose the "
            "boto3 client)"
        )
    return check_storage_options(ObstoreS3ObjectStore, out, "s3:// (obstore)")
