"""Reporting acknowledged appends a WAL has lost: one rule for every built-in WAL.

Damage or a missing WAL is `CorruptionError` naming where; ``accept_wal_loss=True`` (an explicit
choice) turns it into a warning and the WAL goes on without the lost records.
"""

from __future__ import annotations

import logging

from ..errors import CorruptionError

__all__ = ["check_open_node_wal", "check_wal_loss"]

_log = logging.getLogger("s3stream.wal")


def check_wal_loss(
    message: str,
    *,
    location: str,
    accept_loss: bool,
    position: int | None = None,
    node_id: str | None = None,
) -> None:
    """Acknowledged appends of a WAL are lost (`message` says which and why): raise
    `CorruptionError` naming `location` (and the byte `position`, where known), or, with
    `accept_loss`, log a warning (about `node_id`) and return."""
    if not accept_loss:
        raise CorruptionError(
            message + "; open with accept_wal_loss=True to go on without them",
            location=location,
            position=position,
        )
    _log.warning(
        "%s; going on without them (accept_wal_loss=True)",
        message,
        extra={"node_id": node_id, "stream_id": None},
    )


def check_open_node_wal(node_id: str, problem: str, *, location: str, accept_loss: bool) -> None:
    """The WAL of `node_id`, which still has streams open (its last session did not close
    them), is gone (`problem` says how): `check_wal_loss`."""
    check_wal_loss(
        f"node {node_id!r} still has streams open (its last session did not close them), so "
        f"its WAL may hold acknowledged appends not uploaded yet, but {problem}",
        location=location,
        accept_loss=accept_loss,
        node_id=node_id,
    )
