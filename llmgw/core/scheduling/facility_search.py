"""Placement's search over a model's spread by rack and PDU (facility_spread.Levels), cell by cell.

The rule is placement's (placement.py says it): the fitting node of the
lowest level (its rack's count of the model's replicas, then its PDU's,
then its own), then the fewest free GPUs that are enough, then the name.
Asked node by node, or by rounds over the buckets of free GPUs that each
admit every lower level again, it cost a cold start with the facility
nearly seven times one without (benchmarks/placement.py --facility): a
placement looked at most of its rack's and PDU's nodes, and at every node
of the levels below.

Here the nodes are taken by cell (facility_spread.Cells: the nodes in the
same domains), each cell's nodes kept in order of free GPUs then name for
the pass (`_cell_orders`). Per model and kind of profile, one heap merges
its cells' orders, lowest level first: an entry is a cell's *cursor*, the
first of its nodes not yet known refused, and a lower bound on the cell's
best. The top is looked at: a node that fits, no worse than the next
entry, is the best (every other cell's best is at least its entry); one
that does not is passed over for good, as a refusal in a pass only
hardens (a domain's draw grows, a model's spread grows) until a cell's
nodes change (PassFacility.touched: its cursor starts again) or a stop
makes room (PassFacility.epoch: all start again). A cell's level only
grows as the model places, so a cursor's is put right when it comes to
the top (`_Heaps`). A placement so looks at a node or two, and at the
cells that it or another changed since.

A node in an order is its (free GPUs, name); a cursor, (level, that pair,
cell, position in the cell's order). (Packed into ints, with the names as
ranks, they won 1.04x at 16,000 nodes with the facility: less than the 1.3x
that would keep a trick, issue 33.) A cursor's cell and position never
decide its order: a node is in one cell.

A mixin of placement.Inventory, apart so that each module stays one concern.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heapify, heappop, heappush, heapreplace

from ..contract.events import ProfileSpec
from .fabrics import admit_key
from .facility_spread import NO_LEVEL, Levels, level as cell_level
from .fit import _mixed_reasons

class _Heaps:
    """One model's cells for one kind of profile, in one pass: one heap of
    cursors (level, node's key, cell and position in the cell's order:
    see the module), lowest level first, `cur[cell]` being the
    cell's cursor that stands, by identity (any other entry of the cell is
    stale: its nodes changed since; two equal ones stand for the same).

    A cursor's level is its cell's when it was pushed, and a cell's level
    only grows in a pass (a spread only grows): so it is a lower
    bound, put right when the cursor comes to the top (pushed again at its
    level), not at each placement that moves its rack's or PDU's cells,
    most of which never come to the top again in the pass."""

    __slots__ = ("groups", "epoch", "touched_at", "cur", "heap", "parts")

    def __init__(self, groups: list, epoch: int, touched_at: int, cur: list, heap: list, parts: tuple) -> None:
        self.groups = groups
        self.epoch = epoch  # PassFacility.epoch when made: a stop since made room, and it is made again
        self.touched_at = touched_at
        self.cur = cur
        self.heap = heap
        # What each search reads, in one: (heap, cur, the pass's refused
        # nodes and cells for the profile's draw, the admitted groups, and
        # the model's counts per rack and PDU with the cells' racks and PDUs).
        self.parts = parts


class _InCells:
    """The `taken` of placement's `_best` for the nodes in no cell: every node in one."""

    __slots__ = ("of",)

    def __init__(self, of: dict[str, int]) -> None:
        self.of = of

    def __contains__(self, v) -> bool:
        return v.name in self.of


class CellSearch:
    """placement.Inventory's search over facility_spread.Levels (see the module),
    and the facility's shortcuts of its multi-node search (`_fabric_refused`)."""

    def _search_init(self) -> None:
        # Per model and kind of profile its cells by level; each cell's
        # nodes by free GPUs; the epoch of PassFacility they were made in.
        self._orders: list[list[tuple[int, str]]] | None = None
        self._cell_of: dict[str, int] = {}  # node -> its cell, once the orders are made
        self._fab_epoch = 0
        # (shape, fabric) -> True where too few nodes have the GPUs free and
        # are not refused: any model of that shape (`_fabric_shape`,
        # `_fabric_refused`); shape -> the fabric to begin at (`_fabric_from`)
        self._too_few: dict[tuple, bool | int] = {}
        self._picked: Levels | None = None  # the levels the last single-node search went by (placement's `place`)

    def _located_moved(self, name: str, before: int, after: int) -> None:
        """A node's free GPU count changed in this pass (placement.Inventory._move):
        moved in its cell's order (`_cell_orders`), if made, and its cell
        touched (PassFacility.touched: the cursors in it start again)."""
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
        """The node for one shard of a single-node profile, by the rounds of
        spread over `levels`: lowest level first, then best fit. Level by
        level, as the heap's cursors come: the best of the cells at a
        level that fits; else, at level 0, the best node in no cell; else
        the model's own nodes at that level, fewest of its replicas first."""
        fac = self._fac
        h = levels.heaps.get(p.name)
        if h is None or h.groups is not groups or h.epoch != fac.epoch:  # (epoch: a stop made room)
            h = levels.heaps[p.name] = self._start(p, levels, groups)
        heap, cur, dead, blocked, admitted, rc, pc, rack_of, pdu_of = h.parts
        views, orders = self._views, self._orders
        touched = fac.touched
        if h.touched_at < len(touched):
            # The cells a placement changed since the model's last search:
            # their cursors start again, past the nodes known refused and the
            # model's own (as below). A cell's cursor that stands at the top
            # (the cell a placement of the model itself took from, mostly)
            # is replaced there, not left behind stale.
            # (Each pushed once; the heap orders them. One, mostly: the
            # model's own last placement's, taken without a list.)
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
        mine: list[int] | None = None  # the levels of the model's own nodes, once asked (Levels.low says when)
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
            if loose and level:
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

    def _mine_at(self, p: ProfileSpec, admitted: set, levels: Levels, spread: dict[str, int], level: int):
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
        """Each cell's ready nodes by free GPUs, then name, as the node index files them (an entry's free count is its
        view's: Inventory._move keeps both), made at the pass's first search
        by cell and kept as its placements take (`_located_moved`)."""
        if self._orders is None:
            entries = self._build().entries
            cells = self._fac.cells()
            self._cell_of = cells.of
            self._orders = [sorted([(entries[name].free, name) for name in nodes if name in entries]) for nodes in cells.nodes]
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
        """The fitting node among these (the model's own at one level) with the fewest free GPUs that are enough, ties in name
        order; looked at in that order, so that the refusals a placement
        notes (PlaceReplica.rejections) never follow a set's order, which
        differs from one process to the next (replay --verify)."""
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
        """The first fabric not known too full for any model of
        the profile's shape (`_fabric_refused`): where the last search of the
        shape stopped, then on. Refusals only harden in a pass until room is
        made (PassFacility.epoch, `_located_moved`); a draw handed over may
        unblock a node, so none is kept while one is (PassFacility.credit).
        (A multi-node placement on a fleet whose caps bind passed over some
        ninety fabrics so: benchmarks/placement.py --facility --nodes 16000.)"""
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
        """What a fabric found too full holds for: any profile the same
        groups admit (admit_key, its GPUs among it), of the same draw and
        number of nodes, while the node index gains no group (its version)."""
        return (self._index.version, admit_key(p), p.power_w, p.nodes)

    def _fabric_refused(self, p: ProfileSpec, groups: list, mine: bool, spread: dict[str, int]) -> bool:
        """Whether fabrics' `_fabric_pick` may pass over this fabric in a
        round without looking at its nodes: too few of them have the GPUs
        free and are not refused by the facility (nor run the model, if
        `mine`), counted in C, and kept for the shape (`_fabric_from`). On
        a full fleet most fabrics are so, and looking at their nodes was
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
