"""What `llmgw ctl get` and `describe` print: tables and pages for people,
JSON and YAML for tools. The rows are the read models' (readmodels.py); this
only chooses columns and words, and never hides a reason: reasons are shown
as the log has them, their control characters escaped (printable.py: a
node's label carried terminal escape codes to the operator's terminal).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import yaml

from ..core.folding.facility_facts import KINDS as KINDS_OF_PLACE
from ..core.scheduling.facility import watts as _watts
from ..core.contract.reasons import TIERS
from ..text import table, when
from .printable import printable, printable_data, printable_lines  # noqa: F401 (the CLI's printers use them from here)

KINDS = (
    "models", "nodes", "replicas", "decisions", "quotas", "preemptions", "domains", "owners", "apikeys", "leader", "policy",
    "usage",
)  # fmt: skip
# Every name a kind goes by, as kubectl takes them: plural, singular, short.
KIND_NAMES = {
    "models": ("model", "mo"),
    "nodes": ("node", "no"),
    "replicas": ("replica", "rs"),
    "decisions": ("decision", "dec"),
    "quotas": ("quota", "q"),
    "preemptions": ("preemption", "pre"),
    "domains": ("domain", "dom"),
    "owners": ("owner", "own"),
    "apikeys": ("apikey", "keys", "key", "api-key", "api-keys"),
    "leader": ("leaders", "lead"),
    "policy": ("policies", "pol"),
    "usage": ("usages", "use"),
}
SINGULAR = {kind: names[0] for kind, names in KIND_NAMES.items()}
ALIASES = {name: kind for kind, names in KIND_NAMES.items() for name in (kind, *names)}
OUTPUTS = ("table", "wide", "name", "json", "yaml")


def _age(at: float) -> str:
    return when(at) if at else ""


def _location(location: dict) -> str:
    """A node's location, broadest first: site=dc1,rack=r4-12,pdu=pdu-a."""
    return ",".join(f"{k}={location[k]}" for k in KINDS_OF_PLACE if k in location)


def _number(value) -> str:
    """A policy's value: a number as %g, a word (admission: operator) as it is."""
    return value if isinstance(value, str) else format(value, "g")


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
    if kind == "node-muted":
        return f"node {d['node']} muted"
    if kind == "scale":
        return f"scale {d['model']}"
    if kind == "restart":
        return f"restart {d['replica']}"
    if kind == "refuse-restart":
        return f"refuse to restart {d['replica']}"
    if kind == "park":
        return f"park {d['model']}"
    return kind


def _replica_reason(r: dict) -> str:
    """Why a replica is as it is, when that is worth a look: a ready replica's
    reason is why it was placed, history now (describe shows it)."""
    return "" if r["state"] == "ready" else r["reason"]


# Per kind: the key that names a row, the header, a row's cells, and the
# columns of -o wide after them. Columns of free text (FLEX) give way to fit
# the terminal; -o wide prints them whole.
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
        ["NAME", "STATE", "GPUS", "MEMORY", "CPUS", "LOCATION", "LABELS", "STRAYS", "REASON"],
        lambda n: [
            n["name"], n["state"], f"{n['gpus_used']}/{n['gpus_total']} used", f"{n['memory_gb']:g} GB",
            str(n["cpu_cores"]), _location(n.get("location", {})), _labels(n["labels"]), str(len(n["strays"])),
            n["reason"],
        ],
    ),
    # `ctl facility` (and `get domains`): core/scheduling/facility.py's DomainRow.
    "domains": (
        "domain",
        ["DOMAIN", "NODES", "GPUS", "DRAW", "CAP", "HELD", "REASON"],
        lambda d: [
            d["domain"], str(d["nodes"]), f"{d['gpus_used']} used, {d['gpus_free']} free", _watts(d["draw_w"]),
            _watts(d["cap_w"]) if d["cap_w"] else "none",
            ("drain" if d["drain"] else "held") + f" since {when(d['held_at'])}" if d["held"] else "no",
            d["hold_reason"],
        ],
    ),
    "replicas": (
        "id",
        ["ID", "MODEL", "PROFILE", "STATE", "RESTART", "NODES", "ENDPOINT", "REASON"],
        lambda r: [
            r["id"], r["model"], r["profile"], r["state"], r["restart"], ",".join(r["nodes"]), r["endpoint"],
            _replica_reason(r),
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
            ", ".join(f"{v['replica']} ({v['tier']}: {TIERS.get(v['tier'], v['why'])})" for v in p["victims"]),
            p["reason"], p["inventory"], p["voided"],
        ],
    ),
    "decisions": (
        "key",
        ["SEQ", "TIME", "DECISION", "REASON", "VOIDED"],
        lambda d: [str(d["seq"]), when(d["at"]), decision_words(d), d["reason"], d["voided"]],
    ),
    # `get owners`: the catalog's owners, folded from the operators' events (never the key hashes).
    "owners": (
        "name",
        ["OWNER", "PARENT", "GUARANTEE", "LIMIT", "MODELS", "API KEYS"],
        lambda o: [
            o["name"], o["parent"], _amount(o["guarantee"]), _amount(o["limit"], limit=True), ",".join(o["models"]),
            ",".join(o["api_keys"]),
        ],
    ),
    # `get apikeys`: names, owners and limits; a key's hash is never a column, nor in the row.
    "apikeys": (
        "name",
        ["NAME", "OWNER", "REQUESTS/MIN", "TOKENS/MIN"],
        lambda k: [k["name"], k["owner"], _per_minute(k["requests_per_minute"]), _per_minute(k["tokens_per_minute"])],
    ),
    # `get usage`: the gateways' usage reports summed per key, owner and model (ctl/usage.py).
    "usage": (
        "id",
        ["KEY", "OWNER", "MODEL", "REQUESTS", "TOKENS IN", "TOKENS OUT", "REFUSED", "SPEND"],
        lambda u: [
            u["key"] or "-", u["owner"] or "-", u["model"], str(u["requests"]), str(u["tokens_in"]), str(u["tokens_out"]),
            str(u["refused"]), format(u["spend"], ".4f") if u["priced"] else "",
        ],
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
    # `get policy`: the numbers the rules decide with, folded from the operators' events.
    "policy": (
        "field",
        ["FIELD", "VALUE", "DEFAULT", "SET AT"],
        lambda r: [r["field"], _number(r["value"]), _number(r["default"]), str(r["seq"]) if r["seq"] else ""],
    ),
}

WIDE: dict[str, tuple[list[str], Callable[[dict], list[str]]]] = {
    "models": (
        ["ALIASES", "PARKED", "APPLIED"],
        lambda m: [",".join(m["aliases"]), m["parked"], _age(m["applied_at"])],
    ),
    "nodes": (["AGENT", "REGISTERED", "DRAW"], lambda n: [n["agent"], _age(n["registered_at"]), _watts(n.get("power_w", 0.0))]),
    "domains": (["KIND", "NAME"], lambda d: [d["kind"], d["name"]]),
    "replicas": (
        ["FINGERPRINT", "PLACED", "READY AT", "WHY PLACED"],
        lambda r: [r["fingerprint"], _age(r["placed_at"]), _age(r["ready_at"]), r["reason"] if r["state"] == "ready" else ""],
    ),
    "quotas": ([], lambda q: []),
    "preemptions": (["VICTIM MODELS"], lambda p: [",".join(sorted({v.get("model", "") for v in p["victims"]}))]),
    # Who decided: in -o wide (and a row of its own at each election), so the table fits a terminal.
    "decisions": (
        ["KIND", "MODEL", "REPLICA", "NODE", "LEADER"],
        lambda d: [d["kind"], d["model"], d["replica"], d["node"], d.get("leader", "")],
    ),
    "policy": ([], lambda r: []),
    "owners": ([], lambda o: []),
    "apikeys": ([], lambda k: []),
    "usage": (["SINCE"], lambda u: [_age(u["since"])]),
}

FLEX = {"MODELS", "API KEYS", "REASON", "WAITING", "LABELS", "VICTIMS (TIER)", "BEFORE", "VOIDED", "DECISION", "PROFILES", "WHY PLACED"}
MIN_FLEX = 12  # a column of free text is cut to no fewer characters


def _amount(a: dict, limit: bool = False) -> str:
    """An amount of GPUs, cores and memory (what is not said is 0); of a
    limit, what is not said is not limited ("-")."""
    parts = []
    for key, unit in (("gpus", "GPUs"), ("cpu_cores", "cores"), ("memory_gb", "GB")):
        v = a.get(key)
        parts.append(f"{('-' if limit else '0') if v is None else format(v, 'g')} {unit}")
    return ", ".join(parts)


def _per_minute(n: int) -> str:
    """A key's limit a minute: 0 is none ("-")."""
    return str(n) if n else "-"


def terminal_width() -> int | None:
    """The width tables fit on a terminal: $COLUMNS, else the terminal's. None
    (no limit) when the output is not a terminal: a pipe or a file gets every
    character, as kubectl gives them."""
    if not sys.stdout.isatty():
        return None
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    return shutil.get_terminal_size().columns


def header_of(kind: str, output: str) -> list[str]:
    _, header, _ = COLUMNS[kind]
    return header + (WIDE[kind][0] if output == "wide" else [])


def cells_of(kind: str, row: dict, output: str) -> list[str]:
    _, _, cells = COLUMNS[kind]
    return cells(row) + (WIDE[kind][1](row) if output == "wide" else [])


def widths_of(lines: list[list[str]], header: list[str], width: int | None) -> list[int]:
    """Each column's width: its widest cell; then, if the whole is wider than
    `width`, the widest columns of free text cut down (never below MIN_FLEX)."""
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    if width is None:
        return widths
    while sum(widths) + 2 * (len(widths) - 1) > width:
        flexible = [i for i, h in enumerate(header) if h in FLEX and widths[i] > MIN_FLEX]
        if not flexible:
            break
        i = max(flexible, key=lambda i: widths[i])
        over = sum(widths) + 2 * (len(widths) - 1) - width
        widths[i] = max(MIN_FLEX, widths[i] - over)
    return widths


def line_of(cells: list[str], widths: list[int]) -> str:
    out = []
    for c, w in zip(cells, widths):
        c = str(c)
        out.append(c if len(c) <= w else c[: w - 1] + "…")
        out[-1] = out[-1].ljust(w)
    return "  ".join(out).rstrip()


def key_of(kind: str, row: dict) -> str:
    if kind in ("decisions", "preemptions"):
        return f"{row['seq']}.{row['idx']}"
    return row[COLUMNS[kind][0]]


def name_of(kind: str, row: dict) -> str:
    """A row as `-o name` prints it: kind/name, as kubectl does."""
    return f"{SINGULAR[kind]}/{key_of(kind, row)}"


def iso(at: float | int | None) -> str | None:
    """A time of the log in ISO 8601, UTC; None for none (0)."""
    if not at:
        return None
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_iso_times(data):
    """Beside every time (`at`, `*_at`: Unix seconds), the same in ISO 8601
    UTC (`at_iso`, `*_at_iso`): what -o json and yaml print, in every kind."""
    if isinstance(data, list):
        return [with_iso_times(d) for d in data]
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out[k] = with_iso_times(v)
            if isinstance(k, str) and (k == "at" or k.endswith("_at")) and (v is None or isinstance(v, (int, float))) and not isinstance(v, bool):
                out[f"{k}_iso"] = iso(v)
        return out
    return data


def for_tools(data, output: str) -> str:
    data = with_iso_times(data)
    if output == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False).rstrip()


def render(kind: str, rows: list[dict], output: str, *, headers: bool = True, width: int | None = None) -> str:
    """A listing: a table (fitted to `width`; -o wide: whole, with more
    columns), names, or the rows as one JSON or YAML document."""
    if output in ("json", "yaml"):
        return for_tools(rows, output)
    rows = printable_data(rows)
    if output == "name":
        return "\n".join(name_of(kind, r) for r in rows)
    if not rows:
        return f"no {kind}" if headers else ""
    header = header_of(kind, output)
    lines = [cells_of(kind, r, output) for r in rows]
    widths = widths_of(lines, header, None if output == "wide" else width)
    return "\n".join(line_of(line, widths) for line in ([header] if headers else []) + lines)


class Watch:
    """What `get --watch` prints: the listing, then a line per change. For
    people, a table with an EVENT column, every line in the columns of the
    first (so a change stays under its header); for tools, a JSON line (or YAML
    document) {"type": ADDED|MODIFIED|DELETED, "object": row} per change, as
    Kubernetes watches print them, the listing's rows too (as ADDED), so every
    line a tool reads is one (issue 34: the listing came as a pretty-printed array)."""

    def __init__(self, kind: str, output: str, *, headers: bool = True, width: int | None = None) -> None:
        self.kind, self.output, self.headers, self.width = kind, output, headers, width
        self.widths: list[int] = []

    def first(self, rows: list[dict]) -> str:
        if self.output in ("json", "yaml"):
            # Lines from the first on (issue 34): the listing as ADDED, as a Kubernetes watch starts.
            return "\n".join(self.change("ADDED", r) for r in rows)
        if self.output not in ("table", "wide"):
            return render(self.kind, rows, self.output, headers=self.headers)
        header = ["EVENT", *header_of(self.kind, self.output)]
        lines = [["", *cells_of(self.kind, r, self.output)] for r in printable_data(rows)]
        # Room for the longest event word, and for rows to come a little wider than these.
        lines.append(["MODIFIED", *header[1:]])
        self.widths = widths_of(lines, header, None if self.output == "wide" else self.width)
        return "\n".join(line_of(line, self.widths) for line in ([header] if self.headers else []) + lines[:-1])

    def change(self, change: str, row: dict) -> str:
        if self.output == "json":
            return json.dumps({"type": change, "object": with_iso_times(row)})
        if self.output == "yaml":
            return "---\n" + yaml.safe_dump({"type": change, "object": with_iso_times(row)}, sort_keys=False).rstrip()
        row = printable_data(row)
        if self.output == "name":
            return f"{change} {name_of(self.kind, row)}"
        return line_of([change, *cells_of(self.kind, row, self.output)], self.widths)


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
            lines.append([e.get("seqs", str(e["seq"])), at, e["summary"]])  # (load folded: its first-last, loadfold.py)
    return table(lines, ["SEQ", "TIME", "WHAT HAPPENED"]).splitlines() if lines else ["(none)"]


def _listens_on(shard: dict) -> str:
    """The port a shard's engine listens on: its endpoint's, where it reports
    one (a simulated engine without --engine-ports binds a port the system
    picks, not the one placement numbered), else the port it was given."""
    try:
        port = urlsplit(shard.get("endpoint") or "").port
    except ValueError:
        port = None
    return str(port if port else shard["port"])


def _fields(pairs: list[tuple[str, object]]) -> list[str]:
    width = max(len(k) for k, _ in pairs) + 1
    return [f"{(k + ':').ljust(width)} {v}" for k, v in pairs]


ROUTE_COLUMNS = ("warm", "hashed", "overflow", "session", "least_load", "round_robin")


def _routing(routing: dict) -> list[str]:
    """A model's routing policy, and where the gateways sent its requests and
    why, per replica (issue 30; gateway/choose.py), with the share of their
    prompts the engines had cached."""
    out = _fields([("Routing", routing.get("policy", "prefix"))])
    rows = []
    for replica, f in sorted((routing.get("replicas") or {}).items()):
        prompt = f.get("prompt_tokens", 0)
        cached = f"{100 * f.get('cached_tokens', 0) / prompt:.0f}%" if prompt else "-"
        rows.append([replica, *(str(f.get(k, 0)) for k in ROUTE_COLUMNS), str(f.get("hits", 0)), cached])
    if rows:
        out.append("Routed (requests by why they went there; prefix hits; prompt tokens cached):")
        header = ["REPLICA", "WARM", "HASHED", "OVERFLOW", "SESSION", "LEAST-LOAD", "ROUND-ROBIN", "HITS", "CACHED"]
        out += ["  " + line for line in table(rows, header).splitlines()]
    return out


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
            out += _routing(now.get("routing") or {})
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
                ("State", now["state"]), ("Reason", _replica_reason(now) or "(none)"),
                ("Restart", (now["restart"] + (f": {now['restart_reason']}" if now.get("restart_reason") else ""))
                 or "(none)"),
                ("Endpoint", now["endpoint"] or "(none)"),
                ("Placed", f"{_age(now['placed_at'])}, because {now['reason']}" if now["state"] == "ready" and now["reason"]
                 else _age(now["placed_at"])),
                ("Ready", _age(now["ready_at"]) or "(not yet)"),
                # What the facility refused on its way (held domains, power caps), as its placement met them.
                ("Facility", "; ".join(now.get("rejections", [])) or "(none)"),
            ])
            out.append("Shards:")
            rows = [[s["id"], s["node"], str(s["rank"]), ",".join(map(str, s["gpus"])), _listens_on(s),
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
                ("Location", _location(now.get("location", {})) or "(none)"),
                ("Draw", _watts(now.get("power_w", 0.0))),
                # What it says of itself that placement does not count (core/rules/admission.py).
                ("Claimed", _labels(now["unadmitted"]) + f" (not admitted: `llmgw ctl node admit {now['name']}`)"
                 if now.get("unadmitted") else "(nothing not admitted)"),
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
    if output in ("json", "yaml"):
        return for_tools(page, output)
    return describe_text(kind, printable_data(page))
