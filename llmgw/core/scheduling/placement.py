"""Where a replica goes: the choice among the nodes that fit, and one pass's inventory.

A node takes one shard of a profile when every question of fit.py holds
(ready, labels, GPUs, memory, cores, ports; held domains, power caps and
keep_within: facility.py). A multi-node profile (`nodes > 1`) takes a shard
on each of that many distinct nodes of one fabric (the llmgw.io/fabric
label), rank 0 the endpoint: tensor-parallel traffic over a network nobody
vouched for fails or crawls, and a label is one line of an agent file,
where a wrong guess is hours of NCCL timeouts.

Among the nodes that fit:

- spread first: the nodes that run none of the model's replicas, then one,
  and so on, so that a node lost takes as few as it can; where nodes say
  their rack and PDU, the rack with the fewest first, then the PDU, then
  the node (facility_spread.level, searched by facility_search.py).
- then best fit: the fewest free GPUs that are enough, ties in name order,
  so that whole nodes stay free for 8-GPU profiles (first fit put a small
  replica on the first node with room, often a whole free one).
- a multi-node replica: the first fabric in name order with enough nodes
  that fit, in the same rounds of spread (fabrics.py).

`Inventory` is what is free in one pass of decide, so that the pass's
placements see each other (else two could name one GPU and the fold would
void the second). It works on the node index (nodeindex.py: the ready
nodes by pool, kind of GPU and fabric, then by free GPU count), made at the
pass's first placement. A waiting reason counts what explain.py says node
by node from the index's classes (refusals.py; tests/test_refusals.py holds
the two to one text).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from itertools import filterfalse

from . import fabrics, facility_pass, facility_search, refusals
from .facility_spread import Spread
from ..contract.events import ProfileSpec, ShardPlacement
from ..folding.nodeindex import FABRIC_LABEL, POOL_LABEL, Group, NodeIndex, index_of, kind_of
from ..folding.state import TERMINAL_SHARD_STATES, Node, Replica, Shard, State, add_gb
from .fit import (
    Reason, _kind_reasons, _mixed_reasons, cpu_reason, cpu_short, gpu_model_matches, label_reasons, memory_reason,
    memory_short, ports_reason, ready_reason,
)
from .ports import port_range


# --------------------------------------------------------------------------- the inventory


class _View:
    """What one node has free in this pass: its GPUs, memory, cores and ports.
    Made when the pass first looks at the node, from the node as folded."""

    __slots__ = (
        "name", "node", "ready", "free", "kind", "pool", "fabric", "simulated", "mem_used", "cpu_used", "ports",
        "next_port", "last_port", "groups",
    )

    def __init__(self, name: str, node: Node, groups: tuple[Group, ...]) -> None:
        self.name = name
        self.node = node
        # A node that is not (or is cordoned: admission.py): explained, never placed on.
        self.ready = node.state == "ready" and not node.cordon
        gpus, used = node.gpus, node.used
        # Only GPUs the node has: a stray may report one it does not.
        self.free = sorted(g.index for g in gpus if g.index not in used) if used else sorted(g.index for g in gpus)
        # (The index filed it by its kind already: reading its GPUs again per view was a cold start's cost.)
        self.kind = groups[0].kind if groups else kind_of(gpus)
        labels = node.labels
        self.pool = labels.get(POOL_LABEL, "")
        self.fabric = labels.get(FABRIC_LABEL, "")
        self.simulated = node.simulated
        self.mem_used = node.memory_used
        self.cpu_used = node.cpu_used
        self.ports: set[int] | None = None  # built when first asked
        self.next_port, self.last_port = port_range(node)
        self.groups = groups  # the index's groups it is filed in

    def free_port(self) -> int:
        """The lowest port of the node's range not held by a shard, a stray
        or another program (0: none left)."""
        if self.ports is None:
            self._build_ports()
        port = self.next_port
        while port in self.ports:  # type: ignore[operator]
            port += 1
        self.next_port = port  # ports are only taken within a pass, never freed
        return port if port <= self.last_port else 0

    def _build_ports(self) -> None:
        node = self.node
        self.ports = set(node.ports)
        if node.taken:
            self.ports.update(node.taken)


class Inventory(fabrics.FabricSearch, facility_search.CellSearch):
    """What is free in one pass of decide, and where a replica fits in it.

    Works on the state's node index itself: a node whose free GPUs the pass
    changes is moved in its buckets and marked for the next pass to file
    again from the state (what this pass decided may not land); copying the
    buckets cost more than the placements at 16,000 nodes (benchmarks/placement.py).

    `_best` searches one round of spread (`fabrics._limits`);
    fabrics.FabricSearch, the fabrics of a multi-node profile;
    facility_search.CellSearch, the cells of racks and PDUs."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._index: NodeIndex | None = None  # synced at first need
        self._views: dict[str, _View] = {}
        self._fac = facility_pass.PassFacility(state)  # facility: holds, power caps, racks and PDUs
        self.classes = refusals.Classes(state)  # what the refusals are counted by, kept as the pass takes
        self._search_init()  # facility: facility_search

    # ------------------------------------------------------------------ the index

    def _build(self) -> NodeIndex:
        idx = self._index
        if idx is None:
            idx = self._index = index_of(self._state)
            self._fac.index = idx
        return idx

    def ready(self) -> list[_View]:
        """The ready nodes, in name order."""
        return [self.view(n) for n in self._build().ready_names]

    def has_ready(self) -> bool:
        """Whether any node is ready (and not cordoned), without a view of each."""
        return bool(self._build().ready_names)

    def view(self, name: str) -> _View:
        v = self._views.get(name)
        if v is None:
            entry = self._build().entries.get(name)
            v = self._views[name] = _View(name, self._state.nodes[name], entry.groups if entry else ())
        return v

    def _move(self, v: _View, before: int) -> None:
        """The node's free GPU count changed in this pass: move it in the
        index, which files it again from the state at the next pass."""
        after, name, idx = len(v.free), v.name, self._index
        if after > before:
            self._too_few.clear()  # (room made: see facility_search)
        for grp in v.groups:
            buckets = grp.buckets
            old = buckets[before]
            del old[bisect_left(old, name)]
            insort(buckets[after], name)
        idx.moved(name, after)  # type: ignore[union-attr]
        self.classes.moved(name, before, after)
        if self._fac.active:
            self._located_moved(name, before, after)  # facility: facility_search

    # ------------------------------------------------------------------ the rules, per node

    def reasons(self, v: _View, p: ProfileSpec) -> tuple[Reason, ...]:
        """Every rule this node breaks for one shard of the profile; () when it fits."""
        if not v.ready:
            return (ready_reason(v.node),)
        return self._fixed_reasons(v, p) + self._room_reasons(v, p)

    def _fixed_reasons(self, v: _View, p: ProfileSpec) -> tuple[Reason, ...]:
        """The rules on labels and GPUs."""
        gpus = _mixed_reasons(p, v.node.gpus, v.free) if v.kind is None else _kind_reasons(p, v.kind, len(v.free))
        return label_reasons(p, v.pool, v.fabric, v.simulated) + gpus

    def _room_reasons(self, v: _View, p: ProfileSpec) -> tuple[Reason, ...]:
        """The rules on what the node's other shards hold: memory, cores, ports."""
        node = v.node
        out: tuple[Reason, ...] = ()
        if memory_short(p, node, v.mem_used):
            out += (memory_reason(p, node, v.mem_used),)
        if cpu_short(p, node, v.cpu_used):
            out += (cpu_reason(p, node, v.cpu_used),)
        if not v.free_port():
            out += (ports_reason(node, *port_range(node)),)
        if self._fac.active:  # facility: held domains, power caps
            out += self._fac.reasons(node, p, self._gpus_for(v, p))
        return out

    def _room_ok(self, v: _View, p: ProfileSpec) -> bool:
        """`not _room_reasons(v, p)` less the facility's (PassFacility.refuses
        asks those first), without words: what the search asks of a candidate."""
        node = v.node
        return not (memory_short(p, node, v.mem_used) or cpu_short(p, node, v.cpu_used) or not v.free_port())

    # ------------------------------------------------------------------ placing

    def fits(self, p: ProfileSpec, spread: dict[str, int]) -> bool:
        """Whether a replica of this profile would fit now (nothing is taken)."""
        return self._find(p, spread) is not None

    def _find(self, p: ProfileSpec, spread: dict[str, int]) -> list[_View] | None:
        idx = self._index or self._build()
        if p.nodes == 1:
            groups = self._admitting(idx, p)
            fac = self._fac
            if fac.loc:  # facility: rack, then PDU, then node (facility_search)
                levels = fac.levels(spread)  # (made at its first search)
                if levels is not None:
                    v = self._spread_pick(p, groups, levels, spread)
                    return [v] if v is not None else None
            for limit in fabrics._limits(spread):
                v = self._best(p, groups, spread, limit, ())
                if v is not None:
                    return [v]
            return None
        return self._fabric_pick(p, self._by_fabric(idx, p), spread)

    def place(self, p: ProfileSpec, replica: str, spread: dict[str, int]) -> list[ShardPlacement] | None:
        """Shards for one replica of this profile, taken from the inventory
        (None: it fits nowhere). `spread`, the model's replicas per node, counts
        the replica's nodes: a pass's spreads change only here."""
        fac = self._fac
        if fac.seen:
            fac.seen = {}  # (only the facility says rejections: see `rejections`)
        chosen = self._find(p, spread)
        if chosen is None:
            return None
        shards = []
        for rank, v in enumerate(chosen):
            gpus = self._gpus_for(v, p)
            port = self._take(v, gpus, p)
            shards.append(ShardPlacement(shard=f"{replica}.{rank}", node=v.name, rank=rank, gpus=gpus, port=port))
        if fac.loc:  # facility: the model's levels count the nodes, told before the spread does
            fac.expect(spread, [v.name for v in chosen])
        for v in chosen:
            spread[v.name] = spread.get(v.name, 0) + 1
        return shards

    def _admitting(self, idx: NodeIndex, p: ProfileSpec) -> list[Group]:
        """The groups whose labels and GPUs suit the profile, were their GPUs
        all free. Kept with the index until it gains a group: asked anew at
        each search, a cold start at 16,000 nodes took 1.45-1.55x the time, 5.5x with
        racks of 40 (benchmarks/placement.py --facility --nodes 16000 [--rack-nodes 40])."""
        key = fabrics.admit_key(p)
        cached = idx.admitted.get(key)
        if cached is not None and cached[0] == idx.version:
            return cached[1]
        out = []
        for grp in (idx.groups if p.nodes == 1 else idx.fabric_groups).values():
            if label_reasons(p, grp.pool, grp.fabric, grp.simulated):
                continue
            if grp.kind is not None and _kind_reasons(p, grp.kind, grp.kind[2]):
                continue
            out.append(grp)
        if p.nodes > 1:
            out.sort(key=lambda g: g.fabric)  # stable: each fabric's groups in the order they were made
        idx.admitted[key] = (idx.version, out)
        return out

    def _best(self, p: ProfileSpec, groups: list[Group], spread: dict[str, int], limit: int, taken) -> _View | None:
        """The fitting node with the fewest free GPUs that are enough, ties in
        name order, among those running fewer than `limit` of the model's
        replicas and not in `taken`."""
        views, fac = self._views, self._fac
        lists = [grp.buckets for grp in groups]
        # The nodes that run the model are skipped in C when every one of
        # them is (the first round): a model's own replicas sit at the head
        # of the buckets they were placed from, and looking at each of them
        # in Python was most of a cold start.
        skip_all = bool(spread) and limit == 1  # (spread counts are >= 1)
        count = bool(spread) and limit > 1
        blocked = fac.blocked(p) if fac.active else None  # facility: nodes known refused in this pass
        for k in range(p.gpus, self._index.top + 1):  # type: ignore[union-attr]
            best: _View | None = None
            for grp, buckets in zip(groups, lists):
                bucket = buckets[k]
                if not bucket:
                    continue
                names = filterfalse(spread.__contains__, bucket) if skip_all else bucket
                for name in filterfalse(blocked.__contains__, names) if blocked else names:
                    if best is not None and name >= best.name:
                        break  # this group has nothing earlier in name order
                    if count and spread.get(name, 0) >= limit:
                        continue
                    v = views.get(name) or self.view(name)
                    if v in taken:
                        continue
                    if grp.kind is None and _mixed_reasons(p, v.node.gpus, v.free):
                        continue
                    if fac.active and fac.refuses(v.node, p, self._gpus_for(v, p)):  # facility: holds, caps
                        continue
                    if not self._room_ok(v, p):
                        continue
                    best = v
                    break
            if best is not None:
                return best
        return None

    def _gpus_for(self, v: _View, p: ProfileSpec) -> list[int]:
        """The lowest-numbered free GPUs of the node that suit the profile."""
        if v.kind is not None or p.gpus == 0:
            return v.free[: p.gpus]
        suit = {
            g.index
            for g in v.node.gpus
            if (not p.gpu_model or gpu_model_matches(p.gpu_model, g.model)) and g.memory_gb >= p.gpu_memory_gb
        }
        return [i for i in v.free if i in suit][: p.gpus]

    def _take(self, v: _View, gpus: list[int], p: ProfileSpec) -> int:
        """Take GPUs, memory, cores and a port on a node; returns the port."""
        free = v.free
        before = len(free)
        if gpus:
            n = len(gpus)
            # (Usually the lowest free ones, _gpus_for: a slice, not a filter.)
            if free[:n] == gpus:
                v.free = free[n:]
            else:
                taken = set(gpus)
                v.free = [g for g in free if g not in taken]
            self._move(v, before)
        if p.memory_gb:
            v.mem_used = add_gb(v.mem_used, p.memory_gb)
        v.cpu_used += p.cpu_cores
        self._fac.take(v.node, p, gpus)  # facility: its draw counts for its domains
        port = v.free_port()
        v.ports.add(port)  # type: ignore[union-attr]
        v.next_port = port + 1
        self.classes.lowered(v)
        return port

    def release(self, shards: list[Shard], handover: bool = False) -> None:
        """Count what these shards hold as free in this pass, for the
        replacement of a replica stopped in it (`handover`: in place, starting
        once they exit: PassFacility.shift)."""
        self._shift(shards, give=True, handover=handover)

    def hold(self, shards: list[Shard], handover: bool = False) -> None:
        """Undo `release`: the replica is not stopped after all, or it holds
        what its replacement did not take until it exits."""
        self._shift(shards, give=False, handover=handover)

    def _shift(self, shards: list[Shard], give: bool, handover: bool = False) -> None:
        self._build()
        nodes = self._state.nodes
        for sh in shards:
            if sh.node not in nodes or sh.state in TERMINAL_SHARD_STATES:
                continue
            v = self.view(sh.node)
            if not v.ready:
                continue
            held = {g for g in sh.gpus if v.node.used.get(g) == sh.id}
            before = len(v.free)
            v.free = sorted(set(v.free) | held) if give else [g for g in v.free if g not in held]
            if len(v.free) != before:
                self._move(v, before)
            sign = -1 if give else 1
            self._fac.shift(v.node, sh, give, handover)  # facility: what it draws
            v.mem_used = add_gb(v.mem_used, sign * sh.memory_gb)
            v.cpu_used += sign * sh.cpu_cores
            # (A port another program holds stays out, whoever held it here:
            # the shard placed on it before the agent said so frees nothing.)
            if sh.port and v.node.ports.get(sh.port) == sh.id and sh.port not in v.node.taken:
                if v.ports is None:
                    v._build_ports()
                if give:
                    v.ports.discard(sh.port)
                    v.next_port = min(v.next_port, sh.port)
                else:
                    v.ports.add(sh.port)
            if not give:
                self.classes.lowered(v)

    def rejections(self) -> list[str]:
        """The facility's refusals the last `place` met, by domain, in words."""
        return self._fac.rejections() if self._fac.seen else []

    def describe_nodes(self, names: Iterable[str]) -> str:
        """What these nodes have free in this pass, in words (a preemption keeps it)."""
        out = []
        for name in sorted(set(names)):
            v = self.view(name)
            node = v.node
            parts = [f"{len(v.free)} of {len(node.gpus)} GPUs free"]
            if node.memory_gb:
                parts.append(f"{add_gb(node.memory_gb, -v.mem_used):g} of {node.memory_gb:g} GB free")
            if node.cpu_cores:
                parts.append(f"{node.cpu_cores - v.cpu_used} of {node.cpu_cores} cores free")
            out.append(f"{name}: {', '.join(parts)}")
        return "; ".join(out)

    # ------------------------------------------------------------------ explaining (explain.py)

    def names(self) -> list[str]:
        """Every node's name, ready or not, in order."""
        return sorted(self._state.nodes)

    def keep_within_reason(self, p: ProfileSpec, fitting: list[str]) -> Reason | None:
        """Why no domain of the profile's keep_within kind has enough of these nodes, or None."""
        return self._fac.keep_within_reason(p, fitting)


# --------------------------------------------------------------------------- entry points


def replicas_per_node(replicas: list[Replica]) -> Spread:
    """Node -> how many of these replicas have a shard on it: what spread weighs."""
    out = Spread()
    for r in replicas:
        for s in r.shards:
            out[s.node] = out.get(s.node, 0) + 1
    return out
