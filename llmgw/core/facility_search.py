"""Placement's search over a model's spread by rack and PDU (facility_pass.Levels), cell by cell.

The rule is placement's (placement.py says it): the fitting node of the
lowest level (its rack's count of the model's replicas, then its PDU's,
then its own), then the fewest free GPUs that are enough, then the name.
Asked node by node, or by rounds over the buckets of free GPUs that each
admit every lower level again, it cost a cold start with the facility
nearly seven times one without (benchmarks/placement.py --facility): a
placement looked at most of its rack's and PDU's nodes, and at every node
of the levels below.

Here the nodes are taken by cell (facility_pass.Cells: the nodes in the
same domains). Each cell's best node for a kind of profile is kept for the
pass, with the cell's version (PassFacility.cell_version: what its nodes
have free changed), and shared by every model; per model and kind of
profile, a heap per level orders its cells by their best node, so that a
placement reads the top of its lowest level's heap, and updates only the
cells it or another placement changed since (PassFacility.touched) and the
cells whose level moved (Levels.moved). What a cell's kept best cannot
know is checked when it comes to the top: a cap its rack or PDU reached
through another cell, or the model having come to run on it; either makes
it worse, never better, so a heap whose top stands is right.

A mixin of placement.Inventory, apart so that each module stays one concern.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heapify, heappop, heappush
from itertools import islice

from .events import ProfileSpec
from .facility_pass import Levels
from .fit import _mixed_reasons


class _Heaps:
    """One model's cells by level, for one kind of profile, in one pass:
    level -> heap of (free GPUs, name, cell, the model's own), the entry
    `cur[cell]` being the cell's one that stands (others are stale)."""

    __slots__ = ("levels", "version", "cur", "heaps", "moved_at", "touched_at")

    def __init__(self, levels: Levels, touched_at: int) -> None:
        self.levels = levels
        self.version = levels.version
        self.cur: dict[int, tuple | None] = {}
        self.heaps: dict[int, list[tuple]] = {}
        self.moved_at = len(levels.moved)
        self.touched_at = touched_at


class CellSearch:
    """placement.Inventory's search over facility_pass.Levels (see the module)."""

    def _spread_pick(self, p: ProfileSpec, groups: list, levels: Levels):
        """The node for one shard of a single-node profile, by the rounds of
        spread over `levels`: lowest level first, then best fit."""
        fac, spread = self._fac, levels.spread
        if self._cell_epoch != fac.epoch:  # a stop made room: what was refused may fit now
            self._cell_epoch = fac.epoch
            self._cells_best.clear()
            self._heaps.clear()
        fkey = (p.pool, p.gpu_model, p.gpu_memory_gb, p.gpus, p.memory_gb, p.cpu_cores, p.power_w)
        admitted = set(groups)
        shared = self._cells_best.setdefault(fkey, {})
        key = (id(spread), fkey)
        h = self._heaps.get(key)
        if h is None or h.levels is not levels or h.version != levels.version:
            h = self._heaps[key] = self._start(p, fkey, admitted, levels, shared)
        else:
            self._sync(p, admitted, h, shared)
        level_of = levels.level_of
        for level in levels.order():
            v = self._top(p, admitted, h, level, level_of, shared)
            if not level and levels.loose:  # the nodes in no cell, not running the model
                other = self._best(p, groups, spread, 1, (), over=fac.cells().all)
                if other is not None and (v is None or (len(other.free), other.name) < (len(v.free), v.name)):
                    v = other
            if v is not None:
                return v
            # The model's own nodes at this level, fewest of its replicas first.
            mine = levels.spread_at(level)
            if mine:
                by_count: dict[int, set[str]] = {}
                for name in mine:
                    by_count.setdefault(spread[name], set()).add(name)
                for n in sorted(by_count):
                    v = self._first_fit(p, admitted, by_count[n])
                    if v is not None:
                        return v
        return None

    def _cell_best(self, p: ProfileSpec, admitted: set, c: int, shared: dict):
        """A cell's best node for this kind of profile, whoever runs on it: kept while the cell's version stands."""
        ver = self._fac.cell_version[c]
        got = shared.get(c)
        if got is None or got[0] != ver:
            got = shared[c] = (ver, self._cell_fit(p, admitted, c, None))
        return got[1]

    def _entry(self, p: ProfileSpec, admitted: set, c: int, shared: dict) -> tuple | None:
        v = self._cell_best(p, admitted, c, shared)
        return (len(v.free), v.name, c, False) if v is not None else None

    def _start(self, p: ProfileSpec, fkey: tuple, admitted: set, levels: Levels, shared: dict) -> _Heaps:
        fac = self._fac
        h = _Heaps(levels, len(fac.touched))
        cur, heaps, level_of = h.cur, h.heaps, levels.level_of
        for c in range(len(level_of)):
            e = cur[c] = self._entry(p, admitted, c, shared)
            if e is not None:
                heaps.setdefault(level_of[c], []).append(e)
        for heap in heaps.values():
            heapify(heap)
        return h

    def _sync(self, p: ProfileSpec, admitted: set, h: _Heaps, shared: dict) -> None:
        """The cells whose level moved, and those a placement changed, since the model's last search."""
        levels, fac = h.levels, self._fac
        cur, heaps, level_of = h.cur, h.heaps, levels.level_of
        moved = levels.moved
        if h.moved_at < len(moved):
            for c in moved[h.moved_at :]:
                e = cur.get(c)
                if e is not None:
                    heappush(heaps.setdefault(level_of[c], []), e)
            h.moved_at = len(moved)
        touched = fac.touched
        if h.touched_at < len(touched):
            for c in sorted(set(touched[h.touched_at :])):
                e = cur[c] = self._entry(p, admitted, c, shared)
                if e is not None:
                    heappush(heaps.setdefault(level_of[c], []), e)
            h.touched_at = len(touched)

    def _top(self, p: ProfileSpec, admitted: set, h: _Heaps, level: int, level_of: list[int], shared: dict):
        """The best node of the cells at one level that fits still, or None."""
        heap = h.heaps.get(level)
        cur, spread = h.cur, h.levels.spread
        while heap:
            e = heap[0]
            _k, name, c, own = e
            if cur.get(c) is not e or level_of[c] != level:
                heappop(heap)  # stale: the cell changed, or is at another level now
                continue
            v = self._views[name]
            if not own and name in spread:
                # The cell's best, but the model runs there: its best of the others.
                v = self._cell_fit(p, admitted, c, spread)
                e = (len(v.free), v.name, c, True) if v is not None else None
            elif not self._fits_still(v, p):
                # Refused since it was kept: a cap its rack or PDU reached through another cell.
                v = self._cell_fit(p, admitted, c, spread if own else None)
                if not own:
                    shared[c] = (self._fac.cell_version[c], v)
                e = (len(v.free), v.name, c, own) if v is not None else None
            else:
                return v
            cur[c] = e
            heappop(heap)
            if e is not None:
                heappush(heap, e)
        return None

    def _fits_still(self, v, p: ProfileSpec) -> bool:
        """Whether a node kept as its cell's best fits still."""
        fac = self._fac
        if fac.active and (v.name in fac.blocked(p) or fac.refuses(v.node, p, self._gpus_for(v, p))):
            return False
        return not self._short(v, p)

    def _cell_orders(self) -> list[list[tuple[int, str]]]:
        """Each cell's ready nodes as (free GPUs, name), in that order: made
        once a pass, kept as placements take (`_cell_moved`), so that a
        cell's best is its first that fits, not a sort of its nodes."""
        orders = self._orders
        if orders is None:
            entries, views = self._build().entries, self._views
            orders = self._orders = []
            for nodes in self._fac.cells().nodes:
                order = []
                for name in nodes:
                    e = entries.get(name)
                    if e is not None:
                        v = views.get(name)
                        order.append((len(v.free) if v is not None else e.free, name))
                order.sort()
                orders.append(order)
        return orders

    def _cell_moved(self, name: str, before: int, after: int) -> None:
        """A node's free GPU count changed in this pass (placement.Inventory._move)."""
        c = self._fac.cells().of.get(name) if self._orders is not None else None
        if c is not None:
            order = self._orders[c]
            i = bisect_left(order, (before, name))
            if i < len(order) and order[i] == (before, name):
                del order[i]
                insort(order, (after, name))

    def _cell_fit(self, p: ProfileSpec, admitted: set, c: int, spread: dict[str, int] | None):
        """The first node of a cell, in order of free GPUs then name, that
        fits; not one running the model, where `spread` is given."""
        fac, views = self._fac, self._views
        blocked = fac.blocked(p) if fac.active else ()
        order = self._cell_orders()[c]
        for _k, name in islice(order, bisect_left(order, (p.gpus, "")), None):
            if name in blocked or (spread is not None and name in spread):
                continue
            v = views.get(name) or self.view(name)
            if self._fits(p, admitted, v):
                return v
        return None

    def _fits(self, p: ProfileSpec, admitted: set, v) -> bool:
        """Whether one shard of the profile fits the node, of the admitted groups."""
        if not v.ready or len(v.free) < p.gpus:
            return False
        grp = next((g for g in v.groups if g in admitted), None)
        if grp is None:
            return False
        if grp.kind is None and _mixed_reasons(p, v.node.gpus, v.free):
            return False
        fac = self._fac
        if fac.active and fac.refuses(v.node, p, self._gpus_for(v, p)):
            return False
        return not self._short(v, p)

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
