"""The facility in one pass of decide: the working copy placement asks.

`PassFacility` is what one pass of decide sees of the facility (facility.py
keeps the facts): the holds, each capped domain's draw as the pass's own
placements add to it, and the refusals a replica's search met, kept on the
placement (PlaceReplica.rejections) so that `ctl describe replica` shows
them. `Levels` is a model's spread read as racks, then PDUs, then nodes; it
is kept up to date as the pass places, because making it again per
placement read the whole fleet each time.

Apart from facility.py so that each stays one concern: the facts and the
fold there, one pass's arithmetic here.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import events as ev
from .facility import (
    HELD,
    KEEP_WITHIN,
    LABELS,
    MAX_REJECTIONS,
    POWER,
    counted,
    domain_draws,
    render,
    shard_watts,
    watts,
)
from .state import Node, Shard, State

# A round of spread with at most this many nodes at its level is looked at
# node by node (placement._best_among); a larger one, mostly full nodes late
# in a cold start, is found among the buckets of free GPUs, filtered in C.
FEW = 64
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
        self._over: tuple = ()  # (limit, the nodes at or past it), as of the last refresh
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
        self._over = ()
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

    def at(self, level: int) -> set[str]:
        """The nodes at one level (not 0)."""
        return self._at.get(level, set())

    def over(self, limit: int) -> set[str]:
        """The nodes at or past a round's limit: what that round passes over
        (placement filters its buckets with it in C, not node by node).
        Rounds come in rising order: the set of the last one asked is
        narrowed to the next (levels only leave it), made afresh only when
        a lower limit is asked or the levels changed."""
        had = self._over
        if had and had[0] <= limit:
            at_limit, out = had
            if at_limit < limit:
                for level, nodes in self._at.items():
                    if at_limit <= level < limit:
                        out.difference_update(nodes)
        else:
            out = set(self)
            for level, nodes in self._at.items():
                if level < limit:
                    out.difference_update(nodes)
        self._over = (limit, out)
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
