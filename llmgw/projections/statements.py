"""The SQL that writes one batch's rows, and how it is fed to SQLite fast.

Rows go in as multi-row INSERTs (`INSERT ... VALUES (...), (...), ...`) of
up to MAX_PARAMS parameters (999 is the smallest limit an SQLite build may
have): one statement step per few hundred rows instead of one per row,
which halves the cost of the narrow, numerous rows (event_mentions: ~4 per
event). A batch's rows are cut into statements of a few fixed sizes, so
each statement is prepared once and stays in the connection's cache.

Mentions arrive packed, one int each (entity id << rows.SEQ_BITS | seq),
sorted: SQLite unpacks them with >> and &, so Python neither makes nor
flattens a tuple per mention, and in key order each B-tree page of
event_mentions is visited once per batch.

Entity rows are upserts (INSERT OR REPLACE on the primary key) and deletes:
the mirror (`mirror.py`) has already dropped every row that did not change.
"""

from __future__ import annotations

from itertools import chain

import aiosqlite

from . import rows
from .mirror import Changes

# Entity tables are written by upsert on their primary key.
_UPSERT = {"models", "nodes", "replicas", "shards", "quotas", "domains"}
# (the statement up to VALUES, columns per row) of every insert.
INSERT = {
    table: (f"INSERT {'OR REPLACE ' if table in _UPSERT else ''}INTO {table} ({', '.join(cols)}) VALUES ", len(cols))
    for table, cols in rows.COLUMNS.items()
}
DELETE = {
    "models": "DELETE FROM models WHERE name = ?",
    "nodes": "DELETE FROM nodes WHERE name = ?",
    "replicas": "DELETE FROM replicas WHERE id = ?",
    "shards": "DELETE FROM shards WHERE id = ?",
    "quotas": "DELETE FROM quotas WHERE owner = ?",
    "domains": "DELETE FROM domains WHERE domain = ?",
}
MAX_PARAMS = 990
_SMALLER = (256, 64, 16, 4, 1)
PACKED = "packed mentions"


def _sizes(params_per_row: int) -> tuple[int, ...]:
    most = MAX_PARAMS // params_per_row
    return (most, *(n for n in _SMALLER if n < most))


def _statement(table: str, n: int) -> str:
    head, ncols = INSERT[table]
    one = "(" + ",".join("?" * ncols) + ")"
    return head + ",".join([one] * n)


def _packed_statement(n: int) -> str:
    one = "(?{i} >> %d, ?{i} & %d)" % (rows.SEQ_BITS, rows.SEQ_MASK)
    return INSERT["event_mentions"][0] + ",".join(one.format(i=i) for i in range(1, n + 1))


_SIZES = {table: _sizes(ncols) for table, (_, ncols) in INSERT.items()}
_SIZES[PACKED] = _sizes(1)
_STATEMENTS = {(table, n): _statement(table, n) for table in INSERT for n in _SIZES[table]}
_STATEMENTS.update({(PACKED, n): _packed_statement(n) for n in _SIZES[PACKED]})


async def insert(conn: aiosqlite.Connection, table: str, values: list) -> None:
    """Insert rows (tuples; ints for PACKED) in as few statement steps, and
    calls into the connection's thread, as the fixed sizes allow."""
    flat = chain.from_iterable
    at, left = 0, len(values)
    for size in _SIZES[table]:
        count = left // size
        if not count:
            continue
        end = at + count * size
        if table == PACKED and size == 1:
            params = [(v,) for v in values[at:end]]
        elif table == PACKED:
            params = [values[i : i + size] for i in range(at, end, size)]
        elif size == 1:
            params = values[at:end]
        else:
            params = [list(flat(values[i : i + size])) for i in range(at, end, size)]
        await conn.executemany(_STATEMENTS[table, size], params)
        at, left = end, left - count * size


async def write(conn: aiosqlite.Connection, batch: rows.Batch, changes: Changes) -> None:
    """Every row of one batch, inside the caller's transaction."""
    await insert(conn, "events", batch.events)
    if batch.entities:
        await insert(conn, "entities", batch.entities)
    await insert(conn, PACKED, sorted(batch.mentions))
    if batch.decisions:
        await insert(conn, "decisions", batch.decisions)
    if batch.quarantined:
        await insert(conn, "quarantined", batch.quarantined)
    if batch.preemptions:
        await insert(conn, "preemptions", batch.preemptions)
    for table, gone, upserts in (
        ("models", changes.gone_models, changes.models),
        ("nodes", changes.gone_nodes, changes.nodes),
        ("shards", changes.gone_shards, ()),
        ("replicas", changes.gone_replicas, changes.replicas),
        ("shards", (), changes.shards),
        ("quotas", changes.gone_quotas, changes.quotas),
        ("domains", changes.gone_domains, changes.domains),
    ):
        if gone:
            await conn.executemany(DELETE[table], gone)
        if upserts:
            await insert(conn, table, upserts)
