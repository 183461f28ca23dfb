"""A model's spread by rack and PDU: the first key of placement's order.

`Cells` groups the located nodes by the domains they share; `Levels`
counts one model's replicas per rack and PDU in a pass, each cell's
`level`, kept as the pass places: re-levelled node by node, a rack's
nodes were a third of a cold start (benchmarks/placement.py --facility).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facility_pass import PassFacility

NO_LEVEL = (float("inf"), float("inf"))  # past every level


def level(rack: int, pdu: int) -> tuple[int, int]:
    """The spread rule's first key, a node's *level*: how many of the model's
    replicas its rack runs, then its PDU (a label not said: the node's own
    count); then the fewest free GPUs that are enough, then the name
    (tests/test_facility_search.py states the rule plainly)."""
    return (rack, pdu)


class Cells:
    """The located nodes by *cell*, the nodes in the same set of domains. A
    node that says a rack but no PDU (or the reverse) is a cell of its own,
    its missing PDU one of its own; one that says neither is in no cell.
    Racks and PDUs are numbered (`rack_of`, `pdu_of`: cell -> number)."""

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
        # (A cell's number decides nothing: a name is in one cell.)
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
    """A model's replicas per node in a pass (placement.replicas_per_node),
    holding the (PassFacility, Levels) read of it at its first search: the
    spread holds them, not they the spread, so that nothing of a pass
    outlives it in a cycle (control/heap.py freezes what lives after a pass)."""

    __slots__ = ("levels",)


class Levels:
    """A model's replicas per rack and per PDU in one pass: each cell's level.

    Counted from the spread when made, then told of each placement before
    the spread counts it (`took`, from Inventory.place, the spread's only
    writer in a pass). Where the model's own nodes are (`mine`,
    `spread_at`) is asked only when the search found nothing below them,
    which is rare: worked out then from the cells that have some (`_csp`),
    with `low`, a lower bound of their levels, saying when to ask."""

    def __init__(self, spread: dict[str, int], fac: "PassFacility") -> None:
        cells = self._cells = fac.cells()
        self.loose = len(cells.of) < len(fac.state.nodes)  # nodes in no cell, at level 0 unless the model runs there
        # The model's replicas per rack and per PDU, by number (Cells): a
        # cell's level is level(rc[rack_of[c]], pc[pdu_of[c]]), read where
        # needed rather than kept for every cell a placement moves.
        self.rc = [0] * cells.racks
        self.pc = [0] * cells.pdus
        self.rack_of, self.pdu_of = cells.rack_of, cells.pdu_of
        self._loose: dict[tuple[int, int], int] = {}  # level -> the model's nodes in no cell at it
        self._csp: dict[int, set[str]] = {}  # cell -> the model's nodes in it
        self.low = NO_LEVEL  # no level of the model's own nodes is below it (`mine`)
        # facility_search's heaps of cursors for the model, by profile name
        self.heaps: dict[str, object] = {}
        for name, n in sorted(spread.items()):
            self.took(name, 0, n)

    def took(self, name: str, old: int, more: int) -> None:
        """The node ran `old` of the model's replicas and runs `more` more: so do its rack and PDU."""
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

    def mine(self) -> list[tuple[int, int]]:
        """The levels some of the model's nodes are at (in a cell, or in none), lowest first; `low` is the first."""
        rc, pc, rack_of, pdu_of = self.rc, self.pc, self.rack_of, self.pdu_of  # (each cell's level, inline)
        out = sorted({level(rc[rack_of[c]], pc[pdu_of[c]]) for c in self._csp} | self._loose.keys())
        self.low = out[0] if out else NO_LEVEL
        return out

    def spread_at(self, at: tuple[int, int], spread: dict[str, int]) -> set[str]:
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
