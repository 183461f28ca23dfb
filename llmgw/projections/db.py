"""Opening the read-model database, and reading how far it is.

One writer (the projector), any number of readers (the CLI, tests). WAL
mode lets readers read a consistent snapshot while the projector writes, and
the projector never waits for them.

synchronous=NORMAL, not FULL: in WAL mode NORMAL never corrupts the file and
loses nothing when a process dies (kill -9 included: a commit is in the OS
before COMMIT returns); only a power cut or OS crash may forget the last few
commits. That is harmless here: the rows and projection_position go in one
transaction, so what survives is a consistent earlier position, and the
projector re-projects the tail from the log, which is the durable copy. FULL
would fsync on every commit for nothing the log does not already give.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

import aiosqlite

POSITION_NAME = "log"

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA busy_timeout=10000",
    "PRAGMA temp_store=MEMORY",
    "PRAGMA cache_size=-65536",  # 64 MiB: the entity tables and the recent index pages stay in memory
)


async def connect(path: str | Path) -> aiosqlite.Connection:
    """A connection in autocommit mode: transactions are explicit BEGIN/COMMIT."""
    # A new file is its owner's alone (SQLite gives its -wal and -shm the same
    # mode): the rows hold API-key hashes (issue 35). An existing one keeps the
    # mode an operator gave it.
    if str(path) != ":memory:":
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
    # The batch writer prepares ~60 statements (statements.py): all stay cached.
    conn = await aiosqlite.connect(str(path), isolation_level=None, cached_statements=256)
    for pragma in PRAGMAS:
        await conn.execute_fetchall(pragma)  # stepped to the end: no statement left open
    return conn


async def read_position(conn: aiosqlite.Connection) -> tuple[int, str, int]:
    """(seq, log_id, fold_version) the rows stand at; (0, '', 0) when empty."""
    rows = await conn.execute_fetchall(
        "SELECT seq, log_id, fold_version FROM projection_position WHERE name = ?", (POSITION_NAME,)
    )
    return tuple(rows[0]) if rows else (0, "", 0)  # type: ignore[return-value]


def position(path: str | Path) -> int:
    """How far the database at `path` is (0 when it does not exist or is empty).
    Plain sqlite3, for callers without an event loop."""
    try:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=10)
    except sqlite3.OperationalError:
        return 0
    try:
        row = conn.execute("SELECT seq FROM projection_position WHERE name = ?", (POSITION_NAME,)).fetchone()
        return row[0] if row else 0
    except sqlite3.OperationalError:  # not migrated yet
        return 0
    finally:
        conn.close()


async def wait_for_position(path: str | Path, seq: int, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Wait until the projection at `path` has reached `seq`: read-your-writes
    for a process that published an event (and got its sequence) and now
    wants to read the rows that include it. True when reached, False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if await asyncio.to_thread(position, path) >= seq:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
