"""Reading the SQLite read models, for `llmgw ctl get` and `describe`.

The projector is the only writer; this opens the file read-only, so a
mistyped path never creates an empty database, and a reader can never take
a write lock the projector would wait on. Each call is one read transaction
(WAL gives it a consistent snapshot), so a listing never mixes two moments.

Rows come back as plain dicts with their JSON columns decoded: what
`-o json` prints, and what the tables for people are made from.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from ..projections.db import POSITION_NAME

# The JSON columns of each table (projections/0001_initial.sql).
_JSON = {
    "models": ("aliases", "profiles", "routing"),
    "nodes": ("gpus", "labels", "strays", "location", "unadmitted"),
    "replicas": ("rejections",),
    "shards": ("gpus",),
    "quotas": ("guarantee", "limits", "usage", "borrowed"),
    "preemptions": ("victims",),
}


class NoReadModels(LookupError):
    """There is no read-model database to read (or it was never migrated)."""


class ReadModels:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise NoReadModels(
                f"there are no read models at {self.path}: is `llmgw up` (or the projector) running? "
                f"give the database with --db"
            )
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        return conn

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        conn = self._connect()
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise NoReadModels(f"the database at {self.path} has no read models yet (the projector makes them)")
            raise
        finally:
            conn.close()

    def _rows(self, table: str, sql: str, args: tuple = ()) -> list[dict]:
        json_columns = _JSON.get(table, ())
        out = []
        for row in self._query(sql, args):
            d = dict(row)
            for c in json_columns:
                if c in d:
                    d[c] = json.loads(d[c])
            out.append(d)
        return out

    # ----------------------------------------------------------------- position

    def position(self) -> int:
        """The sequence of the last event the rows include."""
        rows = self._query("SELECT seq FROM projection_position WHERE name = ?", (POSITION_NAME,))
        return rows[0][0] if rows else 0

    # ----------------------------------------------------------------- listings

    def models(self) -> list[dict]:
        return self._rows(
            "models",
            """SELECT m.*,
                      (SELECT count(*) FROM replicas r WHERE r.model = m.name) AS replicas,
                      (SELECT count(*) FROM replicas r WHERE r.model = m.name AND r.state = 'ready') AS ready
               FROM models m ORDER BY m.name""",
        )

    def nodes(self) -> list[dict]:
        return self._rows("nodes", "SELECT * FROM nodes ORDER BY name")

    def domains(self) -> list[dict]:
        """The facility's domains (core/scheduling/facility.py DomainRow), by kind and name."""
        rows = self._rows("domains", "SELECT * FROM domains")
        order = {k: i for i, k in enumerate(("site", "room", "row", "rack", "pdu"))}
        for r in rows:
            r["held"], r["drain"] = bool(r["held"]), bool(r["drain"])
        return sorted(rows, key=lambda r: (order.get(r["kind"], 9), r["name"]))

    def replicas(self, model: str | None = None) -> list[dict]:
        """Replicas with their shards (in rank order) and endpoint (rank 0's)."""
        where, args = ("WHERE model = ?", (model,)) if model else ("", ())
        replicas = self._rows("replicas", f"SELECT * FROM replicas {where} ORDER BY model, id", args)
        by_id = {r["id"]: r for r in replicas}
        for r in replicas:
            r["shards"] = []
        shards = self._rows("shards", "SELECT * FROM shards ORDER BY replica, rank")
        for s in shards:
            r = by_id.get(s["replica"])
            if r is not None:
                r["shards"].append(s)
        for r in replicas:
            r["nodes"] = [s["node"] for s in r["shards"]]
            r["endpoint"] = r["shards"][0]["endpoint"] if r["shards"] else ""
        return replicas

    @staticmethod
    def _after(where: str, args: tuple, after: tuple[int, int] | None) -> tuple[str, tuple]:
        if after is None:
            return where, args
        clause = "(seq > ? OR (seq = ? AND idx > ?))"
        where = f"{where} AND {clause}" if where else f"WHERE {clause}"
        return where, (*args, after[0], after[0], after[1])

    @staticmethod
    def _before(where: str, args: tuple, before: int | None) -> tuple[str, tuple]:
        """Only rows of events up to sequence `before` (the console's time travel)."""
        if before is None:
            return where, args
        return (f"{where} AND seq <= ?" if where else "WHERE seq <= ?"), (*args, before)

    def decisions(
        self, *, model: str | None = None, limit: int = 50, after: tuple[int, int] | None = None,
        before: int | None = None,
    ) -> list[dict]:
        """The latest `limit` decisions (0: all), oldest first; `after`: only those after (seq, idx);
        `before`: only those of events up to that sequence."""
        where, args = ("WHERE model = ?", (model,)) if model else ("", ())
        where, args = self._after(where, args, after)
        where, args = self._before(where, args, before)
        limit_sql = "LIMIT ?" if limit else ""
        if limit:
            args = (*args, limit)
        rows = self._rows(
            "decisions", f"SELECT * FROM decisions {where} ORDER BY seq DESC, idx DESC {limit_sql}", args
        )
        return rows[::-1]

    def quotas(self) -> list[dict]:
        return self._rows("quotas", "SELECT * FROM quotas ORDER BY owner")

    def preemptions(
        self, *, model: str | None = None, limit: int = 50, after: tuple[int, int] | None = None,
        before: int | None = None,
    ) -> list[dict]:
        """The latest `limit` preemptions (0: all), oldest first; `model`: for it or taking from it;
        `after`: only those after (seq, idx)."""
        where, args = "", ()
        if model:
            where = "WHERE (model = ? OR EXISTS (SELECT 1 FROM json_each(victims) v WHERE json_extract(v.value, '$.model') = ?))"
            args = (model, model)
        where, args = self._after(where, args, after)
        where, args = self._before(where, args, before)
        limit_sql = "LIMIT ?" if limit else ""
        if limit:
            args = (*args, limit)
        rows = self._rows("preemptions", f"SELECT * FROM preemptions {where} ORDER BY seq DESC, idx DESC {limit_sql}", args)
        return rows[::-1]

    def names(self, kind: str) -> list[str]:
        """Every name of a kind (model, replica, node) the log ever mentioned: for "did you mean"."""
        return [r[0] for r in self._query("SELECT name FROM entities WHERE kind = ?", (kind,))]

    def quarantined(self) -> list[dict]:
        return self._rows("quarantined", "SELECT * FROM quarantined ORDER BY seq")

    # ----------------------------------------------------------------- one thing

    def model(self, name: str) -> dict | None:
        return next((m for m in self.models() if m["name"] == name), None)

    def node(self, name: str) -> dict | None:
        rows = self._rows("nodes", "SELECT * FROM nodes WHERE name = ?", (name,))
        return rows[0] if rows else None

    def replica(self, rid: str) -> dict | None:
        rows = self._rows("replicas", "SELECT * FROM replicas WHERE id = ?", (rid,))
        if not rows:
            return None
        r = rows[0]
        r["shards"] = self._rows("shards", "SELECT * FROM shards WHERE replica = ? ORDER BY rank", (rid,))
        r["nodes"] = [s["node"] for s in r["shards"]]
        r["endpoint"] = r["shards"][0]["endpoint"] if r["shards"] else ""
        return r

    def shards_on(self, node: str) -> list[dict]:
        return self._rows("shards", "SELECT * FROM shards WHERE node = ? ORDER BY id", (node,))

    def known(self, kind: str, name: str) -> bool:
        """Whether the log ever mentioned this model, replica or node."""
        return bool(self._query("SELECT 1 FROM entities WHERE kind = ? AND name = ?", (kind, name)))

    def history(self, kind: str, name: str) -> list[dict]:
        """Every event about one thing, oldest first, each with the decisions
        of its event that concern the thing (what was decided, why, and why
        the fold voided it if it did)."""
        events = self._rows(
            "events",
            """SELECT e.seq, e.at, e.type, e.subject, e.summary
               FROM entities x JOIN event_mentions m ON m.entity = x.id JOIN events e ON e.seq = m.seq
               WHERE x.kind = ? AND x.name = ? ORDER BY e.seq""",
            (kind, name),
        )
        column = {"model": "model", "replica": "replica"}.get(kind)
        decided = [e["seq"] for e in events if e["type"] in ("control.decided", "node.lost")]
        by_seq: dict[int, list[dict]] = {}
        if decided:
            marks = ",".join("?" * len(decided))
            for d in self._rows("decisions", f"SELECT * FROM decisions WHERE seq IN ({marks}) ORDER BY seq, idx",
                                tuple(decided)):
                concerns = d[column] == name if column else name in d["node"].split(",")
                if concerns:
                    by_seq.setdefault(d["seq"], []).append(d)
        for e in events:
            e["decisions"] = by_seq.get(e["seq"], [])
        return events
