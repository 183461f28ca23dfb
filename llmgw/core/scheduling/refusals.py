"""Why a profile fits nowhere, counted by the index's classes, not node by node.

A model that fits nowhere waits with, for each rule (fit.RULES), how many
nodes break it and the first of them (`fit.Refusals`). explain.py counts
that node by node; asked at every model that waits, that walk was 88% of a
cold start on 16,000 nodes whose caps bind (issue 33, benchmarks/placement.py
--facility --nodes 16000). Here each rule is counted from its class, as
Nomad's AllocMetric counts nodes by what filtered them:

- ready: the nodes outside the node index, one by one (few);
- labels and GPUs: alike for the nodes of one index group and free GPU
  count: a bucket's length and its first name;
- memory, cores, ports: nobody is short while the pass's floors say so
  (Classes.floors); else node by node, that rule only;
- held: the nodes of each held domain;
- power: per capped domain, its ready nodes by free GPU count
  (Classes.domain_free): where their GPUs all say one power limit (the
  search's PassFacility._by_limit tells), a shard's draw follows from the
  free count; else node by node.

tests/test_refusals.py holds the two countings to the same text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..contract.events import ProfileSpec
from .facility import HELD, POWER, over_cap
from .fit import (
    CPU,
    FABRIC,
    MEMORY,
    PORTS,
    READY,
    RULES,
    Reason,
    Refusals,
    RuleCount,
    _kind_reasons,
    _mixed_reasons,
    cpu_reason,
    cpu_short,
    held_reason,
    label_reasons,
    memory_reason,
    memory_short,
    needs,
    ports_reason,
    power_reason,
    ready_reason,
)
from ..folding.state import Node, State
from .ports import port_range

if TYPE_CHECKING:
    from .placement import Inventory, _View


class Floors(NamedTuple):
    """The least any ready node has free in the pass (lower bounds): no node
    is short of memory, cores or ports while a profile asks less."""

    memory_gb: float
    cpu_cores: float
    coreless: bool  # a ready node reports no cores (a CPU-only profile is refused there)
    ports: float


def _room_of(node: Node, v: _View | None) -> tuple[float, float, float]:
    """What one node has free (memory, cores, ports; inf: no limit said)."""
    mem_used, cpu_used = (v.mem_used, v.cpu_used) if v is not None else (node.memory_used, node.cpu_used)
    first, last = port_range(node)
    held = len(v.ports) if v is not None and v.ports is not None else len(node.ports) + len(node.taken)
    return (
        node.memory_gb - mem_used if node.memory_gb else float("inf"),
        node.cpu_cores - cpu_used if node.cpu_cores else float("inf"),
        last - first + 1 - held,
    )


class Classes:
    """What the counts are taken by in one pass, each made at its first ask
    (one walk of the fleet per pass, not per waiting model) and kept as the
    inventory takes and gives (`lowered`, `moved`). It keeps no reference
    to the inventory: a cycle is left for the collector (control/heap.py)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._floors: list | None = None
        self._hist: dict[str, list[int]] | None = None

    def floors(self, inv: Inventory) -> Floors:
        """The least memory, cores and ports any ready node has free, and whether one reports no cores."""
        if self._floors is None:
            mem = cpu = ports = float("inf")
            coreless = False
            views, nodes = inv._views, inv._state.nodes
            for name in inv._build().entries:
                node = nodes[name]
                m, c, pt = _room_of(node, views.get(name))
                mem, cpu, ports = min(mem, m), min(cpu, c), min(ports, pt)
                coreless = coreless or not node.cpu_cores
            self._floors = [mem, cpu, coreless, ports]
        return Floors(*self._floors)

    def lowered(self, v: _View) -> None:
        """A node has less free: the floors (if made) go down with it."""
        f = self._floors
        if f is not None:
            m, c, pt = _room_of(v.node, v)
            f[0], f[1], f[3] = min(f[0], m), min(f[1], c), min(f[3], pt)

    def domain_free(self, inv: Inventory) -> dict[str, list[int]]:
        """Capped domain -> how many of its ready nodes have k GPUs free (k: the index)."""
        if self._hist is None:
            idx, state = inv._build(), self.state
            entries, top = idx.entries, idx.top
            hist = {}
            for d in state.budgets:
                counts = [0] * (top + 1)
                for name in state.domain_nodes.get(d, ()):
                    e = entries.get(name)
                    if e is not None:
                        counts[e.free] += 1
                hist[d] = counts
            self._hist = hist
        return self._hist

    def moved(self, name: str, before: int, after: int) -> None:
        """A node's free GPU count changed: so did its domains' counts (if made)."""
        if self._hist is not None:
            for d in self.state.located.get(name, ()):
                h = self._hist.get(d)
                if h is not None:
                    h[before] -= 1
                    h[after] += 1


class _Tally:
    """rule -> [count, (first node, its place among that node's reasons of the rule), reason]."""

    def __init__(self) -> None:
        self.rules: dict[str, list] = {}

    def add(self, rule: str, n: int, key: tuple[str, int], reason: Reason) -> None:
        got = self.rules.get(rule)
        if got is None:
            self.rules[rule] = [n, key, reason]
        else:
            got[0] += n
            if key < got[1]:
                got[1], got[2] = key, reason

    def counts(self) -> tuple[RuleCount, ...]:
        rules = self.rules
        return tuple(
            RuleCount(rule=r, count=rules[r][0], first=rules[r][1][0], reason=rules[r][2]) for r in RULES if r in rules
        )


def count_refusals(inv: Inventory, p: ProfileSpec) -> Refusals:
    """`fit.refusals_of(explain.profile_fit(inv, p))`, the same record, counted by class."""
    idx = inv._build()
    state, entries = inv._state, idx.entries
    t = _Tally()
    if len(entries) != len(state.nodes):  # not ready, or cordoned (admission.py): outside the index
        for name, node in state.nodes.items():
            if name not in entries:
                t.add(READY, 1, (name, 0), ready_reason(node))
    _labels_and_gpus(inv, p, t)
    bad = _room(inv, p, t)
    refused = _facility(inv, p, t)
    fabrics: tuple[Reason, ...] = ()
    if p.nodes > 1:
        fabrics = _fabrics(inv, p, bad, refused)
    return Refusals(profile=p.name, needs=needs(p), rules=t.counts(), fabrics=fabrics)


def _labels_and_gpus(inv: Inventory, p: ProfileSpec, t: _Tally) -> None:
    """The rules on what a node is and its GPUs, by index group and free GPU count."""
    idx = inv._index
    for grp in idx.groups.values():  # type: ignore[union-attr]
        # (A fabric is asked of a multi-node profile only: counted below, apart.)
        labels = label_reasons(p, grp.pool, "-", grp.simulated)
        n = sum(map(len, grp.buckets))
        if labels and n:
            first = min(b[0] for b in grp.buckets if b)
            for r in labels:
                t.add(r.rule, n, (first, 0), r)
        for k, bucket in enumerate(grp.buckets):
            if not bucket:
                continue
            if grp.kind is not None:
                for r in _kind_reasons(p, grp.kind, k):
                    t.add(r.rule, len(bucket), (bucket[0], 0), r)
            else:
                for name in bucket:
                    v = inv.view(name)
                    for r in _mixed_reasons(p, v.node.gpus, v.free):
                        t.add(r.rule, 1, (name, 0), r)
    if p.nodes > 1:  # the nodes without a fabric: those filed in no fabric group
        with_fabric = sum(sum(map(len, g.buckets)) for g in idx.fabric_groups.values())  # type: ignore[union-attr]
        if with_fabric < len(idx.entries):  # type: ignore[union-attr]
            without = [name for name, e in idx.entries.items() if len(e.groups) == 1]  # type: ignore[union-attr]
            r = label_reasons(p, "", "", False)[-1]  # the fabric's (the last rule asked), alike for all
            t.add(FABRIC, len(without), (min(without), 0), r)


def _room(inv: Inventory, p: ProfileSpec, t: _Tally) -> set[str]:
    """Memory, cores and ports: node by node only where the pass's floors
    say someone may be short. Returns the nodes short of any."""
    floors = inv.classes.floors(inv)
    bad: set[str] = set()
    mem = bool(p.memory_gb) and p.memory_gb > floors.memory_gb - 0.002  # (add_gb rounds to the MB)
    cpu = bool(p.cpu_cores) and (p.cpu_cores > floors.cpu_cores or (p.gpus == 0 and floors.coreless))
    ports = floors.ports <= 0
    if not (mem or cpu or ports):
        return bad
    views, nodes = inv._views, inv._state.nodes
    for name in inv._index.entries:  # type: ignore[union-attr]
        v = views.get(name)
        node = nodes[name]
        if mem:
            used = v.mem_used if v is not None else node.memory_used
            if memory_short(p, node, used):
                t.add(MEMORY, 1, (name, 0), memory_reason(p, node, used))
                bad.add(name)
        if cpu:
            used = v.cpu_used if v is not None else node.cpu_used
            if cpu_short(p, node, used):
                t.add(CPU, 1, (name, 0), cpu_reason(p, node, used))
                bad.add(name)
        if ports:
            v = v or inv.view(name)
            if not v.free_port():
                t.add(PORTS, 1, (name, 0), ports_reason(node, *port_range(node)))
                bad.add(name)
    return bad


def _facility(inv: Inventory, p: ProfileSpec, t: _Tally) -> tuple[set[str], set[str]]:
    """Held domains and power caps. Returns (the nodes refused one by one,
    the domains that refuse a shard of the profile's whole draw on any of
    their nodes that would get all its GPUs)."""
    fac, state = inv._fac, inv._state
    entries = inv._index.entries  # type: ignore[union-attr]
    nodes_refused: set[str] = set()
    domains_refused: set[str] = set()
    if not fac.active:
        return nodes_refused, domains_refused
    loc = state.located
    for d, hold in state.holds.items():
        r = held_reason(d, hold.reason or "no reason given")
        for name in state.domain_nodes.get(d, ()):
            if name in entries:
                t.add(HELD, 1, (name, loc[name].index(d)), r)
                nodes_refused.add(name)
    if not state.budgets:
        return nodes_refused, domains_refused
    draw, credit = fac.draw, fac.credit
    per_node = {d for n in credit for d in loc.get(n, ())}  # a draw handed over is the node's own
    # A node of mixed GPUs gives a profile those of its kind, so its shard's
    # draw does not follow from its free count: counted node by node.
    mixed = any(g.kind is None for g in inv._index.groups.values())  # type: ignore[union-attr]
    hist = inv.classes.domain_free(inv)
    for d, cap in state.budgets.items():
        names = state.domain_nodes.get(d, ())
        if not names:
            continue
        x = draw[d]
        limit = None if d in per_node or mixed else _one_limit(fac._by_limit(d, names), entries)
        if limit is None:  # node by node
            for name in names:
                if name not in entries:
                    continue
                v = inv.view(name)
                w = fac._watts(p, v.node, inv._gpus_for(v, p)) - credit.get(name, 0.0)
                if w > 0 and over_cap(x, w, cap):
                    t.add(POWER, 1, (name, loc[name].index(d)), power_reason(d, x + w, cap))
                    nodes_refused.add(name)
            continue
        counts = hist[d]
        # A node with k GPUs free gets min(k, gpus) of them: its draw (a
        # profile's declared one is the same on every node).
        def w_of(k: int) -> float:
            return p.power_w or limit * min(k, p.gpus)

        k0 = next((k for k in range(len(counts)) if w_of(k) > 0 and over_cap(x, w_of(k), cap)), None)
        if k0 is None:
            continue
        n = sum(counts[k0:])
        if not n:
            continue
        if w_of(p.gpus) > 0 and over_cap(x, w_of(p.gpus), cap):  # (a node with the GPUs free is refused)
            domains_refused.add(d)
        first = next(name for name in names if name in entries and entries[name].free >= k0)
        t.add(POWER, n, (first, loc[first].index(d)), power_reason(d, x + w_of(entries[first].free), cap))
    return nodes_refused, domains_refused


def _one_limit(by_limit: dict[float | None, list[str]], ready) -> float | None:
    """The power limit every GPU of every ready node of a domain says (None: they differ)."""
    said = [w for w, alike in by_limit.items() if any(n in ready for n in alike)]
    return said[0] if len(said) == 1 else None


def _fabrics(inv: Inventory, p: ProfileSpec, bad: set[str], refused: tuple[set[str], set[str]]) -> tuple[Reason, ...]:
    """Why no fabric (or domain of the profile's keep_within kind) has enough
    nodes that fit, as explain says it: the nodes of the groups that admit
    the profile with its GPUs free, less those refused above."""
    nodes_refused, domains_refused = refused
    out = bad | nodes_refused
    names = inv._state.domain_nodes
    for d in domains_refused:
        out.update(names.get(d, ()))
    fitting: dict[str, int] = {}
    fits: list[str] = []
    for grp in inv._admitting(inv._index, p):  # type: ignore[arg-type]
        for bucket in grp.buckets[p.gpus :]:
            left = [name for name in bucket if name not in out] if out else bucket
            if grp.kind is None:
                left = [name for name in left if not _mixed_reasons(p, inv.view(name).node.gpus, inv.view(name).free)]
            if left:
                fits.extend(left)
                fitting[grp.fabric] = fitting.get(grp.fabric, 0) + len(left)
    if p.keep_within and fitting:
        kept = inv.keep_within_reason(p, sorted(fits))
        if kept is not None:
            return (kept,)
    if fitting and not any(n >= p.nodes for n in fitting.values()):
        most = max(fitting.values())
        where = min(f for f, n in fitting.items() if n == most)
        return (Reason(rule=FABRIC, need=f"{p.nodes} nodes that fit in one fabric", have=f"{most} in {where}"),)
    return ()
