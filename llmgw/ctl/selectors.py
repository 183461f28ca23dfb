"""Label selectors (`-l`), as kubectl reads them.

A selector is requirements separated by commas, all of which must hold:
`key=value` (or `key==value`), `key!=value`, `key in (a,b)`, `key notin (a,b)`,
`key` (it has the key) and `!key` (it has not). What a row is matched on
(`selectable`) is more than a node's labels, since llmgw's kinds have few:
every plain field of the row (name, state, model, owner, profile, kind,
node, …), a node's labels by their whole names (`llmgw.io/rack`) and its
location by its short kinds (`rack`, `pdu`), and for models and replicas the
model's owner and class (`class`, or `priority`: critical, standard,
opportunistic). A list field (a replica's nodes) matches `=` when one of its
items does, and `!=` when none does.

A key that no row of a kind can have (a typo: `-l sate=ready`) is refused
with the keys it may have meant, except on nodes, where any key may be a
label some node has.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# A key: kubectl's label keys (prefix/name, dots, dashes), and our field names.
_KEY = r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*"
_VALUE = r"[A-Za-z0-9_.\-/:@+]*"
_REQUIREMENT = re.compile(
    rf"""\s*(?:
        (?P<not>!)\s*(?P<absent>{_KEY})
      | (?P<key>{_KEY})\s*(?:
            (?P<op>==|!=|=)\s*(?P<value>{_VALUE})
          | \s(?P<set>in|notin)\s*\((?P<values>[^)]*)\)
        )?
    )\s*(?:,|$)""",
    re.VERBOSE,
)
# Other names a key goes by: kubectl's words, and ours.
KEY_ALIASES = {"priority": "class", "id": "name"}


class SelectorError(ValueError):
    """A selector that cannot be read, or names a key its kind never has: bad input (exit 2)."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def holds(self, fields: dict[str, object]) -> bool:
        if self.op == "exists":
            return self.key in fields
        if self.op == "!exists":
            return self.key not in fields
        have = fields.get(self.key)
        items = [_text(v) for v in have] if isinstance(have, (list, tuple)) else ([] if have is None else [_text(have)])
        hit = any(v in self.values for v in items)
        return hit if self.op in ("=", "in") else not hit

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!exists":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def parse(text: str) -> tuple[Requirement, ...]:
    """The requirements of a selector; SelectorError saying where it cannot be read."""
    out: list[Requirement] = []
    i = 0
    text = text.strip()
    if not text:
        raise SelectorError("an empty selector: give key=value, key!=value, key in (a,b), key or !key")
    while i < len(text):
        m = _REQUIREMENT.match(text, i)
        if m is None or m.end() == i:
            raise SelectorError(
                f"cannot read the selector {text!r} at {i + 1} ({text[i:]!r}): give key=value, key!=value, "
                f"key in (a,b), key notin (a,b), key or !key, separated by commas"
            )
        if m["absent"]:
            out.append(Requirement(_key(m["absent"]), "!exists"))
        elif m["op"]:
            out.append(Requirement(_key(m["key"]), "!=" if m["op"] == "!=" else "=", (m["value"],)))
        elif m["set"]:
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(f"{m['key']} {m['set']} (): give at least one value")
            out.append(Requirement(_key(m["key"]), m["set"], values))
        else:
            out.append(Requirement(_key(m["key"]), "exists"))
        i = m.end()
    return tuple(out)


def _key(key: str) -> str:
    return KEY_ALIASES.get(key, key)


# --------------------------------------------------------------------------- what a row is matched on

# Per kind, the keys a row has whatever its content (the derived ones included): what a typo is checked against.
KEYS = {
    "models": ("name", "owner", "class", "state", "profile", "alias", "parked", "waiting"),
    "replicas": ("name", "model", "owner", "class", "state", "profile", "node", "restart", "fingerprint"),
    "nodes": ("name", "state", "agent", "site", "room", "row", "rack", "pdu"),
    "decisions": ("name", "kind", "model", "replica", "node", "leader", "owner", "class", "voided"),
    "preemptions": ("name", "model", "victim", "owner", "class", "voided"),
    "quotas": ("name", "owner"),
    "owners": ("name", "owner", "parent"),
    "apikeys": ("name", "owner"),
    "domains": ("name", "kind", "domain", "held", "drain"),
    "leader": ("name", "role", "id"),
    "policy": ("name", "field"),
    "usage": ("name", "key", "owner", "model"),
}
FREE_LABELS = {"nodes"}  # kinds whose rows carry labels of any name


def model_state(m: dict) -> str:
    """A model's state in a word, for `-l state=…`: parked, ready (as many ready
    replicas as it wants), waiting (fewer, with a reason) or progressing."""
    if m.get("parked"):
        return "parked"
    if m.get("ready", 0) >= m.get("desired", 0):
        return "ready"
    return "waiting" if m.get("waiting") else "progressing"


def selectable(kind: str, row: dict, models: dict[str, dict] | None = None) -> dict[str, object]:
    """What a row is matched on: its plain fields, its name (what `get KIND NAME`
    takes), and per kind the derived keys above. `models`: each model's owner
    and class, by name (for models, replicas, decisions, preemptions)."""
    from .views import key_of

    fields: dict[str, object] = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool)) and v is not None}
    about = (models or {}).get(row.get("model", ""), {})
    if kind == "models":
        fields["state"] = model_state(row)
        fields["profile"] = [p["name"] for p in row.get("profiles", [])]
        fields["alias"] = list(row.get("aliases", []))
        about = (models or {}).get(row["name"], {})
    elif kind == "replicas":
        fields["node"] = list(row.get("nodes", []))
    elif kind == "nodes":
        fields.update(row.get("labels", {}))
        fields.update(row.get("location", {}))
    elif kind == "preemptions":
        fields["victim"] = [v.get("replica", "") for v in row.get("victims", [])]
    elif kind == "decisions":
        fields["node"] = [n for n in str(row.get("node", "")).split(",") if n]
    elif kind in ("quotas", "owners", "apikeys"):
        fields.setdefault("owner", row.get("owner", row.get("name", "")))
    if about:
        fields.setdefault("owner", about.get("owner", ""))
        if about.get("class"):
            fields["class"] = about["class"]
    fields["name"] = key_of(kind, row)
    return fields


def check(kind: str, requirements: tuple[Requirement, ...]) -> None:
    """Refuse a key that no row of this kind can have (a typo), naming those it may have meant."""
    if kind in FREE_LABELS:
        return
    keys = KEYS.get(kind, ())
    for r in requirements:
        if r.key not in keys:
            close = difflib.get_close_matches(r.key, keys, n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise SelectorError(f"{kind} have no {r.key!r}{hint}: select by {', '.join(keys)}")


def needs_classes(requirements: tuple[Requirement, ...]) -> bool:
    """Whether the selector asks for a model's class, which the read models do not keep (the catalog has it)."""
    return any(r.key == "class" for r in requirements)


def select(kind: str, rows: list[dict], requirements: tuple[Requirement, ...], models: dict[str, dict] | None = None) -> list[dict]:
    """The rows every requirement holds for."""
    if not requirements:
        return rows
    return [r for r in rows if all(q.holds(selectable(kind, r, models)) for q in requirements)]
