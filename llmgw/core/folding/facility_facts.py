"""What the fold keeps of the facility: where nodes are, what they draw, holds and caps.

A node says where it is with the labels llmgw.io/site, room, row, rack and
pdu (its agent file, or `llmgw ctl label`, which wins until removed). A
domain is KIND/NAME (`rack/r4-12`, `pdu/pdu-a`): the nodes whose label of
that kind has that name. A domain draws what its nodes were measured to
draw (NodePower, coalesced by the agent, so that replay counts the same),
plus each shard not yet measured at its declared draw.

The fold's handlers at the end, and the functions it calls as shards come
and go, are the only writers of state.located, state.domain_nodes and
state.domain_draw; the rules that read them are scheduling/facility.py.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

import msgspec

from ..contract import events as ev
from .nodeindex import relocated
from .refused import Refused
from .state import Hold, Node, Shard, State

KINDS = ("site", "room", "row", "rack", "pdu")
PREFIX = "llmgw.io/"
LABELS = {k: PREFIX + k for k in KINDS}
_KIND_OF = {v: k for k, v in LABELS.items()}



def label_name(key: str) -> str:
    """The whole label name of a location key ("rack" or "llmgw.io/rack"); "" if it is none."""
    if key in LABELS:
        return LABELS[key]
    return key if key in _KIND_OF else ""


def effective_labels(node: Node) -> dict[str, str]:
    """A node's labels as placement reads them: an operator's (`ctl label`)
    over its agent's; an operator's removed, the agent's show again."""
    if not node.operator_labels:
        return dict(node.labels)
    return {**node.labels, **{k: v for k, v in node.operator_labels.items() if v}}


def location(node: Node) -> dict[str, str]:
    """kind -> name, from the node's effective labels. In KINDS order."""
    out = {}
    op, own = node.operator_labels, node.labels
    for kind, label in LABELS.items():
        name = op.get(label) or own.get(label, "")
        if name:
            out[kind] = name
    return out


def domains_of(node: Node) -> tuple[str, ...]:
    """The domains a node is in, KIND/NAME, broadest first."""
    return tuple([f"{k}/{n}" for k, n in location(node).items()])


def split_domain(domain: str) -> tuple[str, str]:
    kind, _, name = domain.partition("/")
    return kind, name


def domain_problem(domain: str) -> str:
    """Why a text is not a domain (KIND/NAME), or ""."""
    kind, sep, name = domain.partition("/")
    if not sep or kind not in KINDS or not name or "/" in name:
        return f"{domain!r} is not a domain: KIND/NAME with KIND one of {', '.join(KINDS)} (e.g. rack/r4-12)"
    return ""


def node_draw(node: Node) -> float:
    """What a node counts for its domains: measured, plus its shards not measured yet."""
    if not node.unmeasured:
        return node.power_w
    return node.power_w + sum(node.unmeasured.values())


def counted(node: Node, sh: Shard) -> float:
    """What a live shard counts for in its node's draw (and frees when it
    stops): its declared or derived draw until measured, then what its GPUs
    were measured to draw. A shard with power_w 0 (a copy kept in a pass
    for what it still holds: restarts._kept_till_exit) counts for none."""
    if not sh.power_w:
        return 0.0
    w = node.unmeasured.get(sh.id)
    if w is not None:
        return w
    if node.power_gpus and sh.gpus:
        measured = sum(node.power_gpus.get(g, 0.0) for g in sh.gpus)
        if measured:
            return measured
    return sh.power_w


def count_unmeasured(state: State, node: Node, sh: Shard) -> None:
    """A live shard's draw counted on its node until a measurement covers it
    (placed, or held again at a registration, which forgets what was measured)."""
    w = sh.power_w
    if w:
        sh.measured = False
        unmeasured = node.unmeasured
        delta = w - unmeasured.get(sh.id, 0.0)
        unmeasured[sh.id] = w
        _drew(state, node.name, delta)


def uncount(state: State, node: Node, sid: str) -> None:
    """A shard no longer counted on its node (it ended, or its replica was forgotten)."""
    if node.unmeasured:
        w = node.unmeasured.pop(sid, None)
        if w:
            _drew(state, node.name, -w)


def forget_draw(state: State, node: Node) -> None:
    """Nothing counted on the node any more: it was lost, or registers afresh."""
    _drew(state, node.name, -node_draw(node))
    node.unmeasured.clear()
    node.power_w, node.power_gpus = 0.0, {}


def _drew(state: State, name: str, delta: float) -> None:
    """A node's draw changed by `delta`: so did its domains' (state.domain_draw)."""
    if delta:
        draw = state.domain_draw
        for d in state.located.get(name, ()):
            draw[d] = draw.get(d, 0.0) + delta


def relocate(state: State, name: str) -> None:
    """Keep state.located and state.domain_nodes as the node's labels now
    say: at a registration and a NodeLabeled."""
    node = state.nodes.get(name)
    new = domains_of(node) if node is not None else ()
    old = state.located.get(name, ())
    if new == old:
        return
    relocated(state)
    index, draw = state.domain_nodes, state.domain_draw
    w = node_draw(node) if node is not None else 0.0  # (what the node counts for moves with it)
    for d in old:
        if d not in new:
            names = index[d]
            names.remove(name)
            if not names:
                del index[d]
                draw.pop(d, None)
            elif w:
                draw[d] -= w
    for d in new:
        if d not in old:
            insort(index.setdefault(d, []), name)
            if w:
                draw[d] = draw.get(d, 0.0) + w
    if new:
        state.located[name] = new
    else:
        state.located.pop(name, None)


def domain_draws(state: State, domains: Iterable[str]) -> dict[str, float]:
    """Each domain's counted draw summed afresh: what state.domain_draw
    keeps as the fold goes (tests and benchmarks check one against the other)."""
    nodes, index = state.nodes, state.domain_nodes
    return {d: sum(node_draw(nodes[n]) for n in index.get(d, ())) for d in set(domains)}


# --------------------------------------------------------------------------- what the console and ctl read


class DomainRow(msgspec.Struct, kw_only=True):
    """One domain as `ctl facility` and the console list it."""

    domain: str
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


def domain_rows(state: State) -> list[DomainRow]:
    """Every domain some node is in, held or capped, in KIND then name order."""
    rows: dict[str, DomainRow] = {}

    def row(d: str) -> DomainRow:
        r = rows.get(d)
        if r is None:
            kind, name = split_domain(d)
            r = rows[d] = DomainRow(domain=d, kind=kind, name=name)
        return r

    for node in state.nodes.values():
        ds = domains_of(node)
        if not ds:
            continue
        w = node_draw(node)
        ready = node.state == "ready"
        used = len(node.used) if ready else 0
        free = len(node.gpus) - used if ready else 0
        for d in ds:
            r = row(d)
            r.nodes += 1
            r.gpus_used += used
            r.gpus_free += free
            r.draw_w += w
    for d, cap in state.budgets.items():
        row(d).cap_w = cap
    for d, h in state.holds.items():
        r = row(d)
        r.held, r.drain, r.hold_reason, r.held_at = True, h.drain, h.reason, h.since
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(rows.values(), key=lambda r: (order.get(r.kind, 9), r.name))


# --------------------------------------------------------------------------- the fold


def domain_held(state: State, e: ev.DomainHeld, seq: int) -> None:
    problem = domain_problem(e.domain)
    if problem:
        raise _refused(problem)
    old = state.holds.get(e.domain)
    # Held again (a reason or drain changed): since the first hold.
    state.holds[e.domain] = Hold(reason=e.reason, since=old.since if old else e.at, drain=e.drain)


def domain_released(state: State, e: ev.DomainReleased, seq: int) -> None:
    state.holds.pop(e.domain, None)


def facility_applied(state: State, e: ev.FacilityApplied, seq: int) -> None:
    for d, w in e.budgets.items():
        problem = domain_problem(d)
        if problem:
            raise _refused(f"facility budget: {problem}")
        if not w > 0:
            raise _refused(f"facility budget of {d}: {w!r} must be a number of watts above 0")
    state.budgets = {d: w for d, w in sorted(e.budgets.items())}


def node_power(state: State, e: ev.NodePower, seq: int) -> None:
    """A measurement: from now on it is what the node draws, and it covers
    every shard of the node that was ready (an engine still loading does
    not draw what it will: it stays counted at its declared draw)."""
    node = state.nodes.get(e.node)
    if node is None or node.state != "ready":
        return
    if e.watts < 0 or any(w < 0 for w in e.gpus.values()):
        raise _refused(f"node {e.node}: a negative draw")
    before = node_draw(node)
    node.power_w, node.power_gpus, node.power_at = e.watts, dict(e.gpus), e.at
    if node.unmeasured:
        _covered(state, node)
    _drew(state, e.node, node_draw(node) - before)


def _covered(state: State, node: Node) -> None:
    """The node's shards a measurement covers are no longer counted at their own draw."""
    replicas = state.replicas
    for sid in list(node.unmeasured):
        rep = replicas.get(sid.rpartition(".")[0])
        if rep is None:
            del node.unmeasured[sid]
            continue
        for sh in rep.shards:
            if sh.id == sid and sh.node == node.name:
                if sh.state == "ready":
                    sh.measured = True
                    del node.unmeasured[sid]
                break


def _refused(why: str) -> Exception:
    return Refused(why)


HANDLERS = {
    ev.DomainHeld: domain_held,
    ev.DomainReleased: domain_released,
    ev.FacilityApplied: facility_applied,
    ev.NodePower: node_power,
}
