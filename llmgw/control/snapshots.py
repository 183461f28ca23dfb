"""Snapshots of the folded state, so that a restart folds only the tail.

One file, replaced atomically. A snapshot is used only if it was written by
the same fold (`FOLD_VERSION`) from the same log (`log_id`): a changed
`evolve` could have folded the same events differently, and a stream created
anew under the same name holds other events under the same sequences.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path

import msgspec

from ..core.folding.fold import FOLD_VERSION, decode_state, encode_state
from ..core.folding.state import State


class Snapshot(msgspec.Struct, kw_only=True):
    fold_version: int
    log_id: str
    seq: int
    state: bytes


class SnapshotStore:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self, log_id: str, last_seq: int) -> State | None:
        """The saved state, unless it is from another fold, another log, or
        further along than the log is now."""
        try:
            snap = msgspec.msgpack.decode(self.path.read_bytes(), type=Snapshot)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if snap.fold_version != FOLD_VERSION or snap.log_id != log_id or snap.seq > last_seq:
            return None
        with gc_paused():
            return decode_state(snap.state)

    def save(self, state: State, log_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")  # control planes may share a state dir
        data = msgspec.msgpack.encode(Snapshot(fold_version=FOLD_VERSION, log_id=log_id, seq=state.seq, state=encode_state(state)))
        # 0600: the state holds the API keys' hashes (issue 35: a state dir at 0755 showed them to every local user).
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


@contextmanager
def gc_paused():
    """Python's cycle collector off while a large state is built: decoding
    one makes a million objects, none of them garbage, and each collection
    it triggered went over all that were made so far (at 16,000 nodes, a
    decode took 2.5x as long with it on)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
