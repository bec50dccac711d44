"""moto's S3 server in a process of its own, with SigV4 signatures and IAM permissions checked.

Run as ``python -m s3stream.testing.moto_process BUCKET``: it creates an IAM user allowed
``s3:*``, its access key and the bucket, turns on moto's request authentication (every request
from then on must be signed with that key, as S3 requires), serves on a free loopback port and
prints one JSON line: ``{"port": ..., "access_key": ..., "secret_key": ...}``. It serves until
its standard input closes (so it never outlives the test process that started it) or it is
signalled. Conditional writes are decided one at a time (`_ConditionalWritesInTurn`), giving
moto's check-then-write S3's one-winner semantics.

A process of its own because moto's authentication switch and backends are process-wide: in
the test process they would change every other moto server there.
"""

from __future__ import annotations

import json
import sys
from typing import Any

POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m s3stream.testing.moto_process BUCKET", file=sys.stderr)
        return 2
    bucket = argv[0]
    from moto import settings
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    from .s3_servers import _ConditionalWritesInTurn

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    iam.create_user("us-east-1", "s3stream-test")
    iam.put_user_policy("s3stream-test", "s3-all", json.dumps(POLICY))
    key = iam.create_access_key("s3stream-test")
    s3_backends[DEFAULT_ACCOUNT_ID]["aws"].create_bucket(bucket, "us-east-1")
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on every request is authenticated

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    wsgi: Any = server._server  # the WSGI server moto built
    wsgi.app = _ConditionalWritesInTurn(wsgi.app)
    print(
        json.dumps(
            {
                "port": int(server.get_host_and_port()[1]),
                "access_key": key.access_key_id,
                "secret_key": key.secret_access_key,
            }
        ),
        flush=True,
    )
    sys.stdin.read()  # returns when the parent closes the pipe or dies
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
