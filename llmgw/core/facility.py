"""The facility: where nodes are (site, room, row, rack, PDU), held domains, power caps.

A node says where it is with the labels llmgw.io/site, room, row, rack and
pdu, from its agent file or from `llmgw ctl label` (NodeLabeled), which wins
over the agent's own until removed. A domain is KIND/NAME (`rack/r4-12`,
`pdu/pdu-a`): the nodes whose label of that kind has that name.

What placement reads of it (placement.py asks at a few marked points):

- **holds** (DomainHeld, DomainReleased): nothing new is placed on a node in
  a held domain. A hold with `drain` also moves what runs there: each of its
  replicas is restarted beside itself (restarts.py, as with surge), so it is
  stopped only once its replacement elsewhere serves; what fits nowhere else
  stays and says why.
- **power caps** (FacilityApplied, the catalog's `facility.budgets`): a
  shard that would take any domain its node is in past its cap is refused
  there. The draw of a domain is what its nodes were measured to draw
  (NodePower), plus, for each shard placed and not yet measured, its
  declared draw (its profile's power_w) or else its derived one (the power
  limits of the GPUs it was given). Measurements are events, coalesced by the
  agent, so replay counts the same draw and decides the same.
- **spread**: a model's replicas go to the rack with the fewest of them,
  then the PDU, then the node (`Levels`), and only then best fit.
- **keep_within**: every shard of a multi-node replica in one domain of the
  profile's kind.

Pure, like the rest of the core: the fold handlers at the end are the only
writers, and `PassFacility` is the working copy one pass of decide takes from.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

import msgspec

from . import events as ev
from .state import Hold, Node, Shard, State

KINDS = ("site", "room", "row", "rack", "pdu")
PREFIX = "llmgw.io/"
LABELS = {k: PREFIX + k for k in KINDS}
_KIND_OF = {v: k for k, v in LABELS.items()}

# The rules placement names in its reasons (placement.RULES lists them too).
HELD = "held"
POWER = "power"
KEEP_WITHIN = "keep-within"
RULES = (HELD, POWER, KEEP_WITHIN)
# How many domains' refusals a placement keeps (PlaceReplica.rejections).
MAX_REJECTIONS = 8


# --------------------------------------------------------------------------- locations and domains


def label_name(key: str) -> str:
    """The whole label name of a location key ("rack" or "llmgw.io/rack"); "" if it is none."""
    if key in LABELS:
        return LABELS[key]
    return key if key in _KIND_OF else ""


def location(node: Node) -> dict[str, str]:
    """kind -> name, from the node's effective labels: an operator's
    (`ctl label`) over its agent's. In KINDS order."""
    out = {}
    op, own = node.operator_labels, node.labels
    for kind, label in LABELS.items():
        name = op.get(label) or own.get(label, "")
        if name:
            out[kind] = name
    return out


def domains_of(node: Node) -> tuple[str, ...]:
    """The domains a node is in, KIND/NAME, broadest first."""
    return tuple(f"{k}/{n}" for k, n in location(node).items())


def split_domain(domain: str) -> tuple[str, str]:
    kind, _, name = domain.partition("/")
    return kind, name


def domain_problem(domain: str) -> str:
    """Why a text is not a domain (KIND/NAME), or ""."""
    kind, sep, name = domain.partition("/")
    if not sep or kind not in KINDS or not name or "/" in name:
        return f"{domain!r} is not a domain: KIND/NAME with KIND one of {', '.join(KINDS)} (e.g. rack/r4-12)"
    return ""


def watts(w: float) -> str:
    """A draw in words: "12.6 kW", "700 W"."""
    return f"{w / 1000:.3g} kW" if w >= 1000 else f"{w:.0f} W"


# --------------------------------------------------------------------------- draw


def shard_watts(p: ev.ProfileSpec, node: Node, gpus: Iterable[int]) -> float:
    """What one shard is counted as drawing before it is measured: its
    profile's declared power_w, else the power limits of the GPUs it gets."""
    if p.power_w:
        return p.power_w
    have = node.gpus
    if not any(g.power_w for g in have):
        return 0.0  # (GPUs that say no limit: the usual case, asked per candidate node)
    n = len(have)
    w = 0.0
    for i in gpus:
        g = have[i] if i < n and have[i].index == i else next((x for x in have if x.index == i), None)
        if g is not None:
            w += g.power_w
    return w


def node_draw(node: Node) -> float:
    """What a node counts for its domains: measured, plus its shards not measured yet."""
    if not node.unmeasured:
        return node.power_w
    return node.power_w + sum(node.unmeasured.values())


def counted(node: Node, sh: Shard) -> float:
    """What a live shard counts for in its node's draw (and frees when it
    stops): its declared or derived draw until measured, then what its
    GPUs were measured to draw (its declared one when they were not said).
    A shard with no draw of its own (power_w 0: a copy kept in a pass for
    what it still holds, see restarts._kept_till_exit) counts for none."""
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


def count_unmeasured(node: Node, sh: Shard) -> None:
    """A live shard's draw counted on its node until a measurement covers it
    (placed, or held again at a registration: a new registration forgets
    what was measured)."""
    if sh.power_w:
        sh.measured = False
        node.unmeasured[sh.id] = sh.power_w


def relocate(state: State, name: str) -> None:
    """Keep `state.located` and `state.domain_nodes` (derived) as the
    node's effective labels are now: at a registration and a NodeLabeled."""
    node = state.nodes.get(name)
    new = domains_of(node) if node is not None else ()
    old = state.located.get(name, ())
    if new == old:
        return
    index = state.domain_nodes
    for d in old:
        if d not in new:
            names = index[d]
            names.remove(name)
            if not names:
                del index[d]
    for d in new:
        if d not in old:
            insort(index.setdefault(d, []), name)
    if new:
        state.located[name] = new
    else:
        state.located.pop(name, None)


def domain_draws(state: State, domains: Iterable[str]) -> dict[str, float]:
    """The counted draw of each of these domains, over every node in it."""
    nodes, index = state.nodes, state.domain_nodes
    return {d: sum(node_draw(nodes[n]) for n in index.get(d, ())) for d in set(domains)}


def power_problem(state: State, adds: list[tuple[Node, float]], credit: dict[str, float]) -> str:
    """The fold's test of a placement (decisions._place): whether these
    draws, added on their nodes (less `credit`, by node: what a replica
    replaced in place hands over), take a capped domain past its cap; or
    whether a node is in a held domain. "" when neither."""
    if not state.holds and not state.budgets:
        return ""
    extra: dict[str, float] = {}
    for node, w in adds:
        for d in state.located.get(node.name, ()):
            hold = state.holds.get(d)
            if hold is not None:
                return f"{d} is held: {hold.reason or 'no reason given'}"
            if d in state.budgets:
                extra[d] = extra.get(d, 0.0) + w - credit.get(node.name, 0.0)
    if not extra:
        return ""
    draws = domain_draws(state, extra)
    for d in sorted(extra):
        cap, after = state.budgets[d], draws[d] + extra[d]
        if extra[d] > 0 and after > cap + 1e-6:
            return f"{d} would draw {watts(after)} of {watts(cap)}"
    return ""


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


def drain_reason(state: State, domain: str) -> str:
    h = state.holds[domain]
    return f"{domain} is held for draining: {h.reason or 'no reason given'}"


# --------------------------------------------------------------------------- one pass's working copy


# Levels: rack count, PDU count and node count as one number, each in its
# own digits (a node or PDU never runs this many of one model's replicas).
_BASE = 1 << 16


class Levels(dict):
    """The model's replicas per node, read as a spread *level* per node:
    how many of them its rack has, then its PDU, then itself, as one number
    (node -> level, absent where 0), so that placement's rounds of spread
    (`placement._limits`, `Inventory._best`), unchanged, try the emptiest
    rack first, then PDU, then node. A node without a rack (or PDU) label is
    a rack (or PDU) of its own: nothing says it shares one with another.

    Kept up to date as the model's placements in the pass add to its spread
    (`refresh`): a placement changes the levels of its rack's and PDU's
    nodes only, where making them all again per placement read the fleet
    each time (a 17x slower cold start on 2,000 nodes)."""

    def __init__(self, spread: dict[str, int], fac: "PassFacility") -> None:
        super().__init__()
        self._fac = fac
        self._spread = spread  # held: its id keys the pass's cache
        self._seen: dict[str, int] = {}
        self._racks: dict[str, int] = {}
        self._pdus: dict[str, int] = {}
        self._at: dict[int, set[str]] = {}  # level -> the nodes at it (0 aside)
        self._over: dict[int, set[str]] = {}  # limit -> the nodes at or past it, as of the last refresh
        self.refresh()

    def refresh(self) -> "Levels":
        spread, seen = self._spread, self._seen
        if len(spread) == len(seen) and spread == seen:
            return self
        rack_of, pdu_of = self._fac._rack_index()
        racks, pdus, index = self._racks, self._pdus, self._fac.state.domain_nodes
        changed: set[str] = set()
        moved = dict(spread.items() - seen.items())
        moved.update({name: 0 for name in seen.keys() - spread.keys()})
        for name, now in moved.items():
            delta = now - seen.get(name, 0)
            r, p = rack_of.get(name), pdu_of.get(name)
            changed.add(name)
            if r is not None:
                racks[r] = racks.get(r, 0) + delta
                changed.update(index.get(f"rack/{r}", ()))
            if p is not None:
                pdus[p] = pdus.get(p, 0) + delta
                changed.update(index.get(f"pdu/{p}", ()))
        self._seen = dict(spread)
        at = self._at
        self._over = {}
        for name in changed:
            n = spread.get(name, 0)
            r, p = rack_of.get(name), pdu_of.get(name)
            level = ((racks.get(r, 0) if r is not None else n) * _BASE + (pdus.get(p, 0) if p is not None else n)) * _BASE + n
            old = dict.get(self, name, 0)
            if level == old:
                continue
            if old:
                nodes = at[old]
                nodes.discard(name)
                if not nodes:
                    del at[old]
            if level:
                self[name] = level
                at.setdefault(level, set()).add(name)
            else:
                del self[name]
        return self

    def values(self):  # type: ignore[override]
        """The levels some node is at (placement's rounds of spread), without reading every node."""
        return self._at.keys()

    def over(self, limit: int) -> set[str]:
        """The nodes at or past a round's limit: what that round passes over
        (placement filters its buckets with it in C, not node by node)."""
        out = self._over.get(limit)
        if out is None:
            out = self._over[limit] = set().union(*(nodes for level, nodes in self._at.items() if level >= limit))
        return out


class PassFacility:
    """What one pass of decide takes from the facility: which nodes are in
    held domains, and what each capped domain draws, with this pass's
    placements and stops counted as they are decided. Read from the
    fold's derived index (state.located, state.domain_nodes): a fleet with
    no location, hold or cap costs nothing here, and one with them costs
    its capped domains' nodes once a pass."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.active = bool(state.located or state.holds or state.budgets)  # anything to say at all
        self.capped = bool(state.budgets)
        self.loc = state.located  # node -> its domains (the fold's, read only)
        self._draw: dict[str, float] | None = None  # capped domain -> draw counted in this pass
        self._racks: tuple[dict[str, str], dict[str, str]] | None = None
        self._held: dict[str, tuple] = {}  # node -> its held-domain Reasons (built lazily)
        self._levels: dict[int, Levels] = {}  # id(spread) -> its levels, kept up to date (Levels.refresh)
        self._said: dict[tuple[str, float], object] = {}  # (domain, draw after) -> its power Reason
        self._blocked: dict[tuple[float, int], set[str]] = {}  # see `blocked`
        self._gpu_w: dict[str, float | None] = {}  # node -> the power limit all its GPUs share (None: not alike)
        # The facility's refusals the placement under way met, domain -> in
        # words (`ctl describe replica` keeps them: PlaceReplica.rejections).
        self.seen: dict[str, str] = {}
        from .placement import Reason  # placement imports this module

        self._reason = Reason

    @property
    def draw(self) -> dict[str, float]:
        if self._draw is None:
            self._draw = domain_draws(self.state, self.state.budgets)
        return self._draw

    def _rack_index(self) -> tuple[dict[str, str], dict[str, str]]:
        """node -> rack name and node -> PDU name, of the nodes that say them (for Levels): once a pass."""
        if self._racks is None:
            rack_of: dict[str, str] = {}
            pdu_of: dict[str, str] = {}
            for name, ds in self.loc.items():
                for d in ds:
                    if d.startswith("rack/"):
                        rack_of[name] = d[5:]
                    elif d.startswith("pdu/"):
                        pdu_of[name] = d[4:]
            self._racks = (rack_of, pdu_of)
        return self._racks

    # ------------------------------------------------------------------ rules, per node

    def reasons(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> tuple:
        """The held domains a node is in, and the capped ones one more shard
        of the profile would take past their cap."""
        ds = self.loc.get(node.name)
        if not ds:
            return ()
        out = self._held.get(node.name)
        if out is None:
            holds = self.state.holds
            out = self._held[node.name] = tuple(
                self._reason(rule=HELD, need=d, have=holds[d].reason or "no reason given") for d in ds if d in holds
            )
        if self.capped:
            draw = self.draw
            w = None
            for d in ds:
                if d in draw:
                    if w is None:
                        w = self._watts(p, node, gpus)
                    after = draw[d] + w
                    if w and after > self.state.budgets[d] + 1e-6:
                        # The same words for every node of the domain until its draw changes.
                        r = self._said.get((d, after))
                        if r is None:
                            have = f"would draw {watts(after)} of {watts(self.state.budgets[d])}"
                            r = self._said[(d, after)] = self._reason(rule=POWER, need=d, have=have)
                        out = out + (r,)
        if out and len(self.seen) < MAX_REJECTIONS:
            seen = self.seen
            for r in out:
                if r.need not in seen:
                    seen[r.need] = render(r.rule, r.need, r.have)
        return out  # type: ignore[return-value]

    def rejections(self) -> list[str]:
        """What the facility refused during the last placement, by domain."""
        return [self.seen[d] for d in sorted(self.seen)]

    def refuses(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> bool:
        """Whether `reasons` would say anything, without saying it: placement
        asks this of every candidate it passes over (on a fleet whose caps
        bind, most of them), and words for each cost more than the search."""
        ds = self.loc.get(node.name)
        if not ds:
            return False
        holds = self.state.holds
        if holds:
            for d in ds:
                if d in holds:
                    return self._noted(d, node, p, gpus)
        if self.capped:
            draw, budgets = self.draw, self.state.budgets
            w = None
            for d in ds:
                if d in draw:
                    if w is None:
                        w = self._watts(p, node, gpus)
                        if not w:
                            return False
                    if draw[d] + w > budgets[d] + 1e-6:
                        return self._noted(d, node, p, gpus)
        return False

    def _noted(self, domain: str, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> bool:
        """A refusal, noted in words for the placement under way (once per
        domain), and remembered for the pass (`blocked`)."""
        if domain not in self.seen and len(self.seen) < MAX_REJECTIONS:
            self.reasons(node, p, gpus)
        if p.power_w or self._gpu_w.get(node.name) is not None:
            self.blocked(p).add(node.name)
        return True

    def blocked(self, p: ev.ProfileSpec) -> set[str]:
        """Nodes known to refuse a shard of this draw in this pass: a domain's
        draw only grows in a pass (until a stop is counted, `_add`), so a
        node refused once is passed over at once after (placement skips them
        in C; on a fleet whose caps bind, asking each again was most of a
        cold start). Keyed by what the draw of one shard follows from."""
        key = (p.power_w, p.gpus)
        out = self._blocked.get(key)
        if out is None:
            out = self._blocked[key] = set()
        return out

    def _watts(self, p: ev.ProfileSpec, node: Node, gpus: list[int]) -> float:
        """shard_watts, the same number, without reading the node's GPUs
        each time where they all say one limit (asked per candidate node)."""
        if p.power_w:
            return p.power_w
        w = self._gpu_w.get(node.name, -1.0)
        if w == -1.0:
            limits = {g.power_w for g in node.gpus}
            w = self._gpu_w[node.name] = limits.pop() if len(limits) == 1 else None
        return shard_watts(p, node, gpus) if w is None else w * len(gpus)

    def fit_together(self, nodes: list[Node], p: ev.ProfileSpec, gpus: list[list[int]]) -> bool:
        """Whether the shards of one multi-node replica, each fitting alone,
        fit the caps together (two on one PDU count twice)."""
        if not self.capped:
            return True
        extra: dict[str, float] = {}
        for node, gs in zip(nodes, gpus):
            w = shard_watts(p, node, gs)
            for d in self.loc.get(node.name, ()):
                if d in self.draw:
                    extra[d] = extra.get(d, 0.0) + w
        return all(self.draw[d] + w <= self.state.budgets[d] + 1e-6 for d, w in extra.items())

    def take(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> None:
        """A shard placed in this pass: its draw counts from now on."""
        if self.capped:
            self._add(node.name, shard_watts(p, node, gpus))

    def shift(self, node: Node, sh: Shard, give: bool) -> None:
        """A shard stopped in this pass (give) frees what it counts for; or not after all."""
        if self.capped:
            w = counted(node, sh)
            self._add(node.name, -w if give else w)

    def _add(self, name: str, w: float) -> None:
        if w < 0 and self._blocked:
            self._blocked.clear()  # room made: what was refused may fit again
        draw = self.draw
        for d in self.loc.get(name, ()):
            if d in draw:
                draw[d] += w

    # ------------------------------------------------------------------ spread and keep_within

    def levels(self, spread: dict[str, int]) -> dict[str, int]:
        """Spread by rack, then PDU, then node, where nodes say where they are."""
        if not self.loc:
            return spread
        rack_of, pdu_of = self._rack_index()
        if not rack_of and not pdu_of:
            return spread
        levels = self._levels.get(id(spread))
        if levels is None:
            levels = self._levels[id(spread)] = Levels(spread, self)
        return levels.refresh()

    def domain_of(self, kind: str, name: str) -> str:
        for d in self.loc.get(name, ()):
            if d.startswith(kind) and d[len(kind)] == "/":
                return d
        return ""

    def within(self, kind: str, names: Iterable[str]) -> list[str]:
        """The domains of a kind these nodes are in, in name order."""
        return sorted({d for d in (self.domain_of(kind, n) for n in names) if d})

    def keep_within_reason(self, p: ev.ProfileSpec, fitting: list[str]):
        """Why no domain of the profile's keep_within kind has enough nodes
        that fit (explain), or None when one has."""
        per: dict[str, int] = {}
        for n in fitting:
            d = self.domain_of(p.keep_within, n)
            if d:
                per[d] = per.get(d, 0) + 1
        if any(c >= p.nodes for c in per.values()):
            return None
        need = f"{p.nodes} nodes that fit in one {p.keep_within}"
        if not per:
            return self._reason(rule=KEEP_WITHIN, need=need, have=f"no node that fits has a {LABELS[p.keep_within]} label")
        most = max(per.values())
        where = min(d for d, c in per.items() if c == most)
        return self._reason(rule=KEEP_WITHIN, need=need, have=f"{most} in {where}")


class Outside:
    """The `taken` of placement's search for one shard of a replica kept
    within a domain: the nodes chosen already, and every node outside it."""

    __slots__ = ("fac", "kind", "domain", "chosen")

    def __init__(self, fac: PassFacility, kind: str, domain: str, chosen: list) -> None:
        self.fac, self.kind, self.domain, self.chosen = fac, kind, domain, chosen

    def __contains__(self, v) -> bool:
        return v in self.chosen or self.fac.domain_of(self.kind, v.name) != self.domain


def render(rule: str, need: str, have: str) -> str:
    """A facility reason in words, naming its domain: `rack/r4-12 is held:
    maintenance`, `pdu/pdu-a would draw 12.6 kW of 12 kW`."""
    if rule == HELD:
        return f"{need} is held: {have}"
    if rule == POWER:
        return f"{need} {have}"
    return f"keep within: needs {need}, has {have}"


# --------------------------------------------------------------------------- the fold


def node_labeled(state: State, e: ev.NodeLabeled, seq: int) -> None:
    """Operator location labels: set ones win over the agent's; removed ones
    let the agent's show again. Only location labels (KINDS)."""
    changes = {}
    for key, value in e.set.items():
        name = label_name(key)
        if not name:
            raise _refused(f"label {key!r}: only location labels may be set this way ({', '.join(KINDS)})")
        if not value or "/" in value or len(value) > 64:
            raise _refused(f"label {key}={value!r}: a name without '/', at most 64 characters")
        changes[name] = value
    removed = []
    for key in e.remove:
        name = label_name(key)
        if not name:
            raise _refused(f"label {key!r}: only location labels may be removed this way ({', '.join(KINDS)})")
        removed.append(name)
    labels = dict(state.node_labels.get(e.node, {}))
    labels.update(changes)
    for name in removed:
        labels.pop(name, None)
    if labels:
        state.node_labels[e.node] = labels
    else:
        state.node_labels.pop(e.node, None)
    node = state.nodes.get(e.node)
    if node is not None:
        node.operator_labels = dict(labels)
        relocate(state, e.node)


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
    state.budgets = dict(sorted(e.budgets.items()))


def node_power(state: State, e: ev.NodePower, seq: int) -> None:
    """A measurement: from now on it is what the node draws, and it covers
    every shard of the node that was ready (an engine still loading does
    not draw what it will: it stays counted at its declared draw)."""
    node = state.nodes.get(e.node)
    if node is None or node.state != "ready":
        return
    if e.watts < 0 or any(w < 0 for w in e.gpus.values()):
        raise _refused(f"node {e.node}: a negative draw")
    node.power_w, node.power_gpus, node.power_at = e.watts, dict(e.gpus), e.at
    if not node.unmeasured:
        return
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
    from .fold import Refused  # the fold imports this module

    return Refused(why)


HANDLERS = {
    ev.NodeLabeled: node_labeled,
    ev.DomainHeld: domain_held,
    ev.DomainReleased: domain_released,
    ev.FacilityApplied: facility_applied,
    ev.NodePower: node_power,
}
