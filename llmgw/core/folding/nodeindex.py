"""The ready nodes, indexed for placement and kept by the fold as it goes.

Placement looks for a node by its pool and kind of GPU (and fabric, for a
multi-node profile; and whether it is simulated: fit.SIMULATED) and, within that, by how many GPUs it has free (see
placement.py). That index used to be built at the first placement of every
pass of `decide`: O(fleet) per pass, and a cold start of 16,000 nodes is
~40 passes (the message budget caps a pass at ~1,900 placements), so the
start grew close to quadratically with the fleet (issue 18: 11.6 s at
16,000 nodes, 0.25 s at 2,000), and the pass after one failure cost 67 ms.

Now one `NodeIndex` per folded `State` lives beside it (not in it: a
snapshot and `==` see nothing of it) and the fold marks the nodes whose
index fields it changes (`touch`: registered, lost, a placement, a shard's
end, a replica forgotten). A pass files those again (`sync`, O(nodes
touched)), then works on it (placement.Inventory), so its placements see
each other; a node the pass moves is marked as the fold's are (`moved`), so
the next pass files it again as the fold left it, whether what the pass
decided landed or not. The fields the index keeps are only those that
group and order the candidates (ready, pool, fabric, kind, free GPU count);
what a node has free besides (memory, cores, ports) is read from the node
itself by the pass.

The rule for the fold's handlers: one that changes a node's readiness,
labels, GPUs or the GPUs its shards hold (`Node.used`) calls `touch(state,
node)`. (A new handler that forgets is caught by the property test that
compares the index with one built afresh after every step:
tests/test_properties.py, test_the_node_index_the_fold_keeps_...)

A state the fold never touched (built by hand, as in unit tests) has no
index registered: each pass builds a throwaway one, as before. A state
replayed or copied (verify, a snapshot, `copy_state`) is another object and
gets its own, so nothing is shared between the live state and a replay.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, insort

from ..contract.events import Gpu
from .state import Node, State

POOL_LABEL = "llmgw.io/pool"
FABRIC_LABEL = "llmgw.io/fabric"

Kind = tuple[str, float, int]


def kind_of(gpus: list[Gpu]) -> Kind | None:
    """(model, memory, count) when a node's GPUs are all alike, else None."""
    if not gpus:
        return ("", 0.0, 0)
    first = gpus[0]
    model, memory = first.model, first.memory_gb
    for g in gpus:
        if g.model != model or g.memory_gb != memory:
            return None
    return (model, memory, len(gpus))


def free_count(node: Node) -> int:
    """How many of the node's GPUs no live shard holds (only GPUs it has: a
    stray may report one it does not)."""
    used = node.used
    if not used:
        return len(node.gpus)
    return sum(1 for g in node.gpus if g.index not in used)


class Group:
    """Ready nodes alike in pool, GPUs and being simulated or not (and
    fabric, in the index for multi-node profiles), by free GPU count: for
    each count, their names in order."""

    __slots__ = ("pool", "fabric", "kind", "simulated", "buckets")

    def __init__(self, pool: str, fabric: str, kind: Kind | None, top: int, simulated: bool = False) -> None:
        self.pool = pool
        self.fabric = fabric
        self.kind = kind
        self.simulated = simulated
        self.buckets: list[list[str]] = [[] for _ in range(top + 1)]


def power_limit(gpus: list[Gpu]) -> float | None:
    """The power limit a node's GPUs all say (None: they differ; 0.0: no GPU)."""
    if not gpus:
        return 0.0
    w = gpus[0].power_w
    return w if all(g.power_w == w for g in gpus) else None


class _Entry:
    """Where one ready node is filed."""

    __slots__ = ("groups", "free", "gpus")

    def __init__(self, groups: tuple[Group, ...], free: int, gpus: list[Gpu]) -> None:
        self.groups = groups
        self.free = free
        # The node's list of GPUs when filed: only a registration makes a new
        # one, so while it is the same list its kind is (kind_of reads every
        # GPU, and a cold start files ~2,000 nodes again per pass).
        self.gpus = gpus


class NodeIndex:
    """The ready nodes of one state by (pool, kind, simulated) and (pool,
    fabric, kind, simulated), and within each by free GPU count."""

    def __init__(self) -> None:
        self.built = False
        self.dirty: set[str] = set()
        self.entries: dict[str, _Entry] = {}
        self.groups: dict[tuple, Group] = {}
        self.fabric_groups: dict[tuple, Group] = {}
        self.top = 0  # the most GPUs any ready node has: the buckets' range
        self.version = 0  # bumped when a group is added: caches over groups are redone
        self.ready_names: list[str] = []  # sorted
        # Placement's caches over the groups (the groups that admit a kind of
        # profile): (version, answer), good while no group is added.
        self.admitted: dict[tuple, tuple[int, list]] = {}
        # The located nodes by cell (facility_spread.Cells), and each
        # domain's by power limit, kept until the fold moves a node's
        # location (`relocated`) or files a node anew. Made per pass, a cold
        # start at 16,000 nodes took 1.25-1.4x the time with racks of 40 (43
        # passes), 1.0-1.1x with 50 racks (benchmarks/placement.py --facility
        # --nodes 16000 [--rack-nodes 40]).
        self.cells = None

    def sync(self, state: State) -> NodeIndex:
        """File again what the fold touched since the last pass (everything, the first time)."""
        if not self.built:
            self.built = True
            self.dirty.clear()
            nodes = state.nodes
            names = sorted(n for n, node in nodes.items() if node.state == "ready" and not node.cordon)
            self.top = max((len(nodes[n].gpus) for n in names), default=0)
            for name in names:  # in name order: each bucket stays sorted by appending
                self._file(name, nodes[name], append=True)
            self.ready_names = names
        elif self.dirty:
            nodes = state.nodes
            for name in sorted(self.dirty):
                self._refile(name, nodes.get(name))
            self.dirty.clear()
        return self

    def moved(self, name: str, free: int) -> None:
        """A pass moved a node to another free count (placement.Inventory):
        filed again from the state at the next sync, which finds it where
        the fold put it (nothing to do) when what the pass decided landed."""
        entry = self.entries.get(name)
        if entry is not None:
            entry.free = free
        self.dirty.add(name)

    def _refile(self, name: str, node: Node | None) -> None:
        old = self.entries.get(name)
        if node is None or node.state != "ready" or node.cordon:  # (cordoned: admission.py)
            if old is not None:
                self.cells = None  # (its nodes' power limits, by domain: see `cells`)
                self._unfile(name, old)
                del self.ready_names[bisect_left(self.ready_names, name)]
            return
        if old is not None:
            grp = old.groups[0]
            fabric = node.labels.get(FABRIC_LABEL, "")
            if (
                grp.pool == node.labels.get(POOL_LABEL, "")
                and grp.simulated == node.simulated
                and (node.gpus is old.gpus or grp.kind == kind_of(node.gpus))
                and (old.groups[1].fabric if len(old.groups) > 1 else "") == fabric
            ):
                if node.gpus is not old.gpus:
                    old.gpus = node.gpus
                    self.cells = None
                free = free_count(node)
                if free != old.free:
                    for g in old.groups:
                        b = g.buckets[old.free]
                        del b[bisect_left(b, name)]
                        insort(g.buckets[free], name)
                    old.free = free
                return
            self._unfile(name, old)
        else:
            insort(self.ready_names, name)
        self.cells = None
        if len(node.gpus) > self.top:
            self.top = len(node.gpus)
            for g in (*self.groups.values(), *self.fabric_groups.values()):
                g.buckets.extend([] for _ in range(self.top + 1 - len(g.buckets)))
        self._file(name, node, append=False)

    def _unfile(self, name: str, old: _Entry) -> None:
        for g in old.groups:
            b = g.buckets[old.free]
            del b[bisect_left(b, name)]
        del self.entries[name]

    def _file(self, name: str, node: Node, append: bool) -> None:
        labels = node.labels
        pool = labels.get(POOL_LABEL, "")
        fabric = labels.get(FABRIC_LABEL, "")
        kind = kind_of(node.gpus)
        sim = node.simulated
        grp = self.groups.get((pool, kind, sim))
        if grp is None:
            grp = self.groups[(pool, kind, sim)] = Group(pool, "", kind, self.top, sim)
            self.version += 1
        groups: tuple[Group, ...] = (grp,)
        if fabric:
            fgrp = self.fabric_groups.get((pool, fabric, kind, sim))
            if fgrp is None:
                fgrp = self.fabric_groups[(pool, fabric, kind, sim)] = Group(pool, fabric, kind, self.top, sim)
                self.version += 1
            groups = (grp, fgrp)
        free = free_count(node)
        for g in groups:
            if append:
                g.buckets[free].append(name)
            else:
                insort(g.buckets[free], name)
        self.entries[name] = _Entry(groups, free, node.gpus)

    def check(self, state: State) -> list[str]:
        """What differs from an index built afresh (the tests call it after every event)."""
        fresh = NodeIndex().sync(state)
        self.sync(state)
        out = []
        if fresh.ready_names != self.ready_names:
            out.append("ready nodes differ")
        for name, e in fresh.entries.items():
            mine = self.entries.get(name)
            if mine is None or mine.free != e.free or _keys(mine.groups) != _keys(e.groups):
                out.append(f"node {name} filed differently")
        for mine_groups, fresh_groups in ((self.groups, fresh.groups), (self.fabric_groups, fresh.fabric_groups)):
            for key in mine_groups.keys() | fresh_groups.keys():
                a, b = mine_groups.get(key), fresh_groups.get(key)
                if _filled(a) != _filled(b):
                    out.append(f"group {key} differs")
        return out


def _keys(groups: tuple[Group, ...]) -> list[tuple]:
    return [(g.pool, g.fabric, g.kind, g.simulated) for g in groups]


def _filled(g: Group | None) -> dict[int, list[str]]:
    return {k: b for k, b in enumerate(g.buckets) if b} if g is not None else {}


# --------------------------------------------------------------------------- one index per folded state

# id(state) -> its index; an entry goes when its state does (a finalizer).
_INDEXES: dict[int, NodeIndex] = {}


def touch(state: State, name: str) -> None:
    """The fold changed what node `name` has free, its labels or whether it is
    ready: the next pass files it again. The first touch registers an index
    for the state (built at the first placement)."""
    idx = _INDEXES.get(id(state))
    if idx is None:
        idx = _INDEXES[id(state)] = NodeIndex()
        weakref.finalize(state, _INDEXES.pop, id(state), None)
    elif idx.built:
        idx.dirty.add(name)


def relocated(state: State) -> None:
    """The fold moved a node's location (facility_facts.relocate): the cells kept are stale."""
    idx = _INDEXES.get(id(state))
    if idx is not None:
        idx.cells = None


def track(state: State) -> NodeIndex:
    """Keep an index for this state from now on (built at its first
    placement): what a control plane does once it has its state, restored
    from a snapshot say, so that its passes do not each build a throwaway
    one until the fold happens to touch a node."""
    touch(state, "")
    return _INDEXES[id(state)]


def index_of(state: State) -> NodeIndex:
    """The state's index, brought up to date; a throwaway one for a state the fold never touched."""
    idx = _INDEXES.get(id(state))
    return (idx if idx is not None else NodeIndex()).sync(state)


def forget_index(state: State) -> None:
    """Drop a state's index: code that changed its nodes other than through the fold calls this."""
    _INDEXES.pop(id(state), None)
