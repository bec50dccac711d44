"""An object store on Azure Blob Storage, through obstore (Rust ``object_store``, GIL-free).

Conditional create (`put_if_absent`) is a Put Blob with ``If-None-Match: *``: the service
decides, so of concurrent creators of one blob in any process on any machine exactly one
wins, and the others get 409 ``BlobAlreadyExists`` (obstore's ``AlreadyExistsError``). Only
that code (and 412 ``ConditionNotMet``) means False: other 409s (``ContainerBeingDeleted``,
``ContainerDisabled``, ...) created nothing and raise.

Like `S3ObjectStore`, each call makes ONE try by default (obstore's own retries off), bounded
by `connect_timeout_s` and `timeout_s` (obstore's overall per-request timeout, connect and
body included): transient failures (429, 5xx, connection errors, timeouts) surface as
`UnavailableError`, and the client's single retry layer (`RetryingObjectStore`) retries them
within the call's deadline. `max_attempts` > 1 turns obstore's retries back on for direct
users without a retry layer.

What Azure does differently from S3, and how the store bridges it:

* obstore lists by path segment (``a`` lists ``a/...``, not ``a-b``): `list` asks for the
  directory part of the prefix and filters by string prefix, then sorts (Azure documents
  lexicographic listings; sorting costs nothing next to the listing and guarantees the
  contract's key order). A blob name obstore cannot parse (``a//b``, made by another tool)
  fails the listing with an `S3StreamError` naming the problem: keep other tools' blobs out
  of the store's prefix.
* Azure has no suffix range (``bytes=-N``): `get_suffix` is `ObjectStore`'s, a HEAD and a
  ranged GET.
* A missing container answers 404 like a missing blob (a HEAD has no body to tell them
  apart): errors that name ``ContainerNotFound``, a PUT's 404, and a HEAD's 404 after one
  container check per store raise `S3StreamError` naming the container, never "no object".
* `delete_many` uses Blob Batch (256 deletes per request). obstore reports a batch's first
  failed delete only, and a missing blob is one: such a batch is then redone blob by blob (in
  parallel), ignoring missing blobs, so that no other failure hides behind it.
* A 403 names the Azure role the call needs (see `ROLE_HINT`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, S3StreamError
from ..validation import check_bool
from ._common import (
    check_endpoint,
    check_location,
    check_optional_text,
    check_storage_options,
    delete_batches,
    map_in_context,
    split_url,
)
from ._obstore import Failure, ObstoreObjectStore, code_of
from .requests import DELETE_OBJECTS

if TYPE_CHECKING:
    from obstore.store import AzureStore

__all__ = [
    "EMULATOR_ACCOUNT",
    "EMULATOR_KEY",
    "ROLE_HINT",
    "SCHEMES",
    "AzureObjectStore",
    "from_url",
]

#: URL schemes that open an `AzureObjectStore`.
SCHEMES = ("az", "azure", "abfs", "abfss")

#: Account and key of the Azure Storage emulator (Azurite), as Microsoft publishes them.
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_EMULATOR_ENDPOINT = f"http://127.0.0.1:10000/{EMULATOR_ACCOUNT}"

#: What an identity needs (Azure RBAC, or the permissions of a SAS), named in 403 errors.
ROLE_HINT = (
    "the identity needs the 'Storage Blob Data Contributor' role on the container or its "
    "account (readers: 'Storage Blob Data Reader'); a SAS needs the read, write, delete and "
    "list permissions (sp=rwdl)"
)

#: Deletes per Blob Batch request (Azure's limit).
DELETE_BATCH = 256
#: Single deletes in flight when a batch must be redone blob by blob.
_DELETE_THREADS = 16
#: Error codes of a Put Blob with ``If-None-Match: *`` refused because the blob exists: the
#: service answers 409 BlobAlreadyExists; for a failed condition of a write Azure documents 412
#: ConditionNotMet (with ``*``, the condition fails only if the blob exists).
_EXISTS_CODES = frozenset({"BlobAlreadyExists", "ConditionNotMet"})
_NO_CONTAINER_TEXT = ("containernotfound", "container does not exist")


class AzureObjectStore(ObstoreObjectStore):
    """Objects under ``az://container/prefix/`` in one storage account.

    Args:
        container: Container name (it must exist: the store does not create it).
        prefix: Blob name prefix inside the container (a trailing ``/`` is implied).
        account_name: Storage account; None lets obstore read ``AZURE_STORAGE_ACCOUNT_NAME``
            (the emulator's ``devstoreaccount1`` with `use_emulator`).
        account_key: Shared key; with `sas_token` None too, obstore's credential chain is
            used (environment variables, workload or managed identity, Azure CLI).
        sas_token: A shared access signature (with or without a leading ``?``).
        endpoint: Blob service URL of the account, e.g. ``https://acct.blob.core.windows.net``
            (the default) or Azurite's ``http://127.0.0.1:10000/devstoreaccount1``; an
            ``http://`` endpoint allows plain HTTP.
        use_emulator: Azurite: the emulator's well-known account and key unless given, and
            its default endpoint ``http://127.0.0.1:10000/devstoreaccount1`` unless given.
        max_attempts, connect_timeout_s, timeout_s: Tries and timeouts, as for
            `ObstoreObjectStore`.
    """

    scheme = "az"
    #: Blobs per List Blobs page (Azure's maximum).
    list_page_size = 5000

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        account_name: str | None = None,
        account_key: str | None = None,
        sas_token: str | None = None,
        endpoint: str | None = None,
        use_emulator: bool = False,
        max_attempts: int = 1,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 30.0,
    ) -> None:
        #: Blob name prefix inside the container, empty or ending with ``/``.
        self.prefix = check_location("container", container, prefix)
        check_optional_text(
            account_name=account_name,
            account_key=account_key,
            sas_token=sas_token,
            endpoint=endpoint,
        )
        check_bool("use_emulator", use_emulator)
        super().__init__(
            max_attempts=max_attempts, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s
        )
        if use_emulator:
            account_name = account_name or EMULATOR_ACCOUNT
            if account_key is None and sas_token is None:
                account_key = EMULATOR_KEY
            endpoint = endpoint or _EMULATOR_ENDPOINT
        self.container = container
        check_endpoint("endpoint", endpoint)
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self._account_name = account_name
        self._account_key = account_key
        self._sas_token = sas_token.lstrip("?") if sas_token else None
        # Built now, so that a configuration obstore refuses (no account anywhere) fails at
        # open; building sends no request.
        self._client = self._make_client()

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> AzureObjectStore:
        """A store for ``az://container/prefix``, ``azure://container/prefix``,
        ``abfs[s]://container/prefix`` or ``abfs[s]://container@account.dfs.core.windows.net/
        prefix`` (the account, and for other clouds the endpoint, from the host).

        `storage_options` are the keyword arguments of the constructor; others are refused.
        """
        _, authority, prefix = split_url(url, SCHEMES, "an Azure Blob Storage", "container")
        options = check_storage_options(cls, storage_options, "az://")
        container, at, host = authority.partition("@")
        if at:
            account, endpoint = _account_of_host(host, url)
            if "account_name" in options and options["account_name"] != account:
                raise InvalidArgumentError(
                    f"the URL {url!r} names account {account!r}, the storage option "
                    f"account_name {options['account_name']!r}"
                )
            options["account_name"] = account
            if endpoint is not None:
                options.setdefault("endpoint", endpoint)
        if not container:
            raise InvalidArgumentError(f"the URL {url!r} names no container")
        return cls(container, prefix, **options)

    # -- client ---------------------------------------------------------------------------------

    def _make_client(self) -> AzureStore:
        try:
            from obstore.store import AzureStore
        except ImportError as exc:
            raise S3StreamError(
                "AzureObjectStore needs obstore: pip install 's3stream[azure]'"
            ) from exc
        config = {
            "account_name": self._account_name,
            "account_key": self._account_key,
            "sas_key": self._sas_token,
            "endpoint": self.endpoint,
        }
        hint = (
            ": give the storage option account_name, or set AZURE_STORAGE_ACCOUNT_NAME"
            if self._account_name is None
            else ""
        )
        store: AzureStore = self._build_client(
            AzureStore,
            self.container,
            config,
            service="Azure Blob Storage",
            endpoint=self.endpoint,
            hint=hint,
        )
        return store

    @property
    def account_name(self) -> str | None:
        """The storage account as given; None when obstore reads it from the environment
        (``AZURE_STORAGE_ACCOUNT_NAME``), which it does not report back."""
        return self._account_name

    def describe(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        account = self.account_name
        of = f" (account {account}{where})" if account else where
        return f"az://{self.container}/{self.prefix}{of}"

    # -- operations -----------------------------------------------------------------------------

    def _check_root_once(self, key: str) -> None:
        # List Blobs answers 404 ContainerNotFound without the container.
        self._probe_root(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        for batch in delete_batches(keys, DELETE_BATCH):
            self._delete_batch(batch)

    def _delete_batch(self, batch: list[str]) -> None:
        if self._delete(batch, batch[0]) or len(batch) == 1:
            return
        # The batch ran every delete, but obstore reports only its first failure (a missing
        # blob, which is fine) and would hide any other: delete each blob again on its own,
        # in parallel (obstore releases the GIL), so that every other failure surfaces.
        map_in_context(
            lambda key: self._delete(key, key),
            batch,
            min(_DELETE_THREADS, len(batch)),
            "s3stream-azure-delete",
        )

    def _delete(self, blobs: str | list[str], key: str) -> bool:
        """One Delete Blob (of `blobs`, a name) or Blob Batch (a list; `key` its first, for
        errors); False if obstore reported a missing blob."""
        import obstore

        store = self._connected()
        self._sent(DELETE_OBJECTS)
        try:
            obstore.delete(store, blobs)
        except FileNotFoundError as exc:
            if _names_no_container(exc):
                raise S3StreamError(
                    f"cannot delete in {self.describe()}: {self._no_root()}"
                ) from exc
            return False
        except Exception as exc:
            raise self._translate(exc, "delete", key) from exc
        return True

    # -- errors ---------------------------------------------------------------------------------

    def _create_refused_as_existing(self, exc: Exception) -> bool:
        # obstore reports every 409 and 412 of a Put Blob as "already exists"; Azure answers
        # 409 with other codes too (ContainerBeingDeleted, ContainerDisabled, ...), having
        # created nothing: only the codes of an existing blob mean False.
        return code_of(exc) in _EXISTS_CODES

    def _no_root(self) -> str:
        return (
            f"container {self.container!r} does not exist in storage account "
            f"{self.account_name or '?'} (ContainerNotFound): create it, or fix the URL"
        )

    def _service_error(
        self, exc: Exception, action: str, key: str | None, failure: Failure
    ) -> S3StreamError | None:
        from obstore import exceptions as ox

        what, status = failure.what, failure.status
        if _names_no_container(exc) or (action == "list" and status == 404):
            return S3StreamError(f"cannot {what}: {self._no_root()}")
        if isinstance(exc, ox.PermissionDeniedError) or status == 403:
            return S3StreamError(
                f"cannot {what}: access denied, {failure.detail}; {ROLE_HINT} (or the key or "
                "SAS is wrong, expired, or for another account)"
            )
        if isinstance(exc, ox.UnauthenticatedError) or status == 401:
            return S3StreamError(f"cannot {what}: no usable Azure credentials ({failure.text})")
        return None


def from_url(url: str, **storage_options: Any) -> AzureObjectStore:
    """Registry factory for ``az://``, ``azure://``, ``abfs://`` and ``abfss://`` URLs."""
    return AzureObjectStore.from_url(url, **storage_options)


def _account_of_host(host: str, url: str) -> tuple[str, str | None]:
    """(account, blob endpoint or None for Azure's public cloud) of ``acct.dfs.<suffix>``."""
    account, _, service = host.partition(".")
    kind, _, suffix = service.partition(".")
    if not account or kind not in ("dfs", "blob") or not suffix:
        raise InvalidArgumentError(
            f"the URL {url!r} must name the account as container@ACCOUNT.dfs.core.windows.net"
        )
    if suffix == "core.windows.net":
        return account, None
    # Other clouds (core.chinacloudapi.cn, ..., Fabric): their blob endpoint.
    return account, f"https://{account}.blob.{suffix}"


def _names_no_container(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(hint in text for hint in _NO_CONTAINER_TEXT)
