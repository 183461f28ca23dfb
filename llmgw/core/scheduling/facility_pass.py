"""The facility in one pass of decide: the working copy placement asks.

`PassFacility` is what one pass sees of the facility's facts (folding/facility_facts.py
keeps them, the fold writes them): the holds, each capped domain's draw as
the pass's placements and stops change it, the refusals a placement met
(PlaceReplica.rejections, which `ctl describe replica` shows), and the
nodes and cells known refused for the rest of the pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..contract import events as ev
from ..contract import limits
from . import fit
from .facility import KEEP_WITHIN, domain_of_kind, first_held, held_reason, over_cap, render, shard_watts
from .facility_spread import Cells, Levels, Spread
from ..folding.facility_facts import LABELS, counted
from ..folding.nodeindex import power_limit
from ..folding.state import Node, Shard, State


class PassFacility:
    """Held domains and each capped domain's draw, this pass's placements
    and stops counted as decided; read from the fold's derived indexes
    (state.located, domain_nodes, domain_draw), so that a fleet with no
    location, hold or cap costs nothing here."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.active = bool(state.located or state.holds or state.budgets)  # anything to say at all
        self.capped = bool(state.budgets)
        self.loc = state.located  # node -> its domains (the fold's, read only)
        drawn = state.domain_draw
        self.draw = {d: drawn.get(d, 0.0) for d in state.budgets}  # capped domain -> its draw, this pass's counted
        self._cells: Cells | None = None
        self.touched: list[int] = []  # the cells changed, in order (facility_search reads on)
        self.epoch = 0  # one more when a stop made room: every refusal of the pass may be stale
        self._blocked: dict[tuple[float, int], set[str]] = {}  # see `blocked`
        self._dead: dict[tuple[float, int], set[int]] = {}  # see `dead`
        self._limits: dict[str, tuple] = {}  # node -> see `_limits_of`
        self.index = None  # the node index (placement.Inventory sets it): its cells
        # The facility's refusals the placement under way met, domain -> in
        # words (`ctl describe replica` keeps them: PlaceReplica.rejections).
        self.seen: dict[str, str] = {}
        # node -> the draw a replica stopped for its replacement in place
        # hands over there, while that replacement is placed (`shift`).
        self.credit: dict[str, float] = {}

    def cells(self) -> Cells:
        """The located nodes by cell (for Levels): kept by the node index while no node moves."""
        if self._cells is None:
            idx, located = self.index, self.state.located
            cells = idx.cells if idx is not None else None
            if cells is None or cells.located is not located:
                cells = Cells(located)
                if idx is not None:
                    idx.cells = cells
            self._cells = cells
        return self._cells

    def _touch(self, name: str) -> None:
        """What a node has free changed in this pass: what placement kept of its cell is stale."""
        if self._cells is not None:
            c = self._cells.of.get(name)
            if c is not None:
                self.touched.append(c)

    # ------------------------------------------------------------------ rules, per node

    def reasons(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> tuple:
        """The held domains a node is in, and the capped ones one more shard
        of the profile would take past their cap."""
        name = node.name
        held, caps, _ = self._limits_of(node)
        if not held and not caps:  # (explain asks this of every node of the fleet)
            return ()
        holds = self.state.holds
        out = tuple(
            fit.held_reason(d, held_reason(holds, d)) for d in self.loc.get(name, ()) if d in holds
        )
        if caps:
            w = self._watts(p, node, gpus)
            if self.credit:
                w -= self.credit.get(name, 0.0)
            if w > 0:
                draw = self.draw
                for d, cap in caps:
                    if over_cap(draw[d], w, cap):
                        out = out + (fit.power_reason(d, draw[d] + w, cap),)
        if out and len(self.seen) < limits.LIMITS.rejections_kept:
            seen = self.seen
            for r in out:
                if r.need not in seen:
                    seen[r.need] = render(r.rule, r.need, r.have)
        return out  # type: ignore[return-value]

    def rejections(self) -> list[str]:
        """What the facility refused during the last placement, by domain."""
        return [self.seen[d] for d in sorted(self.seen)]

    def refuses(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> bool:
        """Whether `reasons` would say anything, without words: asked of every
        candidate, most of them refused where caps bind."""
        name = node.name
        held, caps, _ = self._limits_of(node)
        if held:
            return self._noted(held, node, p, gpus)
        if caps:
            w = self._watts(p, node, gpus)
            if self.credit:
                w -= self.credit.get(name, 0.0)
            if w <= 0:
                return False
            draw = self.draw
            for d, cap in caps:
                if over_cap(draw[d], w, cap):
                    return self._noted(d, node, p, gpus)
        return False

    def _limits_of(self, node: Node) -> tuple[str, tuple[tuple[str, float], ...], float | None]:
        """A node's first held domain ("": none), its capped domains with their
        caps, and the power limit its GPUs all share (None: they differ):
        none changes in a pass, and `refuses` asks per candidate. Asked anew
        each time, a cold start at 16,000 nodes took 1.24-1.31x the time
        (benchmarks/placement.py --facility --nodes 16000 [--rack-nodes 40]):
        at issue 33's 1.3x line, kept, as without it 10,000/s was out of reach."""
        got = self._limits.get(node.name)
        if got is None:
            ds, holds, budgets = self.loc.get(node.name, ()), self.state.holds, self.state.budgets
            got = self._limits[node.name] = (
                first_held(holds, ds),
                tuple([(d, budgets[d]) for d in ds if d in budgets]),
                power_limit(node.gpus),
            )
        return got

    def _uniform_w(self, node: Node) -> float | None:
        """The power limit all of a node's GPUs share (None: they differ)."""
        return self._limits_of(node)[2]

    def _noted(self, domain: str, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> bool:
        """A refusal, noted in words for the placement under way and kept for
        the pass (`blocked`) for every node of the domain it holds for: a
        hold, all; a cap, every node whose shard would draw as much or more.
        Node by node, a capped PDU's nodes were as many refusals to find. (A
        set of the domains and draws blocked so won 0.97-1.09x at 16,000 nodes:
        benchmarks/placement.py --facility --nodes 16000; cut, under issue 33's 1.3x.)"""
        if domain not in self.seen and len(self.seen) < limits.LIMITS.rejections_kept:
            self.reasons(node, p, gpus)
        blocked = self.blocked(p)
        every = domain in self.state.holds or p.power_w
        mine = None if every else self._uniform_w(node)
        if not every and mine is None:
            return True  # (GPUs of unlike limits: its draw depends on the GPUs it gets)
        blocked.add(node.name)
        names = self.state.domain_nodes.get(domain, ())
        if every:
            blocked.update(names)
            if self.credit:  # (what a node hands over is its own: see `credit`)
                blocked.difference_update(self.credit)
        else:
            credit = self.credit
            for w, alike in self._by_limit(domain, names).items():
                if w is not None and w >= mine:  # type: ignore[operator]
                    blocked.update(alike if not credit else [n for n in alike if n not in credit])
        if self._cells is not None:
            # Cells all of whose nodes are refused are passed over whole:
            # walking a capped PDU's nodes at each search, a cold start on
            # 16,000 nodes took 4x the time (benchmarks/placement.py --facility --nodes 16000).
            cells = self._cells.nodes
            dead = self.dead(p)
            for c in self._cells.in_domain.get(domain, ()):
                if c not in dead and cells[c] <= blocked:
                    dead.add(c)
        return True

    def _by_limit(self, domain: str, names) -> dict[float | None, list[str]]:
        """A domain's nodes by the power limit their GPUs all say (None: they
        differ), kept with the cells across passes; a waiting reason reads it
        too. Read node by node at each, a cold start at 16,000 nodes took
        1.7-2.1x the time where the caps leave most nodes idle (50 racks), and
        1.0-1.2x with racks of 40 (benchmarks/placement.py --facility
        --nodes 16000 [--rack-nodes 40])."""
        limited = self.cells().limited
        out = limited.get(domain)
        if out is None:
            out = limited[domain] = {}
            nodes = self.state.nodes
            for name in names:
                out.setdefault(self._uniform_w(nodes[name]), []).append(name)
        return out

    def dead(self, p: ev.ProfileSpec) -> set[int]:
        """The cells (Cells) every node of which `blocked` holds for this draw."""
        key = (p.power_w, p.gpus)
        out = self._dead.get(key)
        if out is None:
            out = self._dead[key] = set()
        return out

    def blocked(self, p: ev.ProfileSpec) -> set[str]:
        """Nodes known to refuse a shard of this draw for the rest of the pass:
        a domain's draw only grows until a stop makes room (`_room_made`). On
        a fleet whose caps bind, asking each again was most of a cold start."""
        key = (p.power_w, p.gpus)
        out = self._blocked.get(key)
        if out is None:
            out = self._blocked[key] = set()
        return out

    def _watts(self, p: ev.ProfileSpec, node: Node, gpus: list[int]) -> float:
        """facility.shard_watts, without reading the GPUs where they all say one limit."""
        if p.power_w:
            return p.power_w
        w = self._uniform_w(node)
        return shard_watts(p, node, gpus) if w is None else w * len(gpus)

    def fit_together(self, nodes: list[Node], p: ev.ProfileSpec, gpus: list[list[int]]) -> bool:
        """Whether the shards of one multi-node replica, each fitting alone,
        fit the caps together (two on one PDU count twice)."""
        if not self.capped:
            return True
        extra: dict[str, float] = {}
        draw = self.draw
        for node, gs in zip(nodes, gpus):
            w = self._watts(p, node, gs) - self.credit.get(node.name, 0.0)
            for d in self.loc.get(node.name, ()):
                if d in draw:
                    extra[d] = extra.get(d, 0.0) + w
        budgets = self.state.budgets
        return not any(over_cap(draw[d], w, budgets[d]) for d, w in extra.items())

    def take(self, node: Node, p: ev.ProfileSpec, gpus: list[int]) -> None:
        """A shard placed in this pass: its draw counts from now on."""
        if self.capped:
            caps = self._limits_of(node)[1]
            w = self._watts(p, node, gpus)
            if w and caps:
                draw = self.draw
                for d, _cap in caps:
                    draw[d] += w

    def shift(self, node: Node, sh: Shard, give: bool, handover: bool = False) -> None:
        """A shard stopped in this pass (give) frees what it counts for, or not
        after all. `handover` (for a replacement in place): it draws until it
        exits, so its draw is credited to the replacement on its own node only
        (`credit`), as the fold credits it (decisions._place); freed for the
        whole domain, a replacement elsewhere on its PDU was voided by the fold."""
        self._touch(node.name)
        if not self.capped:
            return
        if handover:
            if give:
                self.credit[node.name] = self.credit.get(node.name, 0.0) + counted(node, sh)
                self._room_made()
            else:
                self.credit.pop(node.name, None)
            return
        w = counted(node, sh)
        self._add(node.name, -w if give else w)

    def _room_made(self) -> None:
        """What was refused may fit again: every refusal of the pass is forgotten."""
        self._blocked.clear()
        self._dead.clear()
        self.epoch += 1

    def _add(self, name: str, w: float) -> None:
        if w < 0:  # room made: what was refused may fit again
            self._room_made()
        draw = self.draw
        for d in self.loc.get(name, ()):
            if d in draw:
                draw[d] += w

    # ------------------------------------------------------------------ spread and keep_within

    def levels(self, spread: dict[str, int]) -> Levels | None:
        """Spread by rack, then PDU, then node, where nodes say where they
        are (None: none does). Kept on the spread for this pass (a `Spread`,
        as passes make them; a plain dict's are made again each time)."""
        kept = getattr(spread, "levels", None)
        if kept is not None and kept[0] is self:
            return kept[1]
        if not self.loc or not self.cells().nodes:
            return None
        levels = Levels(spread, self)
        if isinstance(spread, Spread):
            spread.levels = (self, levels)
        return levels

    def expect(self, spread: dict[str, int], names: list[str]) -> None:
        """A placement took these nodes for a model of this spread: the
        levels kept for it (if any) are told, before Inventory.place counts them in it."""
        kept = getattr(spread, "levels", None)
        if kept is not None and kept[0] is self:
            for name in names:
                kept[1].took(name, spread.get(name, 0), 1)

    def domain_of(self, kind: str, name: str) -> str:
        return domain_of_kind(self.loc, kind, name)

    def within(self, kind: str, names: Iterable[str]) -> list[str]:
        """The domains of a kind these nodes are in, in name order."""
        return sorted({d for d in (self.domain_of(kind, n) for n in names) if d})

    def keep_within_reason(self, p: ev.ProfileSpec, fitting: list[str]):
        """Why no domain of the profile's keep_within kind has enough nodes
        that fit (explain), or None when one has."""
        per = Counter(d for d in (self.domain_of(p.keep_within, n) for n in fitting) if d)
        if any(c >= p.nodes for c in per.values()):
            return None
        need = f"{p.nodes} nodes that fit in one {p.keep_within}"
        if not per:
            return fit.Reason(rule=KEEP_WITHIN, need=need, have=f"no node that fits has a {LABELS[p.keep_within]} label")
        most = max(per.values())
        where = min(d for d, c in per.items() if c == most)
        return fit.Reason(rule=KEEP_WITHIN, need=need, have=f"{most} in {where}")


class Outside:
    """The `taken` of placement's search for one shard of a replica kept
    within a domain: the nodes chosen already, and every node outside it."""

    __slots__ = ("fac", "kind", "domain", "chosen")

    def __init__(self, fac: PassFacility, kind: str, domain: str, chosen: list) -> None:
        self.fac, self.kind, self.domain, self.chosen = fac, kind, domain, chosen

    def __contains__(self, v) -> bool:
        return v in self.chosen or self.fac.domain_of(self.kind, v.name) != self.domain


class Together:
    """The `taken` of the search for a multi-node replica's shards where caps
    bind: the nodes `inner` holds, and every node whose shard would take a
    domain past its cap with those chosen before it (as fit_together counts).
    Checked only once all were chosen, a fabric whose two best nodes shared
    a PDU with room for one was given up though its others had room. (A memo
    of the answer per domains and GPU limit won 1.0-1.09x at 16,000 nodes, and
    nothing with racks of 40: benchmarks/placement.py --facility --nodes 16000
    [--rack-nodes 40]; cut, under issue 33's 1.3x.)"""

    __slots__ = ("fac", "p", "chosen", "inner", "gpus_for", "extra", "counted")

    def __init__(self, fac: PassFacility, p: ev.ProfileSpec, chosen: list, inner, gpus_for) -> None:
        self.fac, self.p, self.chosen, self.inner, self.gpus_for = fac, p, chosen, inner, gpus_for
        self.extra: dict[str, float] = {}  # capped domain -> what the chosen shards add to it
        self.counted = 0  # the chosen counted in `extra`

    def __contains__(self, v) -> bool:
        if v in self.inner:
            return True
        chosen = self.chosen
        if not chosen:
            return False
        fac, p, extra = self.fac, self.p, self.extra
        draw = fac.draw
        credit, loc = fac.credit, fac.loc
        while self.counted < len(chosen):
            c = chosen[self.counted]
            self.counted += 1
            w = fac._watts(p, c.node, self.gpus_for(c, p)) - credit.get(c.name, 0.0)
            for d in loc.get(c.name, ()):
                if d in draw:
                    extra[d] = extra.get(d, 0.0) + w
        if not extra:
            return False
        gpus = self.gpus_for(v, p)
        w = fac._watts(p, v.node, gpus) - credit.get(v.name, 0.0)
        budgets = fac.state.budgets
        for d in loc.get(v.name, ()):
            e = extra.get(d)
            if e is not None and over_cap(draw[d], e + w, budgets[d]):
                fac.refuses(v.node, p, gpus)  # (refused alone: noted for the pass)
                return True
        return False

