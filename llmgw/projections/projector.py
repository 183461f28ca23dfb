"""The projector: follows the log and keeps the SQLite read models.

How it stays exact across crashes: the rows of a batch of events and the
position (the batch's last sequence) are written in ONE transaction. After a
kill -9 the database holds some position P and exactly the rows of events
1..P; on start the projector folds 1..P again in memory, writing nothing
(fast: the bus's catch-up reader, and `apply` at 200-300k events/s), and goes on
writing from P+1. No event is applied twice to the rows, none is skipped.

Batching: the writer takes whatever has arrived, up to `max_batch` events
(see MAX_BATCH), and commits it as one transaction; while it commits, the
next batch gathers. So a quiet fleet sees each event within a few
milliseconds (no lingering window to wait out before a read-your-writes
read), and a burst or a catch-up is written in batches of `max_batch`,
where rows per event fall (several events of one replica write its row once).

`Bus.follow` calls back synchronously, in order; the callback only queues
(or, for events the rows already hold, folds). One asyncio task folds and
writes. Messages that arrive faster than SQLite takes them wait in memory
(about the size of the message each): a bus cannot be paused half-way
through its catch-up read.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ..bus import Bus
from ..core.folding.fold import FOLD_VERSION, apply
from ..core.folding.state import State
from . import rows, statements
from .db import POSITION_NAME, connect, read_position
from .migrate import migrate
from .mirror import Changes, Mirror

log = logging.getLogger("llmgw.projections")

# Most events per transaction. Only a backlog (a catch-up, a burst) fills a
# batch: live, a batch is what arrived while the last one was committed. Here
# (2 shared cores) 200,000 events of a busy fleet's log project at ~21k/s in
# batches of 2,000 and ~27k/s of 10,000 (benchmarks/projections.py): a
# bigger batch writes each replica's and node's row once for more events
# and commits less often. 10,000 events fold in ~0.15 s and commit in ~0.2 s.
MAX_BATCH = 10_000
REBUILD_BATCH = 20_000
FOLD_CHUNK = 1000  # events folded between two turns of the event loop
RETRY_MAX_S = 5.0


class DatabaseReplaced(Exception):
    """The file at the projector's path is no longer the one it writes: a
    rebuild (`llmgw projections rebuild`) put a new one there. The projector
    starts again on the new file, from the position that file stands at, so
    nothing it wrote to the old one after the rebuild's end is missed."""


class ProjectorFailed(RuntimeError):
    """Writing failed with something a retry cannot mend (a bug); started
    again, the projector resumes from what its last commit left."""


class Projector:
    """Keeps the read models at `db_path` equal to the log of `bus`.

    `run(stop)` is the service; `start()`, `wait_for(seq)` and `close()` the
    pieces, for tests and `rebuild`. With `bus=None`, `open(log_id)` and
    `project(records)` write batches handed to it (the benchmark)."""

    def __init__(self, bus: Bus | None, db_path: str | os.PathLike, *, max_batch: int = MAX_BATCH) -> None:
        self.bus = bus
        self.db_path = Path(db_path)
        self.max_batch = max_batch
        self.state = State()
        self.mirror = Mirror()
        self.position = 0  # the last sequence whose rows are committed
        self.batches = 0
        self.failed: BaseException | None = None
        self._conn = None
        self._inode = 0  # of the file the connection writes (see DatabaseReplaced)
        self._log_id = ""
        self._fold_only_to = 0  # events up to here are in the rows already: fold, do not write
        self._last_received = 0
        self._queue: collections.deque = collections.deque()
        self._arrived = asyncio.Event()
        self._progress = asyncio.Event()
        self._closing = False
        self._close_lock = asyncio.Lock()
        self._follower = None
        self._writer: asyncio.Task | None = None

    # ----------------------------------------------------------------- lifecycle

    async def open(self, log_id: str = "") -> int:
        """Open and migrate the database; returns the position its rows stand at.

        Rows made from another log (a stream deleted and made again) or by
        another version of the fold are of no use: the database is rebuilt.
        """
        if self.bus is not None:
            log_id = await self.bus.log_id()
        self._log_id = log_id
        self._conn = await connect(self.db_path)
        await migrate(self._conn)
        seq, stored_log, fold_version = await read_position(self._conn)
        last = await self.bus.last_seq() if self.bus is not None else seq
        if seq and (stored_log != log_id or fold_version != FOLD_VERSION or seq > last):
            log.warning(
                "the read models at %s were made from %s at seq %d with fold version %d; this is %s (last seq %d), "
                "fold version %d: rebuilding them",
                self.db_path, stored_log, seq, fold_version, log_id, last, FOLD_VERSION,
            )
            await self._conn.close()
            await rebuild(self.bus, self.db_path)
            self._conn = await connect(self.db_path)
            seq, _, _ = await read_position(self._conn)
        self.position = seq
        self._inode = os.stat(self.db_path).st_ino
        await self.mirror.load(self._conn)
        return seq

    async def start(self) -> int:
        """Open, then follow the log from the start: events the rows hold are
        folded only, the rest written. Returns the position the rows stood at."""
        assert self.bus is not None
        seq = await self.open()
        self._fold_only_to = seq
        last = await self.bus.last_seq()
        log.info("read models at %s stand at seq %d; the log is at %d", self.db_path, seq, last)
        self._writer = asyncio.create_task(self._write_loop())
        self._follower = await self.bus.follow(1, self._on_message)
        return seq

    async def run(self, stop: asyncio.Event) -> None:
        """Project until `stop` is set (or writing fails: ProjectorFailed)."""
        try:
            await self.start()
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({stopper, self._writer}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
        finally:
            await self.close()
        if isinstance(self.failed, DatabaseReplaced):
            raise self.failed
        if self.failed is not None:
            raise ProjectorFailed(f"the projector stopped: {self.failed}") from self.failed

    async def close(self) -> None:
        """Stop following; the batch being written is committed first. Safe
        to call twice, or from two tasks at once (run's own and a caller's)."""
        self._closing = True
        self._arrived.set()
        async with self._close_lock:
            follower, self._follower = self._follower, None
            if follower is not None:
                await follower.stop()
            writer, self._writer = self._writer, None
            if writer is not None:
                try:
                    await writer
                except BaseException:  # recorded in self.failed
                    pass
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()

    async def wait_for(self, seq: int, timeout: float | None = 10.0) -> bool:
        """Wait until the rows include event `seq` (in this process; other
        processes use `db.wait_for_position`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.position < seq:
            if self.failed is not None:
                raise ProjectorFailed(f"the projector stopped: {self.failed}") from self.failed
            self._progress.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(self._progress.wait(), left)
            except asyncio.TimeoutError:
                return self.position >= seq
        return True

    # ----------------------------------------------------------------- following

    def _on_message(self, seq: int, subject: str, data: bytes) -> None:
        if seq <= self._last_received:
            return  # redelivered after a reconnect
        self._last_received = seq
        if seq <= self._fold_only_to:
            apply(self.state, seq, subject, data)
            return
        self._queue.append((seq, subject, data))
        self._arrived.set()

    async def _write_loop(self) -> None:
        queue = self._queue
        try:
            while not self._closing:
                if not queue:
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                # Whatever has arrived, up to max_batch, folded a chunk at a
                # time so the bus is read meanwhile (it may add to the batch).
                batch = rows.Batch()
                while queue and len(batch) < self.max_batch:
                    take = min(len(queue), FOLD_CHUNK, self.max_batch - len(batch))
                    rows.fold(self.state, [queue.popleft() for _ in range(take)], self.mirror.ids, batch)
                    await asyncio.sleep(0)
                await self._write(batch)
        except asyncio.CancelledError:
            raise
        except DatabaseReplaced as e:  # run() raises it; the caller starts again
            self.failed = e
            self._progress.set()
        except BaseException as e:
            log.error("the projector stopped: %s: %s", type(e).__name__, e, exc_info=True)
            self.failed = e
            self._progress.set()
            raise

    # ----------------------------------------------------------------- one batch

    async def project(self, records: list[tuple[int, str, bytes]]) -> None:
        """Fold a run of consecutive records and commit their rows and the new
        position in one transaction. The benchmark calls this directly."""
        await self._write(rows.fold(self.state, records, self.mirror.ids))

    async def _write(self, batch: rows.Batch) -> None:
        if not len(batch):
            return
        if self._inode and os.stat(self.db_path).st_ino != self._inode:
            raise DatabaseReplaced(f"{self.db_path} was replaced (rebuilt); starting again on the new file")
        # Once per batch: from here the mirror says what this batch writes.
        changes = self.mirror.changes(self.state, batch)
        delay = 0.05
        while True:
            try:
                await self._commit(batch, changes)
                break
            except sqlite3.OperationalError as e:
                # Busy, locked, disk full, I/O: nothing of the batch was
                # committed, and its rows were computed already, so they are
                # simply written again. Anything else (a bug) stops the
                # projector; started again, it resumes from what is on disk.
                if self._closing:
                    raise
                log.warning("writing seq %d..%d failed (%s); trying again", batch.first_seq, batch.last_seq, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        self.position = batch.last_seq
        self.batches += 1
        self._progress.set()

    async def _commit(self, batch: rows.Batch, changes: Changes) -> None:
        conn = self._conn
        await conn.execute("BEGIN IMMEDIATE")
        try:
            await statements.write(conn, batch, changes)
            await conn.execute(
                "INSERT OR REPLACE INTO projection_position (name, seq, log_id, fold_version) VALUES (?, ?, ?, ?)",
                (POSITION_NAME, batch.last_seq, self._log_id, FOLD_VERSION),
            )
            await conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
            raise


# --------------------------------------------------------------------------- rebuild


async def rebuild(
    bus: Bus,
    db_path: str | os.PathLike,
    *,
    max_batch: int = REBUILD_BATCH,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Build the read models afresh from the whole log, as of its last sequence
    now, and put them at `db_path`; returns that sequence.

    Built in a temporary file beside it and renamed over it, so a reader sees
    the old database or the new one, never half of one. The new file is
    left in rollback-journal mode (no -wal beside it) until a projector opens
    it; the old database's -wal and -shm files go first, else SQLite would
    apply the old log of changes to the new file. A projector that was
    writing `db_path` meanwhile keeps writing the old file (its open handle)
    until its next batch, then sees the new one and starts again on it
    (DatabaseReplaced), from the position the new file stands at.
    `progress(at, last)` is called about once a second.
    """
    db_path = Path(db_path)
    tmp = db_path.with_name(f".{db_path.name}.rebuild-{os.getpid()}")
    _remove(tmp)
    last = await bus.last_seq()
    projector = Projector(bus, tmp, max_batch=max_batch)
    try:
        await projector.start()
        while not await projector.wait_for(last, timeout=1.0):
            if progress is not None:
                progress(projector.position, last)
        await projector.close()
        conn = await connect(tmp)
        try:
            # A self-contained file: everything checkpointed into it, no -wal.
            await conn.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
            await conn.execute_fetchall("PRAGMA journal_mode=DELETE")
        finally:
            await conn.close()
    except BaseException:
        await projector.close()
        _remove(tmp)
        raise
    for suffix in ("-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, db_path)
    _fsync_dir(db_path.parent)
    log.info("rebuilt %s from the log up to seq %d", db_path, last)
    return last


def _remove(path: Path) -> None:
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        p.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
