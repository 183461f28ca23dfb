"""Placement's search by rack and PDU (facility_spread.level), cell by cell.

The order is placement's: the lowest level, then the fewest free GPUs
that are enough, then the name. Asked node by node, a cold start with the
facility took nearly seven times one without (benchmarks/placement.py
--facility): a placement looked at most of its rack's and PDU's nodes.

So nodes are taken by cell (the nodes of one rack and PDU), each cell's
kept in (free GPUs, name) order for the pass. Per model and profile a heap
merges the cells, lowest level first; an entry is a cell's cursor (level,
(free, name), cell, position): its first node not known refused. A node at
the top that fits is the best; one that does not is passed over for the
pass, as refusals only harden (draws and spreads only grow) until the
cell's nodes change (PassFacility.touched) or a stop makes room
(PassFacility.epoch). A level only grows too: a cursor's is put right
when it comes to the top. (Keys and levels packed into ints won 1.08x and
1.02x: benchmarks/instructions.py --nodes 16000; cut, under issue 33's 1.3x.)
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heapify, heappop, heappush, heapreplace
from operator import itemgetter

from ..contract.events import ProfileSpec
from .fabrics import admit_key
from .facility_spread import NO_LEVEL, Levels, level as cell_level
from .fit import _mixed_reasons

class _Heaps:
    """One model's heap of cell cursors for one profile in one pass (see the
    module); `cur[cell]` is the cell's cursor that stands, by identity (any
    other entry of the cell is stale)."""

    __slots__ = ("groups", "epoch", "touched_at", "cur", "heap", "parts")

    def __init__(self, groups: list, epoch: int, touched_at: int, cur: list, heap: list, parts: tuple) -> None:
        self.groups = groups
        self.epoch = epoch  # PassFacility.epoch when made: a stop since made room, and it is made again
        self.touched_at = touched_at  # how many of PassFacility.touched it has seen
        self.cur = cur
        self.heap = heap
        # (heap, cur, refused cells, refused nodes, admitted groups, the model's counts per rack and PDU, each cell's)
        self.parts = parts


class _InCells:
    """The `taken` of placement's `_best` for the nodes in no cell: every node in one."""

    __slots__ = ("of",)

    def __init__(self, of: dict[str, int]) -> None:
        self.of = of

    def __contains__(self, v) -> bool:
        return v.name in self.of


class CellSearch:
    """placement.Inventory's search by cell (see the module), and the
    fabrics its multi-node search may pass over (`_fabric_refused`)."""

    def _search_init(self) -> None:
        self._orders: list[list[tuple[int, str]]] | None = None
        self._cell_of: dict[str, int] = {}  # node -> its cell, once the orders are made
        self._fab_epoch = 0
        # (shape, fabric) -> True where too few nodes have the GPUs free and
        # are not refused: any model of that shape (`_fabric_shape`,
        # `_fabric_refused`); shape -> the fabric to begin at (`_fabric_from`)
        self._too_few: dict[tuple, bool | int] = {}

    def _located_moved(self, name: str, before: int, after: int) -> None:
        """A node's free GPU count changed (Inventory._move): moved in its
        cell's order, and its cell touched (its cursors start again)."""
        orders = self._orders
        if orders is not None:
            c = self._cell_of.get(name)
            if c is not None:
                self._fac.touched.append(c)
                order, key = orders[c], (before, name)
                i = bisect_left(order, key)
                if i < len(order) and order[i] == key:
                    del order[i]
                    insort(order, (after, name))

    def _spread_pick(self, p: ProfileSpec, groups: list, levels: Levels, spread: dict[str, int]):
        """The node for one shard of a single-node profile: level by level,
        the best node that fits of the cells at it; at level 0, the best node
        in no cell if better; then the model's own nodes at that level,
        fewest of its replicas first."""
        fac = self._fac
        h = levels.heaps.get(p.name)
        if h is None or h.groups is not groups or h.epoch != fac.epoch:  # (epoch: a stop made room)
            h = levels.heaps[p.name] = self._start(p, levels, groups)
        heap, cur, dead, blocked, admitted, rc, pc, rack_of, pdu_of = h.parts
        views, orders = self._views, self._orders
        touched = fac.touched
        if h.touched_at < len(touched):
            # The cells changed since the model's last search start again, past
            # the nodes refused and the model's own; a cursor standing at the
            # top (mostly the model's own last placement's cell) is replaced there.
            since, h.touched_at = h.touched_at, len(touched)
            first = (p.gpus, "")
            for c in set(touched[since:]) if since < len(touched) - 1 else (touched[since],):
                order = orders[c]  # type: ignore[index]
                i, n = bisect_left(order, first), len(order)
                while i < n and ((name := order[i][1]) in blocked or name in spread):
                    i += 1
                old = cur[c]
                if i < n:
                    e = cur[c] = (cell_level(rc[rack_of[c]], pc[pdu_of[c]]), order[i], c, i)
                    if old is not None and heap[0] is old:
                        heapreplace(heap, e)
                    else:
                        heappush(heap, e)
                else:
                    cur[c] = None
        mine: list[tuple[int, int]] | None = None  # the levels of the model's own nodes, once asked (Levels.low says when)
        loose = levels.loose  # nodes in no cell: at level 0 unless the model runs there
        j = 0  # the levels of `mine` before it are done
        while True:
            while heap:  # the cursor that stands, at its cell's level, of a cell not known refused whole
                e = heap[0]
                c = e[2]
                if cur[c] is not e:
                    heappop(heap)  # stale: the cell's nodes changed since
                    continue
                level = cell_level(rc[rack_of[c]], pc[pdu_of[c]])
                if e[0] != level:  # its level grew since (see _Heaps)
                    e = cur[c] = (level, e[1], c, e[3])
                    heapreplace(heap, e)
                elif c in dead:  # every node of it refused (PassFacility._noted)
                    cur[c] = None
                    heappop(heap)
                else:
                    break
            level = heap[0][0] if heap else NO_LEVEL
            # The levels below it have no cell with a node that may fit: what
            # is left of them is the nodes in no cell (level 0) and the model's own.
            if loose and level != (0, 0):
                loose = False
                v = self._best(p, groups, spread, 1, _InCells(fac.cells().of))
                if v is not None:
                    return v
            if level > levels.low:
                if mine is None:
                    mine = levels.mine()
                while j < len(mine) and mine[j] < level:
                    v = self._mine_at(p, admitted, levels, spread, mine[j])
                    if v is not None:
                        return v
                    j += 1
            if not heap:
                return None
            order, at = orders[c], e[3]  # type: ignore[index]
            for i in range(at, len(order)):
                key = order[i]
                name = key[1]
                if name in blocked or name in spread:
                    continue  # refused for the pass, or the model runs there (its own come later)
                if i != at:  # the cursor moved on: another cell may do better now
                    e = cur[c] = (level, key, c, i)
                    heapreplace(heap, e)
                    break
                v = views.get(name) or self.view(name)
                if self._fits(p, admitted, v):
                    if loose:  # level 0: the best node in no cell may do better
                        other = self._best(p, groups, spread, 1, _InCells(fac.cells().of))
                        if other is not None and (len(other.free), other.name) < (len(v.free), v.name):
                            return other
                    return v  # (it stays the cell's cursor: the next search looks at it again)
            else:
                cur[c] = None  # none of the cell's nodes fits
                heappop(heap)

    def _mine_at(self, p: ProfileSpec, admitted: set, levels: Levels, spread: dict[str, int], level: tuple[int, int]):
        """The model's own nodes at a level that fit, fewest of its replicas first, then best fit."""
        by_count: dict[int, set[str]] = {}
        for name in levels.spread_at(level, spread):
            by_count.setdefault(spread[name], set()).add(name)
        for n in sorted(by_count):
            v = self._first_fit(p, admitted, by_count[n])
            if v is not None:
                return v
        return None

    def _start(self, p: ProfileSpec, levels: Levels, groups: list) -> _Heaps:
        """The model's heap of cursors: each cell's first node with the GPUs free, at the cell's level."""
        rc, pc, rack_of, pdu_of = levels.rc, levels.pc, levels.rack_of, levels.pdu_of
        fac = self._fac
        dead = fac.dead(p)
        first = (p.gpus, "")
        cur: list[tuple | None] = []
        for c, order in enumerate(self._cell_orders()):
            if c in dead:  # (every node of it refused: the search would pop it at once)
                cur.append(None)
                continue
            i = bisect_left(order, first)
            at = cell_level(rc[rack_of[c]], pc[pdu_of[c]])
            cur.append((at, order[i], c, i) if i < len(order) else None)
        heap = [e for e in cur if e is not None]
        heapify(heap)
        parts = (heap, cur, dead, fac.blocked(p), set(groups), levels.rc, levels.pc, levels.rack_of, levels.pdu_of)
        return _Heaps(groups, fac.epoch, len(fac.touched), cur, heap, parts)

    def _cell_orders(self) -> list[list[tuple[int, str]]]:
        """Each cell's ready nodes in (free GPUs, name) order, made at the
        pass's first search and kept as it takes (`_located_moved`)."""
        if self._orders is None:
            idx, cells = self._build(), self._fac.cells()
            self._cell_of = cells.of
            self._orders = orders = [[] for _ in cells.nodes]
            for name in idx.ready_names:  # in name order, which the stable sort by free count keeps
                if (c := cells.of.get(name)) is not None:
                    orders[c].append((idx.entries[name].free, name))
            for order in orders:
                order.sort(key=itemgetter(0))
        return self._orders

    def _fits(self, p: ProfileSpec, admitted: set, v) -> bool:
        """Whether one shard of the profile fits the node, of the admitted groups."""
        if not v.ready or len(v.free) < p.gpus:
            return False
        for grp in v.groups:
            if grp in admitted:
                break
        else:
            return False
        node = v.node
        if grp.kind is None and _mixed_reasons(p, node.gpus, v.free):
            return False
        if self._fac.active and self._fac.refuses(node, p, self._gpus_for(v, p)):
            return False
        return self._room_ok(v, p)

    def _first_fit(self, p: ProfileSpec, admitted: set, names):
        """The fitting node among these with the fewest free GPUs that are
        enough, ties in name order; asked in that order, so that the refusals
        a placement notes (PlaceReplica.rejections) never follow a set's,
        which differs from one process to the next (replay --verify)."""
        fac, views, nodes = self._fac, self._views, self._state.nodes
        blocked = fac.blocked(p) if fac.active else ()
        need = p.gpus
        found = []
        for name in names:
            if name in blocked or name not in nodes:
                continue
            v = views.get(name) or self.view(name)
            if v.ready and len(v.free) >= need:
                found.append((len(v.free), name, v))
        found.sort()
        for _k, name, v in found:
            if name not in blocked and self._fits(p, admitted, v):  # (blocked: a domain refused since)
                return v
        return None

    # ------------------------------------------------------------------ multi-node: fabrics

    def _fabric_from(self, p: ProfileSpec, by_fabric: list) -> int:
        """The first fabric not known too full for the profile's shape (none
        is kept while a draw is handed over: PassFacility.credit). Where caps
        bind, a multi-node placement passed over some ninety fabrics so. Without
        the fabrics known too full, a cold start at 16,000 nodes took 1.6-1.7x
        the time, 1.3-1.5x with racks of 40 (benchmarks/placement.py --facility
        --nodes 16000 [--rack-nodes 40])."""
        fac, too_few = self._fac, self._too_few
        if self._fab_epoch != fac.epoch:  # a stop made room: what was refused may fit now
            self._fab_epoch = fac.epoch
            too_few.clear()
        if fac.credit:
            return 0
        shape = self._fabric_shape(p)
        k = too_few.get(shape, 0)
        while k < len(by_fabric) and (*shape, by_fabric[k][0].fabric) in too_few:
            k += 1
        too_few[shape] = k
        return k

    def _fabric_shape(self, p: ProfileSpec) -> tuple:
        """What a fabric found too full holds for: a profile the same groups
        admit, of the same draw and nodes, while the index gains no group."""
        return (self._index.version, admit_key(p), p.power_w, p.nodes)

    def _fabric_refused(self, p: ProfileSpec, groups: list, mine: bool, spread: dict[str, int]) -> bool:
        """Whether `_fabric_pick` may pass over this fabric unlooked at: too
        few of its nodes have the GPUs free and are not refused (nor run the
        model, if `mine`), counted by set operations and kept for the shape.
        On a full fleet most fabrics are so, and looking at their nodes was
        most of a multi-node placement (benchmarks/placement.py --facility)."""
        shape = (*self._fabric_shape(p), groups[0].fabric)
        credit = self._fac.credit
        if not credit and shape in self._too_few:
            return True
        blocked = self._fac.blocked(p)
        own = spread.keys() if mine and spread else None
        n, need = 0, p.nodes
        for grp in groups:
            for bucket in grp.buckets[p.gpus :]:
                if bucket:  # (each bucket adds its nodes neither refused nor the model's: never fewer)
                    n += len(bucket) - len(blocked.intersection(bucket))
                    if own is not None:
                        n -= len((own & bucket).difference(blocked))
                    if n >= need:
                        return False
        if own is None and not credit:
            self._too_few[shape] = True
        return True
