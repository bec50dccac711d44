"""Reporting acknowledged appends a WAL has lost: one rule for every built-in WAL.

Damage or a missing WAL is `CorruptionError` naming where; ``accept_wal_loss=True`` (an explicit
choice) turns it into a warning and the WAL goes on without the lost records.
"""

from __future__ import annotations

import logging

from ..errors import CorruptionError, InvalidArgumentError

__all__ = ["check_open_node_wal", "check_wal_loss", "refuse_foreign_wal"]

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
            message + "; open with accept_wal_loss=True (s3stream take-over: --accept-wal-loss) "
            "to go on without them",
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


def refuse_foreign_wal(
    where: str,
    node_id: str,
    *,
    found: int,
    expect_uid: int,
    holds_records: bool,
    must_exist: bool,
    accept_loss: bool,
) -> None:
    """A WAL at `where` whose identity `found` is not the `expect_uid` the store recorded
    for `node_id`: refused if it `holds_records` (another store's or node's, which would
    be replayed into this store's streams), and, while the node's streams are open
    (`must_exist`), if it holds none (the node's own WAL is elsewhere: `check_open_node_wal`).
    One rule for the WAL's open and for the check a client makes before registering a node."""
    if holds_records:
        recorded = (
            "and the store has no WAL of this node"
            if expect_uid == -1
            else f"the node's is {expect_uid}"
        )
        raise InvalidArgumentError(
            f"WAL {where} is not the WAL this store recorded for node {node_id!r}: its "
            f"identity is {found}, {recorded}, and it holds records that are not uploaded: "
            "another store's or another node's, which would be replayed into this store's "
            "streams. Name this node's own WAL (or a new path); the WAL is left as it is"
        )
    if must_exist:
        check_open_node_wal(
            node_id,
            f"the WAL {where} is not the one the store recorded for it (its identity is "
            f"{found}, the node's {expect_uid}): the node's own WAL is elsewhere",
            location=where,
            accept_loss=accept_loss,
        )
