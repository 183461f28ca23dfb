"""What `llmgw ctl get` and `describe` print: tables and pages for people,
JSON and YAML for tools. The rows are the read models' (readmodels.py); this
only chooses columns and words, and never hides a reason: reasons are shown
as the log has them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from ..text import table, when

KINDS = ("models", "nodes", "replicas", "decisions", "quotas", "preemptions", "leader")


def _age(at: float) -> str:
    return when(at) if at else ""


def _labels(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def decision_words(d: dict) -> str:
    """One decision in words, from its row."""
    kind = d["kind"]
    if kind == "place":
        return f"place {d['replica']} on {d['node']}"
    if kind == "stop":
        return f"stop {d['replica']}"
    if kind == "wait":
        return f"{d['model']} waits"
    if kind == "stop-stray":
        return f"stop stray of {d['replica']} on {d['node']}"
    if kind == "leader":
        return f"{d['leader']} leads"
    if kind == "node-lost":
        return f"node {d['node']} lost"
    if kind == "scale":
        return f"scale {d['model']}"
    if kind == "restart":
        return f"restart {d['replica']}"
    if kind == "refuse-restart":
        return f"refuse to restart {d['replica']}"
    if kind == "park":
        return f"park {d['model']}"
    return kind


# Per kind: the key that names a row, the header, and a row's cells.
COLUMNS: dict[str, tuple[str, list[str], Callable[[dict], list[str]]]] = {
    "models": (
        "name",
        ["NAME", "OWNER", "MIN", "MAX", "DESIRED", "READY", "PROFILES", "WAITING"],
        lambda m: [
            m["name"], m["owner"], str(m["min_replicas"]), str(m["max_replicas"]), str(m["desired"]),
            f"{m['ready']}/{m['replicas']}", ",".join(p["name"] for p in m["profiles"]), m["waiting"],
        ],
    ),
    "nodes": (
        "name",
        ["NAME", "STATE", "GPUS", "MEMORY", "CPUS", "LABELS", "STRAYS", "REASON"],
        lambda n: [
            n["name"], n["state"], f"{n['gpus_used']}/{n['gpus_total']} used", f"{n['memory_gb']:g} GB",
            str(n["cpu_cores"]), _labels(n["labels"]), str(len(n["strays"])), n["reason"],
        ],
    ),
    "replicas": (
        "id",
        ["ID", "MODEL", "PROFILE", "STATE", "RESTART", "NODES", "ENDPOINT", "REASON"],
        lambda r: [
            r["id"], r["model"], r["profile"], r["state"], r["restart"], ",".join(r["nodes"]), r["endpoint"], r["reason"],
        ],
    ),
    "quotas": (
        "owner",
        ["OWNER", "GUARANTEE", "LIMIT", "USAGE", "BORROWED"],
        lambda q: [
            q["owner"], _amount(q["guarantee"]), _amount(q["limits"], limit=True), _amount(q["usage"]),
            _amount(q["borrowed"]),
        ],
    ),
    "preemptions": (
        "key",
        ["SEQ", "TIME", "FOR", "VICTIMS (TIER)", "REASON", "BEFORE", "VOIDED"],
        lambda p: [
            str(p["seq"]), when(p["at"]), p["model"],
            ", ".join(f"{v['replica']} ({v['tier']}: {v['why']})" for v in p["victims"]),
            p["reason"], p["inventory"], p["voided"],
        ],
    ),
    "decisions": (
        "key",
        ["SEQ", "TIME", "DECISION", "REASON", "VOIDED", "LEADER"],
        lambda d: [str(d["seq"]), when(d["at"]), decision_words(d), d["reason"], d["voided"], d.get("leader", "")],
    ),
    # `get leader`: the lease holder and the standbys, live from the lease bucket.
    "leader": (
        "id",
        ["ROLE", "CONTROL PLANE", "TERM", "SINCE", "FOLDED TO", "BEHIND"],
        lambda r: [
            r["role"], r["id"], str(r["term"]) if r["term"] else "", when(r["since"]) if r["since"] else "",
            str(r["seq"]), str(r["behind"]),
        ],
    ),
}


def _amount(a: dict, limit: bool = False) -> str:
    """An amount of GPUs, cores and memory (what is not said is 0); of a
    limit, what is not said is not limited ("-")."""
    parts = []
    for key, unit in (("gpus", "GPUs"), ("cpu_cores", "cores"), ("memory_gb", "GB")):
        v = a.get(key)
        parts.append(f"{('-' if limit else '0') if v is None else format(v, 'g')} {unit}")
    return ", ".join(parts)


def key_of(kind: str, row: dict) -> str:
    if kind in ("decisions", "preemptions"):
        return f"{row['seq']}.{row['idx']}"
    return row[COLUMNS[kind][0]]


def render(kind: str, rows: list[dict], output: str) -> str:
    """A listing: a table, or the rows as one JSON or YAML document."""
    if output == "json":
        return json.dumps(rows, indent=2)
    if output == "yaml":
        return yaml.safe_dump(rows, sort_keys=False).rstrip()
    _, header, cells = COLUMNS[kind]
    if not rows:
        return f"no {kind}"
    return table([cells(r) for r in rows], header)


def render_change(kind: str, change: str, row: dict, output: str) -> str:
    """One change while watching: for tools, a JSON line (or YAML document)
    {"type": ADDED|MODIFIED|DELETED, "object": row}, as Kubernetes watches
    print them; for people, the row, with DELETED in front of a row that went."""
    if output == "json":
        return json.dumps({"type": change, "object": row})
    if output == "yaml":
        return "---\n" + yaml.safe_dump({"type": change, "object": row}, sort_keys=False).rstrip()
    _, header, cells = COLUMNS[kind]
    return table([[change, *cells(row)]], ["", *header]).splitlines()[1]


# --------------------------------------------------------------------------- describe


def _history(events: list[dict]) -> list[str]:
    """Each event in a line; a decision event in a line per decision about the thing."""
    lines = []
    for e in events:
        at = when(e["at"]) if e["at"] is not None else ""
        if e["decisions"]:
            for d in e["decisions"]:
                why = f": {d['reason']}" if d["reason"] else ""
                void = f"  [voided: {d['voided']}]" if d["voided"] else ""
                lines.append([str(e["seq"]), at, decision_words(d) + why + void])
        else:
            lines.append([str(e["seq"]), at, e["summary"]])
    return table(lines, ["SEQ", "TIME", "WHAT HAPPENED"]).splitlines() if lines else ["(none)"]


def _fields(pairs: list[tuple[str, object]]) -> list[str]:
    width = max(len(k) for k, _ in pairs) + 1
    return [f"{(k + ':').ljust(width)} {v}" for k, v in pairs]


def describe_text(kind: str, page: dict) -> str:
    """A page about one model, replica or node: what it is now, then its history."""
    out: list[str] = []
    now = page.get(kind)
    if kind == "model":
        if now is None:
            out.append(f"Model {page['name']}: not in the catalog now")
        else:
            out += _fields([
                ("Model", now["name"]), ("Owner", now["owner"]),
                ("Replicas", f"{now['ready']} ready of {now['replicas']} (min {now['min_replicas']}, max {now['max_replicas']})"),
                ("Aliases", ", ".join(now["aliases"]) or "(none)"),
                ("Desired", now["desired"]), ("Waiting", now["waiting"] or "(no)"),
                ("Parked", now["parked"] or "(no)"), ("Applied", _age(now["applied_at"])),
            ])
            out.append("Profiles (in order of preference):")
            for p in now["profiles"]:
                extra = ", ".join(f"{k} {v}" for k, v in p.items() if k not in ("name", "fingerprint") and v not in ("", [], {}, 0, 0.0))
                out.append(f"  {p['name']} (fingerprint {p['fingerprint']}): {extra}")
        out.append("Replicas:")
        reps = page.get("replicas", [])
        out += ["  " + line for line in render("replicas", reps, "table").splitlines()] if reps else ["  (none)"]
    elif kind == "replica":
        if now is None:
            out.append(f"Replica {page['name']}: gone")
        else:
            out += _fields([
                ("Replica", now["id"]), ("Model", now["model"]),
                ("Profile", f"{now['profile']} (fingerprint {now['fingerprint']})"),
                ("State", now["state"]), ("Reason", now["reason"] or "(none)"),
                ("Restart", (now["restart"] + (f": {now['restart_reason']}" if now.get("restart_reason") else ""))
                 or "(none)"),
                ("Endpoint", now["endpoint"] or "(none)"),
                ("Placed", _age(now["placed_at"])), ("Ready", _age(now["ready_at"]) or "(not yet)"),
            ])
            out.append("Shards:")
            rows = [[s["id"], s["node"], str(s["rank"]), ",".join(map(str, s["gpus"])), str(s["port"]),
                     str(s["generation"]), s["state"], s["reason"]] for s in now["shards"]]
            header = ["ID", "NODE", "RANK", "GPUS", "PORT", "GENERATION", "STATE", "REASON"]
            out += ["  " + line for line in table(rows, header).splitlines()] if rows else ["  (none)"]
    elif kind == "node":
        if now is None:
            out.append(f"Node {page['name']}: not registered now")
        else:
            out += _fields([
                ("Node", now["name"]), ("State", now["state"]), ("Reason", now["reason"] or "(none)"),
                ("Agent", now["agent"]), ("GPUs", f"{now['gpus_used']} used of {now['gpus_total']}"),
                ("Memory", f"{now['memory_gb']:g} GB"), ("CPU cores", now["cpu_cores"]),
                ("Labels", _labels(now["labels"]) or "(none)"), ("Registered", _age(now["registered_at"])),
            ])
            out.append("GPUs:")
            rows = [[str(g["index"]), g["model"], f"{g['memory_gb']:g} GB", g["shard"] or "free"] for g in now["gpus"]]
            out += ["  " + line for line in table(rows, ["INDEX", "MODEL", "MEMORY", "HELD BY"]).splitlines()] if rows else ["  (none)"]
            out.append("Strays (running, not ours: being stopped):")
            rows = [[shard, str(s.get("port", "")), s.get("reason", "")] for shard, s in sorted(now["strays"].items())]
            out += ["  " + line for line in table(rows, ["SHARD", "PORT", "REASON"]).splitlines()] if rows else ["  (none)"]
    out.append("History:")
    out += ["  " + line for line in _history(page["history"])]
    return "\n".join(out)


def describe(kind: str, page: dict, output: str) -> str:
    if output == "json":
        return json.dumps(page, indent=2)
    if output == "yaml":
        return yaml.safe_dump(page, sort_keys=False).rstrip()
    return describe_text(kind, page)
