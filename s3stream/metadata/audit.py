"""Auditing a metadata log from its first entry, reading only (what `s3stream verify` runs).

A client loads the newest checkpoint and the entries after it, so damage to older entries and
checkpoints goes unnoticed until someone needs them. `audit_log` lists the log's keys (the one
place that lists), replays every entry from seq 1, and reports, without writing anything:

- a damaged entry (bad frame or checksum, wrong seq inside, or an op that breaks an invariant);
- a hole: an entry missing while later ones exist (the replay stops at it, as loading would);
- a checkpoint whose state differs from the replayed state at its seq, or that is unreadable;
- a checkpoint pointer naming a checkpoint that does not exist or lies past the last entry.

What it cannot see: newest entries deleted with nothing after them (the log just looks shorter;
a client that had seen them notices, `MetadataManager` docs), or a log replaced wholesale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CorruptionError, ObjectNotFoundError, S3StreamError
from .base import MetadataLogStore
from .state import MetadataState

__all__ = ["LogAudit", "audit_log"]


@dataclass(slots=True)
class LogAudit:
    """What `audit_log` found."""

    #: Entries replayed from seq 1 (up to the first missing or damaged one).
    entries: int = 0
    #: Checkpoints compared with the replay.
    checkpoints: int = 0
    #: One line per problem; empty for a healthy log.
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing was found wrong."""
        return not self.problems


def audit_log(log: MetadataLogStore) -> LogAudit:
    """Replay and check the whole log (see the module docstring); reads only."""
    audit = LogAudit()
    present = log.listed_seqs()
    checkpoints = log.listed_seqs(checkpoints=True)
    state = MetadataState.empty()
    seq = 0
    while True:
        seq += 1
        try:
            entry, _ = log.read_entry(seq)
        except ObjectNotFoundError:
            break
        except CorruptionError as exc:
            audit.problems.append(f"damaged entry {log.entry_key(seq)!r}: {exc}")
            break
        try:
            state = state.apply(entry)
        except S3StreamError as exc:
            audit.problems.append(f"entry {log.entry_key(seq)!r} breaks an invariant: {exc}")
            break
        audit.entries = seq
        if seq in checkpoints:
            _check_checkpoint(log, seq, state, audit)
    last = audit.entries
    damaged = bool(audit.problems)  # the replay stopped at a damaged entry, not a missing one
    after = sorted(s for s in present if s > last + (1 if damaged else 0))
    if after and not damaged:
        audit.problems.append(
            f"entries {last + 1}..{after[0] - 1} are missing (a hole): {len(after)} entries "
            f"up to {after[-1]} exist after it, and every reader stops at the hole"
        )
    elif after:
        audit.problems.append(
            f"{len(after)} entries after the damaged one (up to {after[-1]}) are unread"
        )
    for cp in sorted(c for c in checkpoints if c > last):
        audit.problems.append(f"checkpoint {log.checkpoint_key(cp)!r} lies past the last entry")
    _check_pointer(log, checkpoints, last, audit)
    return audit


def _check_checkpoint(
    log: MetadataLogStore, seq: int, state: MetadataState, audit: LogAudit
) -> None:
    audit.checkpoints += 1
    try:
        checkpoint = log.read_checkpoint(seq)
    except CorruptionError as exc:
        audit.problems.append(f"damaged checkpoint {log.checkpoint_key(seq)!r}: {exc}")
        return
    if checkpoint != state.to_checkpoint():
        audit.problems.append(
            f"checkpoint {log.checkpoint_key(seq)!r} differs from the state the entries up "
            f"to {seq} give"
        )


def _check_pointer(
    log: MetadataLogStore, checkpoints: set[int], last: int, audit: LogAudit
) -> None:
    try:
        pointer = log.read_pointer()
    except CorruptionError as exc:
        audit.problems.append(f"damaged checkpoint pointer {log.pointer_key!r}: {exc}")
        return
    if pointer is None:
        return
    if (pointer not in checkpoints or pointer > last) and _written_since(log, pointer):
        # A live writer checkpointed after this audit listed and replayed the log.
        return
    if pointer not in checkpoints:
        audit.problems.append(
            f"the checkpoint pointer names checkpoint {pointer}, which does not exist"
        )
    elif pointer > last:
        audit.problems.append(
            f"the checkpoint pointer names checkpoint {pointer}, past the last entry {last}"
        )


def _written_since(log: MetadataLogStore, seq: int) -> bool:
    """Whether entry `seq` and its checkpoint both exist now (written while the audit ran)."""
    try:
        log.read_checkpoint(seq)
    except (ObjectNotFoundError, CorruptionError):
        return False  # missing or bad: reported as what the pointer names
    return log.has_entry(seq)
