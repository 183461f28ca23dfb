"""What each view of the console shows, as JSON-ready data, made from a
folded State (now, or as it stood at any point of the log) and the read models.

WHY the entity views (models, replicas, quotas; the fleet in fleetmap.py) come from a State and
not from the SQLite rows: time travel folds the log to a point with the pure
core, and the same functions must render now and then alike; the rows are
made with the projector's own row functions (projections/rows.py), so they
have the read models' columns. The history tables (decisions, preemptions,
a node's events) come from the read models, cut at the point.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgspec

from ..core.contract import events as ev
from ..core.simulation.history import Record, _said, summary
from ..core.folding.state import State
from ..ctl.readmodels import ReadModels
from ..ctl.views import decision_words
from ..projections.rows import COLUMNS, model_row, node_row, quota_rows, replica_row, shard_rows
from ..core.folding import facility_facts
from .config import CONFIG


def _as_dict(table: str, row: tuple) -> dict:
    d = dict(zip(COLUMNS[table], row))
    for k, v in d.items():
        if isinstance(v, str) and v[:1] in "[{" and k in ("aliases", "profiles", "gpus", "labels", "strays",
                                                          "guarantee", "limits", "usage", "borrowed", "routing"):
            d[k] = json.loads(v)
    return d


def shard_models(state: State) -> dict[str, tuple[str, str]]:
    """shard id -> (model, replica) for every shard of the state."""
    return {s.id: (r.model, r.id) for r in state.replicas.values() for s in r.shards}


def node(state: State, name: str, models: ReadModels | None) -> dict | None:
    n = state.nodes.get(name)
    if n is None:
        return None
    row = _as_dict("nodes", node_row(n))
    row["labels"] = facility_facts.effective_labels(n)
    of_shard = shard_models(state)
    for g in row["gpus"]:
        g["model_running"], g["replica"] = of_shard.get(g["shard"], ("", "")) if g["shard"] else ("", "")
    row["loc"] = facility_facts.location(n)
    row["memory_used"], row["cpu_used"] = n.memory_used, n.cpu_used
    history = []
    if models is not None:
        try:
            history = models.history("node", name)
        except LookupError:
            history = []
        history = [e for e in history if e["seq"] <= state.seq]
        for e in history:
            for d in e["decisions"]:
                d["words"] = decision_words(d)
    row["history"] = history[-CONFIG.history_limit:]
    return row


def models_view(state: State) -> list[dict]:
    out = []
    counts: dict[str, list[int]] = {}
    for r in state.replicas.values():
        c = counts.setdefault(r.model, [0, 0])
        c[0] += 1
        c[1] += r.state == "ready"
    usage = {o: msgspec.to_builtins(u) for o, u in state.usage.items()}
    for name, m in sorted(state.models.items()):
        d = _as_dict("models", model_row(m))
        d["replicas"], d["ready"] = counts.get(name, [0, 0])
        d["priority"] = m.spec.priority
        d["usage"] = usage.get(m.spec.owner, {})
        out.append(d)
    return out


def replicas_view(state: State, limit: int = 0) -> list[dict]:
    """The replicas in model then id order; the first `limit` only (0: all).

    WHY a limit: the page draws 500 rows until asked for all, and rows for
    5,000 replicas cost more to make, send and parse than the 500 to draw
    (benchmarks/console.py)."""
    out = []
    chosen = sorted(state.replicas.values(), key=lambda r: (r.model, r.id))
    for r in chosen[:limit] if limit > 0 else chosen:
        d = _as_dict("replicas", replica_row(r, state))
        shards = [_as_dict("shards", s) for s in shard_rows(r)]
        d["nodes"] = [s["node"] for s in sorted(shards, key=lambda s: s["rank"])]
        d["endpoint"] = next((s["endpoint"] for s in shards if s["rank"] == 0), "")
        out.append(d)
    return out


def quotas_view(state: State) -> list[dict]:
    return [_as_dict("quotas", row) for row in quota_rows(state).values()]


def _seq_of(record: Record) -> int:
    return record[0]


def _decided(record: Record) -> ev.Decided | None:
    """The record's decision, if it is one (the bytes are looked at first: most are not)."""
    _seq, subject, data = record
    if not (subject.startswith("llmgw.control.") and b'"control.decided"' in data):
        return None
    try:
        e = ev.decode(data)
    except msgspec.MsgspecError:
        return None
    return e if isinstance(e, ev.Decided) else None


def decision_at(records: Sequence[Record], state: State, upto: int) -> dict | None:
    """The last decision at or before `upto`, in words with its reasons, and
    the facts it was taken on: the events from the decision before it to its
    basis (what the pass saw that the one before had not), and what the fold
    voided of it."""
    import bisect

    end = bisect.bisect_right(records, upto, key=_seq_of)
    found = next(((i, d) for i in range(end - 1, -1, -1) if (d := _decided(records[i])) is not None), None)
    if found is None:
        return None
    i, e = found
    seq = records[i][0]
    before = next((d for j in range(i - 1, -1, -1) if (d := _decided(records[j])) is not None), None)
    previous_basis = before.basis if before is not None else 0
    facts = []
    for s, _subject, data in records[bisect.bisect_right(records, previous_basis, key=_seq_of):]:
        if s > e.basis:
            break
        try:
            f = ev.decode(data)
        except msgspec.MsgspecError:
            continue
        if isinstance(f, (ev.Decided, ev.ModelLoad)):
            continue
        facts.append({"seq": s, "at": f.at, "type": ev.tag_of(type(f)), "summary": summary(f)})
    voided = [msgspec.to_builtins(v) for v in state.voided if v.seq == seq]
    return {
        "seq": seq, "at": e.at, "basis": e.basis, "leader": e.leader,
        "actions": [_said(a) for a in e.actions], "voided": voided,
        "facts": facts[-CONFIG.facts_limit:], "facts_total": len(facts),
    }
