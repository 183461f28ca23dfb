"""What the database holds, kept in memory, so a batch writes only what changed.

The entity tables are small (a row per model, node, replica and shard that
exists now), so the projector loads them once at start and afterwards knows,
without asking SQLite, what every row is. That buys three things:

* a row is written only when it differs: an event mentions its node and its
  model, but few events change them (most shard reports change one replica);
* the replicas the database shows on a node are known without a query, so a
  replica that left the state as a side effect of an event about its node
  (see `rows`) has its rows deleted;
* the integer ids of `entities` are known (`ids`), for `rows.fold` to
  number what each event mentions and the new ones it names.

Loaded from the database, not derived from the folded state, so the mirror
is what is on disk even if the two ever disagreed; the next write of an
entity then corrects it.
"""

from __future__ import annotations

import aiosqlite
import msgspec

from ..core.folding.state import State
from . import rows

_encode = msgspec.msgpack.Encoder().encode


class Changes:
    """The rows one batch writes, in the order the transaction applies them."""

    __slots__ = (
        "gone_models", "models", "gone_nodes", "nodes", "gone_shards", "gone_replicas", "replicas", "shards",
        "gone_quotas", "quotas", "gone_domains", "domains",
    )

    def __init__(self) -> None:
        self.gone_models: list[tuple] = []
        self.models: list[tuple] = []
        self.gone_nodes: list[tuple] = []
        self.nodes: list[tuple] = []
        self.gone_shards: list[tuple] = []
        self.gone_replicas: list[tuple] = []
        self.replicas: list[tuple] = []
        self.shards: list[tuple] = []
        self.gone_quotas: list[tuple] = []
        self.quotas: list[tuple] = []
        self.gone_domains: list[tuple] = []
        self.domains: list[tuple] = []


class Mirror:
    """The entity tables' rows and the entity ids, as the database holds them."""

    def __init__(self) -> None:
        self.models: dict[str, tuple] = {}
        self.nodes: dict[str, tuple] = {}
        self.replicas: dict[str, tuple] = {}
        self.shards: dict[str, dict[str, tuple]] = {}  # replica -> shard id -> row
        self.on_node: dict[str, set[str]] = {}  # node -> replicas with a shard row there
        self.ids: dict[tuple[str, str], int] = {}  # (kind, name) -> entities.id
        self.quotas: dict[str, tuple] = {}
        self._quota_basis: bytes | None = None  # owners and usage the quota rows were made from
        self.domains: dict[str, tuple] = {}
        self._domain_basis: bytes | None = None  # holds and caps the domain rows were made from

    async def load(self, conn: aiosqlite.Connection) -> None:
        self.__init__()

        async def select(table: str) -> list[tuple]:
            columns = ", ".join(rows.COLUMNS[table])
            return [tuple(r) for r in await conn.execute_fetchall(f"SELECT {columns} FROM {table}")]

        self.models = {row[0]: row for row in await select("models")}
        self.nodes = {row[0]: row for row in await select("nodes")}
        self.replicas = {row[0]: row for row in await select("replicas")}
        for row in await select("shards"):
            self.shards.setdefault(row[1], {})[row[0]] = row
            self.on_node.setdefault(row[2], set()).add(row[1])
        self.ids = {(kind, name): id_ for id_, kind, name in await select("entities")}
        self.quotas = {row[0]: row for row in await select("quotas")}
        self.domains = {row[0]: row for row in await select("domains")}

    def changes(self, state: State, batch: rows.Batch) -> Changes:
        """The writes that bring the database from what it holds to `state`
        for every entity `batch` may have changed. Updates the mirror: call it
        once per batch, and write what it returns (or give up the mirror)."""
        out = Changes()
        for name in sorted(batch.models):
            m = state.models.get(name)
            self._put(self.models, name, rows.model_row(m) if m is not None else None, out.models, out.gone_models)
        for name in sorted(batch.nodes):
            n = state.nodes.get(name)
            self._put(self.nodes, name, rows.node_row(n) if n is not None else None, out.nodes, out.gone_nodes)
        replicas = set(batch.replicas)
        if batch.nodes:
            replicas |= rows.replicas_on(state, batch.nodes)
            for name in batch.nodes:
                replicas |= self.on_node.get(name, set())
        for rid in sorted(replicas):
            self._replica(state, rid, out)
        self._quotas(state, out)
        self._domains(state, batch, out)
        return out

    def _domains(self, state: State, batch: rows.Batch, out: Changes) -> None:
        """Domain rows change with the nodes in them (GPUs used, draw,
        location) and with holds and caps: made again only when either did
        (they read every node)."""
        basis = _encode((state.holds, state.budgets))
        if not batch.nodes and basis == self._domain_basis:
            return
        self._domain_basis = basis
        new = rows.domain_rows(state)
        for d in sorted(set(self.domains) | set(new)):
            self._put(self.domains, d, new.get(d), out.domains, out.gone_domains)

    def _quotas(self, state: State, out: Changes) -> None:
        """Quota rows change with the owners and what they hold: made again
        only when either did (a few owners, but `borrowed` reads every replica)."""
        basis = _encode((state.owners, state.usage))
        if basis == self._quota_basis:
            return
        self._quota_basis = basis
        new = rows.quota_rows(state)
        for owner in sorted(set(self.quotas) | set(new)):
            self._put(self.quotas, owner, new.get(owner), out.quotas, out.gone_quotas)

    @staticmethod
    def _put(have: dict, key: str, row: tuple | None, upserts: list, deletes: list) -> None:
        old = have.get(key)
        if row is None:
            if old is not None:
                del have[key]
                deletes.append((key,))
        elif row != old:
            have[key] = row
            upserts.append(row)

    def _replica(self, state: State, rid: str, out: Changes) -> None:
        rep = state.replicas.get(rid)
        row = rows.replica_row(rep, state) if rep is not None else None
        self._put(self.replicas, rid, row, out.replicas, out.gone_replicas)
        new = {s[0]: s for s in rows.shard_rows(rep)} if rep is not None else {}
        old = self.shards.get(rid, {})
        if new == old:
            return
        for sid, s in old.items():
            if sid not in new:
                out.gone_shards.append((sid,))
            self.on_node.get(s[2], set()).discard(rid)
        for sid, s in new.items():
            if old.get(sid) != s:
                out.shards.append(s)
            self.on_node.setdefault(s[2], set()).add(rid)
        if new:
            self.shards[rid] = new
        else:
            self.shards.pop(rid, None)
