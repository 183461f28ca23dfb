"""Where a node stands in the facility, and how each domain stands: from
llmgw.core.facility when the core has it, else from the nodes' location
labels and the facility events the log holds.

WHY an adapter: the facility's events are in the contract before the fold
reads them (core/fold.py, end; branch i14-facility adds core/facility.py
with `location(node)` and `domain_rows(state)`). Until then the console
shows what operators said (NodeLabeled, DomainHeld, DomainReleased) folded
here, for display only; placement ignores it until the core folds it, and
`Overlay` then goes unused (remove it once core/facility.py is in main).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ..core import events as ev
from ..core.state import Node, State

KINDS = ("site", "room", "row", "rack", "pdu")  # outermost first
LABEL_PREFIX = "llmgw.io/"
_TAGS = (b'"node.labeled"', b'"domain.held"', b'"domain.released"')

try:  # branch i14-facility
    from ..core import facility as _core  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on what is merged
    _core = None


def core_has_facility() -> bool:
    return _core is not None


class Domain(msgspec.Struct, kw_only=True):
    domain: str  # KIND/NAME
    kind: str
    name: str
    nodes: int = 0
    gpus_used: int = 0
    gpus_free: int = 0
    draw_w: float = 0.0
    cap_w: float = 0.0  # 0: none
    held: bool = False
    drain: bool = False
    hold_reason: str = ""
    held_at: float = 0.0


class Overlay:
    """What operators said of the facility, folded from the log while the
    core does not: labels set or removed per node, and the held domains."""

    def __init__(self) -> None:
        self.labels: dict[str, dict[str, str | None]] = {}  # node -> label -> value (None: the operator's removed)
        self.holds: dict[str, tuple[bool, str, float]] = {}  # domain -> (drain, reason, at)
        self.said: list[tuple[int, ev.Event]] = []  # every facility event, in order

    def see(self, seq: int, data: bytes) -> None:
        if not any(t in data for t in _TAGS):
            return
        try:
            e = ev.decode(data)
        except msgspec.MsgspecError:
            return
        if isinstance(e, ev.NodeLabeled):
            mine = self.labels.setdefault(e.node, {})
            for k, v in e.set.items():
                mine[label_name(k)] = v
            for k in e.remove:
                mine[label_name(k)] = None
        elif isinstance(e, ev.DomainHeld):
            self.holds[e.domain] = (e.drain, e.reason, e.at)
        elif isinstance(e, ev.DomainReleased):
            self.holds.pop(e.domain, None)
        else:
            return
        self.said.append((seq, e))

    @classmethod
    def of(cls, records: Iterable[tuple[int, str, bytes]], until: int) -> "Overlay":
        o = cls()
        for seq, subject, data in records:
            if seq > until:
                break
            if subject.startswith("llmgw.ctl."):
                o.see(seq, data)
        return o


def label_name(key: str) -> str:
    """A short kind (rack) as its whole label name (llmgw.io/rack)."""
    return f"{LABEL_PREFIX}{key}" if key in KINDS else key


def labels_of(node: Node, overlay: Overlay | None) -> dict[str, str]:
    """Its labels as placement sees them: an operator's over its agent's; an
    operator's removed, its agent's show again (events.NodeLabeled)."""
    if _core is not None:
        return {**node.labels, **{k: v for k, v in getattr(node, "operator_labels", {}).items() if v}}
    out = dict(node.labels)
    for k, v in (overlay.labels.get(node.name, {}) if overlay is not None else {}).items():
        if v is not None:
            out[k] = v
    return out


def location(node: Node, overlay: Overlay | None = None) -> dict[str, str]:
    """kind -> name (site, room, row, rack, pdu), the kinds it has."""
    if _core is not None:
        return dict(_core.location(node))
    labels = labels_of(node, overlay)
    return {k: labels[LABEL_PREFIX + k] for k in KINDS if labels.get(LABEL_PREFIX + k)}


def domain_rows(state: State, overlay: Overlay | None = None) -> list[Domain]:
    if _core is not None:
        fields = Domain.__struct_fields__
        return [Domain(**{f: getattr(r, f) for f in fields if hasattr(r, f)}) for r in _core.domain_rows(state)]
    rows: dict[str, Domain] = {}
    for node in state.nodes.values():
        for kind, name in location(node, overlay).items():
            key = f"{kind}/{name}"
            d = rows.get(key)
            if d is None:
                d = rows[key] = Domain(domain=key, kind=kind, name=name)
            d.nodes += 1
            d.gpus_used += len(node.used)
            d.gpus_free += len(node.gpus) - len(node.used) if node.state == "ready" else 0
    for key, (drain, reason, at) in (overlay.holds.items() if overlay else ()):
        kind, _, name = key.partition("/")
        d = rows.get(key) or rows.setdefault(key, Domain(domain=key, kind=kind, name=name))
        d.held, d.drain, d.hold_reason, d.held_at = True, drain, reason, at
    return sorted(rows.values(), key=lambda d: (KINDS.index(d.kind) if d.kind in KINDS else 9, d.name))
