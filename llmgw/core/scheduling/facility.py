"""The facility's rules: holds, power caps, keep_within, each one function every site calls.

A node says where it is with the labels llmgw.io/site, room, row, rack and
pdu; a domain is KIND/NAME (`rack/r4-12`): the nodes whose label of that
kind has that name. What the fold keeps of them (locations, draw, holds,
caps) is folding/facility_facts.py. The rules, called by placement's
search, the refusals counted, explain and the fold's check alike:

- hold (`first_held`): nothing new goes on a node in a held domain; a hold
  with `drain` also restarts each replica there beside itself (drains.py),
  stopped once its replacement elsewhere serves.
- power cap (`over_cap`): a shard that would take a domain of its node past
  its cap is refused there. A domain draws what its nodes were measured to
  draw, plus each shard not yet measured at its declared draw (`shard_watts`:
  its profile's power_w, else its GPUs' power limits).
- spread (facility_spread.level): a model's replicas go to the rack with
  the fewest of them, then the PDU, then the node, and only then best fit.
- keep_within (`domain_of_kind`): a multi-node replica's shards in one
  domain of the profile's kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..contract import events as ev
from ..folding.state import Node, State

# The facility's rules, as Reason.rule names them (fit.RULES lists them after the node's).
HELD = "held"
POWER = "power"
KEEP_WITHIN = "keep-within"
RULES = (HELD, POWER, KEEP_WITHIN)


def watts(w: float) -> str:
    """A draw in words: "12.6 kW", "700 W"."""
    return f"{w / 1000:.3g} kW" if w >= 1000 else f"{w:.0f} W"


# --------------------------------------------------------------------------- draw


def shard_watts(p: ev.ProfileSpec, node: Node, gpus: Iterable[int]) -> float:
    """What one shard is counted as drawing before it is measured: its
    profile's declared power_w, else the power limits of the GPUs it gets."""
    if p.power_w:
        return p.power_w
    # (The shard's GPUs only: reading all eight per shard was a cost of every fold.)
    have = node.gpus
    n = len(have)
    w = 0.0
    for i in gpus:
        g = have[i] if i < n and have[i].index == i else next((x for x in have if x.index == i), None)
        if g is not None:
            w += g.power_w
    return w


# --------------------------------------------------------------------------- the rules, one function each


def over_cap(draw: float, w: float, cap: float) -> bool:
    """The power cap: whether `w` watts more take a domain that draws
    `draw` past its `cap` (a micro-watt of float error aside)."""
    return draw + w > cap + 1e-6


def first_held(holds: dict, domains: Iterable[str]) -> str:
    """The hold: the first of these domains that is held ("" none). Nothing
    new is placed on a node in a held domain."""
    for d in domains:
        if d in holds:
            return d
    return ""


def held_reason(holds: dict, domain: str) -> str:
    """Why a held domain is held, as an operator said it."""
    return holds[domain].reason or "no reason given"


def domain_of_kind(located: dict[str, tuple[str, ...]], kind: str, name: str) -> str:
    """keep_within: the domain of a kind a node is in ("" none); a
    multi-node replica kept within a kind has every shard in one."""
    for d in located.get(name, ()):
        if d.startswith(kind) and d[len(kind)] == "/":
            return d
    return ""


def power_problem(state: State, adds: list[tuple[Node, float]], credit: dict[str, float]) -> str:
    """The fold's check of a placement (decisions._place): a node in a held
    domain, or these draws on their nodes (less `credit`: what a replica
    replaced in place hands over) taking a domain past its cap; "" if neither."""
    if not state.holds and not state.budgets:
        return ""
    extra: dict[str, float] = {}
    for node, w in adds:
        ds = state.located.get(node.name, ())
        held = first_held(state.holds, ds)
        if held:
            return render(HELD, held, held_reason(state.holds, held))
        for d in ds:
            if d in state.budgets:
                extra[d] = extra.get(d, 0.0) + w - credit.get(node.name, 0.0)
    if not extra:
        return ""
    draws = state.domain_draw
    for d in sorted(extra):
        cap = state.budgets[d]
        if extra[d] > 0 and over_cap(draws.get(d, 0.0), extra[d], cap):
            return f"{d} would draw {watts(draws.get(d, 0.0) + extra[d])} of {watts(cap)}"
    return ""


def draining(state: State, rep) -> str:
    """The drained, held domain one of a replica's shards is in ("": none)."""
    if not state.holds:
        return ""
    for sh in rep.shards:
        for d in state.located.get(sh.node, ()):
            h = state.holds.get(d)
            if h is not None and h.drain:
                return d
    return ""


def render(rule: str, need: str, have: str) -> str:
    """A facility reason in words, naming its domain: `rack/r4-12 is held:
    maintenance`, `pdu/pdu-a would draw 12.6 kW of 12 kW`."""
    if rule == HELD:
        return f"{need} is held: {have}"
    if rule == POWER:
        return f"{need} {have}"
    return f"keep within: needs {need}, has {have}"
