"""A model's spread read by rack and PDU, for placement's search (facility_search.py).

`Cells` groups the located nodes of a state by the domains they share (a
cell: the nodes of one rack and one PDU, mostly), and `Levels` keeps, for
one model in one pass, how many of its replicas each rack and each PDU
runs: a cell's *level*. Placement takes the fitting node of the lowest
level, then best fit, as placement.py says; facility_search.py searches
the cells by level. Kept up to date as the pass places (`Levels.took`),
because made again per placement they read the whole fleet each time, and
re-levelling a rack's nodes one by one was a third of a cold start
(benchmarks/placement.py --facility).

Apart from facility_pass.py (one pass's holds, caps and draws) so that
each stays one concern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facility_pass import PassFacility

# A cell's level: its rack's count and its PDU's as one number, each in its
# own digits (a rack or PDU never runs this many of one model's replicas).
LEVEL_BASE = 1 << 16
NO_LEVEL = 1 << 62  # past every level


def level(rack: int, pdu: int) -> int:
    """The spread order's first key, a node's *level*: how many of the
    model's replicas its rack runs, then its PDU (a missing label: the
    node's own count), as one number. Placement takes the fitting node of
    the lowest level, then the fewest free GPUs that are enough, then the
    name (facility_search.py; tests/test_facility_search.py states it plainly)."""
    return rack * LEVEL_BASE + pdu


class Cells:
    """The located nodes of one pass by *cell*: the nodes in the same set of
    domains (rack, PDU and any other). The nodes of a cell share their
    rack's and PDU's counts of a model's replicas, so a placement changes
    the level of its rack's and PDU's few cells, where re-levelling each of
    their nodes in Python was a third of a cold start with the facility
    (benchmarks/placement.py --facility). A node that says no rack or no
    PDU is a cell of its own (nothing says it shares them), and the rack
    (or PDU) it does not say is one of its own too, numbered apart, whose
    count is the node's; one that says neither is in no cell (`Levels`
    counts it by itself).

    Racks and PDUs are numbered (`rack_of`, `pdu_of`: cell -> number), so
    that a model's counts are two lists and a cell's level two reads."""

    __slots__ = ("located", "of", "nodes", "rack_of", "pdu_of", "racks", "pdus", "in_domain", "limited")

    def __init__(self, located: dict[str, tuple[str, ...]]) -> None:
        self.located = located  # (the state's: kept while it is the same and no node moved)
        self.limited: dict[str, dict] = {}  # domain -> its nodes by power limit (PassFacility._by_limit)
        self.of: dict[str, int] = {}  # node -> its cell
        self.nodes: list[set[str]] = []  # cell -> its nodes
        self.rack_of: list[int] = []
        self.pdu_of: list[int] = []
        self.in_domain: dict[str, list[int]] = {}  # domain -> the cells of its nodes
        racks: dict[str, int] = {}
        pdus: dict[str, int] = {}
        own = 0  # racks and PDUs of a node of its own, numbered after the named ones
        keys: dict = {}
        cells: list[tuple[str | None, str | None]] = []
        # (A cell's number decides nothing: placement orders by free GPUs and
        # name, and a name is in one cell; so the fold's order will do.)
        for name, ds in located.items():
            rack = pdu = None
            for d in ds:
                if d.startswith("rack/"):
                    rack = d[5:]
                elif d.startswith("pdu/"):
                    pdu = d[4:]
            if rack is None and pdu is None:
                continue
            key = ds if rack is not None and pdu is not None else name
            c = keys.get(key)
            if c is None:
                c = keys[key] = len(self.nodes)
                self.nodes.append(set())
                cells.append((rack, pdu))
                if rack is not None:
                    racks.setdefault(rack, len(racks))
                if pdu is not None:
                    pdus.setdefault(pdu, len(pdus))
            self.nodes[c].add(name)
            self.of[name] = c
            for d in ds:
                cells_in = self.in_domain.setdefault(d, [])
                if not cells_in or cells_in[-1] != c:
                    if c not in cells_in:
                        cells_in.append(c)
        for rack, pdu in cells:
            if rack is None:
                self.rack_of.append(len(racks) + own)
                own += 1
            else:
                self.rack_of.append(racks[rack])
            if pdu is None:
                self.pdu_of.append(len(pdus) + own)
                own += 1
            else:
                self.pdu_of.append(pdus[pdu])
        self.racks = len(racks) + own  # how many numbers a count per rack needs
        self.pdus = len(pdus) + own


class Spread(dict):
    """A model's replicas per node in a pass (node -> count), as
    placement.replicas_per_node makes it, with the `Levels` a facility pass
    read of it: `levels` is (that PassFacility, its Levels), set at its first
    search (PassFacility.levels). The spread holds them, not they the spread,
    so nothing of a pass outlives it in a cycle the collector must find
    (control/heap.py freezes what is alive after each pass)."""

    __slots__ = ("levels",)


class Levels:
    """A model's spread read as racks, then PDUs, then nodes: a node's
    *level* is how many of the model's replicas its rack has, then its
    PDU, then itself, and placement (facility_search) takes the
    fitting node of the lowest level, then best fit, as its rounds of
    spread would (`fabrics._limits`). A node without a rack (or PDU)
    label is a rack (or PDU) of its own: nothing says it shares one.

    Counted by rack and PDU (`Cells`) from the spread when made, then told
    of each placement of the pass before placement counts it in the spread
    (`took`: Inventory.place is the spread's only writer in a pass, so the
    two cannot part): a placement counts one more for its rack and its PDU,
    which moves their cells' levels, not their nodes one by one. A copy
    of the spread compared at each placement to catch a writer that did
    not say cost a hundredth of a cold start with the facility
    (benchmarks/instructions.py --what cold). Where the model's own nodes
    are (`mine`, `spread_at`) is asked only when the search has found no
    other node below them, which is rare: so it is worked out then, from
    the cells that have some (`_csp`), and a lower bound of their levels
    (`low`) tells the search when it need not ask (a level only grows)."""

    def __init__(self, spread: dict[str, int], fac: "PassFacility") -> None:
        cells = self._cells = fac.cells()
        self.loose = len(cells.of) < len(fac.state.nodes)  # nodes in no cell, at level 0 unless the model runs there
        # The model's replicas per rack and per PDU, by number (Cells): a
        # cell's level is `rc[rack_of[c]] * LEVEL_BASE + pc[pdu_of[c]]`, its
        # rack's count then its PDU's, read where it is needed (inline: a
        # method call per cell was a hundredth of a cold start) rather than
        # kept for every cell that a placement moves, most of which nobody
        # reads again in the pass.
        self.rc = [0] * cells.racks
        self.pc = [0] * cells.pdus
        self.rack_of, self.pdu_of = cells.rack_of, cells.pdu_of
        self._loose: dict[int, int] = {}  # level -> the model's nodes in no cell at it
        self._csp: dict[int, set[str]] = {}  # cell -> the model's nodes in it
        self.low = NO_LEVEL  # no level of the model's own nodes is below it (`mine`)
        # facility_search's heaps of cursors for the model, by profile (a
        # model's profiles have names of their own: catalog.py)
        self.heaps: dict[str, object] = {}
        for name, n in sorted(spread.items()):
            self.took(name, 0, n)

    def took(self, name: str, old: int, more: int) -> None:
        """The node ran `old` of the model's replicas and runs `more` more:
        its rack's and its PDU's counts too. Told by a placement before it
        counts the node in the spread (Inventory.place), and at the start."""
        c = self._cells.of.get(name)
        if c is None:  # in no cell: a rack and PDU of its own
            self._loose_moved(old, old + more)
            return
        r, p = self.rack_of[c], self.pdu_of[c]
        rc, pc = self.rc, self.pc
        if not old:  # the cell's own nodes of the model (`spread_at`)
            self._csp.setdefault(c, set()).add(name)
            if level(rc[r], pc[p]) < self.low:  # (its level only grows from here)
                self.low = level(rc[r], pc[p])
        rc[r] += more
        pc[p] += more

    def _loose_moved(self, old: int, now: int) -> None:
        """A node in no cell runs `now` of the model's replicas, not `old`: its level moved."""
        loose = self._loose
        if old:
            left = loose[level(old, old)] - 1
            if left:
                loose[level(old, old)] = left
            else:
                del loose[level(old, old)]
        if now:
            loose[level(now, now)] = loose.get(level(now, now), 0) + 1
            self.low = min(self.low, level(now, now))

    def mine(self) -> list[int]:
        """The levels some of the model's nodes are at (in a cell, or in none), lowest first; `low` is the first."""
        rc, pc, rack_of, pdu_of = self.rc, self.pc, self.rack_of, self.pdu_of  # (each cell's level, inline)
        out = sorted({level(rc[rack_of[c]], pc[pdu_of[c]]) for c in self._csp} | self._loose.keys())
        self.low = out[0] if out else NO_LEVEL
        return out

    def spread_at(self, at: int, spread: dict[str, int]) -> set[str]:
        """The model's nodes at a level (in a cell at it, or in none and at it by themselves)."""
        out: set[str] = set()
        rc, pc, rack_of, pdu_of = self.rc, self.pc, self.rack_of, self.pdu_of  # (each cell's level, inline)
        for c, names in self._csp.items():
            if level(rc[rack_of[c]], pc[pdu_of[c]]) == at:
                out |= names
        if at in self._loose:
            of = self._cells.of
            out.update(name for name, n in spread.items() if name not in of and level(n, n) == at)
        return out
