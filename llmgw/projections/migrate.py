"""Plain SQL migrations for the read models.

The schema lives in `projections/NNNN_name.sql` at the root of the repository
(files people read and review, not Python), applied in file-name order. Each
file runs in one transaction together with its row in `schema_migrations`,
so a migration is either wholly applied and recorded, or not at all; running
`migrate` again applies only what is new, and two processes migrating at once
end with every file applied once (the loser's transaction fails on the
table the winner created, rolls back, and finds the version recorded).

`schema_migrations` itself is made here, not by a migration: it is how
migrations are counted, so it must exist before the first one. A migration
file holds plain statements, no BEGIN or COMMIT of its own, and is never
edited once released: a change is a new file.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import aiosqlite


def _migrations_dir() -> Path:
    """$LLMGW_PROJECTIONS_SQL, else projections/ of the source tree this runs
    from (an editable install, the tests), else where a wheel would put the
    files (<prefix>/share/llmgw/projections: pyproject's data-files)."""
    if os.environ.get("LLMGW_PROJECTIONS_SQL"):
        return Path(os.environ["LLMGW_PROJECTIONS_SQL"])
    source = Path(__file__).resolve().parents[2] / "projections"
    if source.is_dir():
        return source
    return Path(sys.prefix) / "share" / "llmgw" / "projections"


MIGRATIONS_DIR = _migrations_dir()

_FILE = re.compile(r"^(\d+)_([A-Za-z0-9_\-]+)\.sql$")

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)
"""


class MigrationError(RuntimeError):
    pass


def migrations(directory: Path | None = None) -> list[tuple[int, str, Path]]:
    """(version, name, path) of every migration file, in order. Two files
    with one version number are refused: which one ran would be ambiguous."""
    directory = Path(directory or MIGRATIONS_DIR)
    if not directory.is_dir():
        raise MigrationError(f"no migrations directory at {directory} (set LLMGW_PROJECTIONS_SQL)")
    found: dict[int, tuple[int, str, Path]] = {}
    for path in sorted(directory.iterdir()):
        m = _FILE.match(path.name)
        if not m:
            continue
        version = int(m.group(1))
        if version in found:
            raise MigrationError(f"two migrations with version {version}: {found[version][2].name} and {path.name}")
        found[version] = (version, m.group(2), path)
    return [found[v] for v in sorted(found)]


async def applied(conn: aiosqlite.Connection) -> dict[int, str]:
    await conn.execute(_BOOTSTRAP)
    rows = await conn.execute_fetchall("SELECT version, name FROM schema_migrations ORDER BY version")
    return {v: n for v, n in rows}


async def migrate(conn: aiosqlite.Connection, directory: Path | None = None) -> list[int]:
    """Apply every migration not applied yet; returns the versions applied now.

    The connection must be in autocommit mode (isolation_level=None): each
    file is wrapped in its own BEGIN IMMEDIATE ... COMMIT here.
    """
    done = await applied(conn)
    now_applied: list[int] = []
    for version, name, path in migrations(directory):
        if version in done:
            continue
        sql = path.read_text()
        # `name` matched _FILE (letters, digits, _ and -): safe inside quotes.
        record = f"INSERT INTO schema_migrations VALUES ({version}, '{name}', {time.time()!r})"
        script = f"BEGIN IMMEDIATE;\n{sql}\n;\n{record};\nCOMMIT;\n"
        try:
            await conn.executescript(script)
        except Exception as e:
            if conn.in_transaction:
                await conn.rollback()
            if version in await applied(conn):
                continue  # another process applied it meanwhile
            raise MigrationError(f"migration {path.name} failed: {e}") from e
        now_applied.append(version)
    return now_applied
