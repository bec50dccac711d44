"""Object-store clients side by side on one SeaweedFS: boto3 (as `S3ObjectStore`, and raw)
and obstore's ``S3Store`` (Rust ``object_store``), from Python.

Five clients, one server, interleaved rounds (each round runs every client once, in a
rotating order, so that drift of the machine or the server touches them alike):

- *small PUT latency*: sequential 1 KiB PUTs, p50/p99/mean per client (N in total);
- *large PUT and GET throughput*: sequential 8 MiB PUTs, then GETs of those objects, MB/s
  (total bytes over total time) and the median per-request MB/s.

Clients: ``S3ObjectStore`` (the project's store: boto3, one try per call); ``boto3`` raw
(``put_object``/``get_object`` on a client with botocore's standard retries, path-style);
``obstore`` (``S3Store`` with explicit credentials, endpoint, ``allow_http`` and path-style,
retries off, single-request PUTs: ``use_multipart=False``, as boto3's ``put_object``).
Everything runs in one process, one request at a time.

Checksums, so that the comparison is like for like: botocore >= 1.36 by default
(``request_checksum_calculation="when_supported"``) adds a CRC32 header to every PUT and
validates the CRC of every full GET that carries one; obstore sends and checks none unless
asked. So each boto3 client runs twice: with botocore's defaults (``default cksum``) and with
``request_checksum_calculation`` and ``response_checksum_validation`` at ``"when_required"``
(``no cksum``: a checksum only where the API requires one, e.g. DeleteObjects). The
``S3ObjectStore`` rows get their client passed in (``client=``), so they measure the store's
own overhead over the same client configuration whatever its default is. Both sides still
sign the payload's SHA-256 (plain HTTP: botocore signs it, object_store always does).

Usage: ``python bench/object_client_bench.py [--small N] [--large N] [--rounds R]
[--out bench/results/<date>-object-clients/object_clients.json]``
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from s3stream.objectstore.s3 import S3ObjectStore  # noqa: E402
from s3stream.testing.seaweedfs import SeaweedS3Server  # noqa: E402

MiB = 1 << 20
SMALL_BYTES = 1 << 10
LARGE_BYTES = 8 * MiB

#: One client as the bench drives it: put(key, data) and get(key) -> bytes.
Client = tuple[Callable[[str, bytes], None], Callable[[str], bytes]]


#: botocore ``Config`` keywords of the two checksum settings the boto3 clients run with.
CHECKSUM_CONFIGS: dict[str, dict[str, str]] = {
    "default cksum": {
        "request_checksum_calculation": "when_supported",
        "response_checksum_validation": "when_supported",
    },
    "no cksum": {
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
    },
}

#: The obstore row, which the ratios divide by every boto3 row.
OBSTORE = "obstore S3Store"


def _raw_client(client: Any, bucket: str, where: str) -> Client:
    """put/get straight on a boto3 client, under `where`."""

    def put(key: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{where}/{key}", Body=data)

    def get(key: str) -> bytes:
        body = client.get_object(Bucket=bucket, Key=f"{where}/{key}")["Body"]
        try:
            data: bytes = body.read()
            return data
        finally:
            body.close()

    return put, get


def make_clients(server: SeaweedS3Server, prefix: str) -> dict[str, Client]:
    """The clients (each boto3 one under both checksum settings, then obstore), each
    writing under its own prefix."""
    import obstore
    from obstore.store import S3Store

    bucket = server.bucket
    clients: dict[str, Client] = {}
    for tag, checksums in CHECKSUM_CONFIGS.items():
        slug = tag.replace(" ", "-")
        # The same client configuration S3ObjectStore builds by default (one try, its
        # timeouts), with only the checksum settings varied.
        store = S3ObjectStore(
            bucket,
            f"{prefix}/s3objectstore-{slug}",
            **server.storage_options(),
            client=server.client(
                max_attempts=1, connect_timeout=5.0, read_timeout=30.0, **checksums
            ),
        )
        clients[f"S3ObjectStore, {tag}"] = (store.put, store.get)
        clients[f"boto3 raw, {tag}"] = _raw_client(
            server.client(**checksums), bucket, f"{prefix}/boto3-{slug}"
        )

    opts = server.storage_options()
    ob = S3Store(
        bucket,
        prefix=f"{prefix}/obstore",
        endpoint=opts["endpoint_url"],
        access_key_id=opts["aws_access_key_id"],
        secret_access_key=opts["aws_secret_access_key"],
        region=opts["region_name"],
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": "60s"},
        retry_config={"max_retries": 0},
    )

    def ob_put(key: str, data: bytes) -> None:
        obstore.put(ob, key, data, use_multipart=False)

    def ob_get(key: str) -> bytes:
        return bytes(obstore.get(ob, key).bytes())

    clients[OBSTORE] = (ob_put, ob_get)
    return clients


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(server: SeaweedS3Server, small: int, large: int, rounds: int) -> dict[str, Any]:
    clients = make_clients(server, f"bench-{uuid.uuid4().hex[:8]}")
    names = list(clients)
    small_data = os.urandom(SMALL_BYTES)
    large_data = os.urandom(LARGE_BYTES)
    # Warm up: connections, signers, credential lookups.
    for put, get in clients.values():
        for i in range(10):
            put(f"warm/{i}", small_data)
            get(f"warm/{i}")
        put("warm/large", large_data)
        get("warm/large")
    small_s: dict[str, list[float]] = {n: [] for n in names}
    put_s: dict[str, list[float]] = {n: [] for n in names}
    get_s: dict[str, list[float]] = {n: [] for n in names}
    per_round_small = -(-small // rounds)
    per_round_large = -(-large // rounds)
    gc.collect()
    gc.freeze()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            put, get = clients[name]
            for i in range(per_round_small):
                key = f"small/{r}/{i}"
                small_s[name].append(_timed(lambda: put(key, small_data)))  # noqa: B023
            for i in range(per_round_large):
                key = f"large/{r}/{i}"
                put_s[name].append(_timed(lambda: put(key, large_data)))  # noqa: B023
            for i in range(per_round_large):
                key = f"large/{r}/{i}"
                got: list[bytes] = []
                get_s[name].append(_timed(lambda: got.append(get(key))))  # noqa: B023
                assert len(got[0]) == LARGE_BYTES, f"{name} read {len(got[0])} bytes"
    gc.unfreeze()
    results = {}
    for name in names:
        lat = sorted(small_s[name])
        results[name] = {
            "small_put": {
                "n": len(lat),
                "bytes": SMALL_BYTES,
                "p50_ms": 1000 * statistics.median(lat),
                "p99_ms": 1000 * lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
                "mean_ms": 1000 * statistics.fmean(lat),
            },
            "large_put": _throughput(put_s[name]),
            "large_get": _throughput(get_s[name]),
        }
    return results


def _throughput(seconds: list[float]) -> dict[str, Any]:
    return {
        "n": len(seconds),
        "bytes": LARGE_BYTES,
        "mb_s": len(seconds) * LARGE_BYTES / MiB / sum(seconds),
        "median_request_mb_s": LARGE_BYTES / MiB / statistics.median(seconds),
    }


def compute_ratios(results: dict[str, Any]) -> dict[str, float]:
    """obstore's small-PUT p50 and p99 over each boto3 row's (< 1: obstore is faster), and
    the best boto3 row's p50 over obstore's (the speed-up issue 21 asks to be >= 1.5)."""
    ob = results[OBSTORE]["small_put"]
    ratios: dict[str, float] = {}
    for name, row in results.items():
        if name == OBSTORE:
            continue
        s = row["small_put"]
        ratios[f"small_put_p50 obstore / {name}"] = ob["p50_ms"] / s["p50_ms"]
        ratios[f"small_put_p99 obstore / {name}"] = ob["p99_ms"] / s["p99_ms"]
    best = min(row["small_put"]["p50_ms"] for name, row in results.items() if name != OBSTORE)
    ratios["small_put_p50 best boto3 / obstore"] = best / ob["p50_ms"]
    return ratios


def print_table(results: dict[str, Any]) -> None:
    header = (
        f"{'client':<32}{'PUT 1KiB p50 ms':>16}{'p99 ms':>9}{'mean ms':>9}"
        f"{'PUT 8MiB MB/s':>15}{'GET 8MiB MB/s':>15}"
    )
    print(header)
    print("-" * len(header))
    for name, row in results.items():
        s = row["small_put"]
        print(
            f"{name:<32}{s['p50_ms']:>16.2f}{s['p99_ms']:>9.2f}{s['mean_ms']:>9.2f}"
            f"{row['large_put']['mb_s']:>15.0f}{row['large_get']['mb_s']:>15.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=500, help="1 KiB PUTs per client")
    parser.add_argument("--large", type=int, default=12, help="8 MiB PUTs (and GETs) per client")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--out", default=None, help="JSON report (default: dated results dir)")
    args = parser.parse_args(argv)
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    out = Path(
        args.out or ROOT / "bench" / "results" / f"{today}-object-clients" / "object_clients.json"
    )
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="object-client-bench-") as tmp:
        server = SeaweedS3Server(Path(tmp)).start()
        try:
            started = time.monotonic()
            results = run(server, args.small, args.large, args.rounds)
            elapsed = time.monotonic() - started
        finally:
            server.stop()
    print_table(results)
    ratios = compute_ratios(results)
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    import boto3
    import botocore
    import obstore

    report = {
        "bench": "object_clients",
        "server": "SeaweedFS (weed mini) on loopback",
        "rounds": args.rounds,
        "seconds": elapsed,
        "versions": {
            "boto3": boto3.__version__,
            "botocore": botocore.__version__,
            "obstore": obstore.__version__,
        },
        "checksum_configs": CHECKSUM_CONFIGS,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": [load_before[0], os.getloadavg()[0]],
        },
        "results": results,
        "ratios": ratios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
