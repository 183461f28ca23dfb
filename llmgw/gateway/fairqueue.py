"""Who goes first when a model's replicas are saturated: one queue per model,
by class (critical first), within a class by owners' fair shares. Pure: time
is `now`, items are whatever the caller queues.

Within a class: start-time fair queuing (Goyal, Vin and Cheng, 1996), a
virtual-time discipline. Each owner's requests are tagged as they come:
start = max(the class's virtual time, the owner's last finish), finish =
start + 1/weight; the request with the least finish tag goes next, and the
class's virtual time becomes its start. An owner that sends within its
share finds its tags near the virtual time and goes before a neighbour who
sent a burst (whose tags run far ahead), whatever the order of arrival: no
owner is starved, and backlogged owners are served in proportion to their
weights (their guarantees: `weight_of`). Deficit round robin would do as
well; virtual time needs no quantum and serves one request at a time.

Bounded in size: when full, a newcomer pushes out the last queued of the
owner with the most queued, where that owner has more than the newcomer's
(longest queue drop: a burst that fills the queue must not lock out the
neighbours its fair share leaves room for); else the newcomer is refused.
And bounded in wait (`expired` hands back those queued past it). A request that
leaves (its client gone) is `remove`d; the heap drops it lazily.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

# A model's class (ModelSpec.priority): lower goes first.
CLASS_RANK = {"critical": 0, "standard": 1, "opportunistic": 2}


def weight_of(owner: str, owners: dict) -> float:
    """An owner's share: 1 plus its guaranteed GPUs (its nearest owner's up the
    tree that has a guarantee), so that owners with no guarantee are equal."""
    path = owner
    while path:
        o = owners.get(path)
        g = getattr(o, "guarantee", None) if o is not None else None
        if g is not None and (g.gpus or g.cpu_cores):
            return 1.0 + g.gpus + g.cpu_cores / 16.0
        path = path.rpartition("/")[0]
    return 1.0


@dataclass(order=True, slots=True)
class Entry:
    finish: float
    seq: int
    start: float = field(compare=False)
    owner: str = field(compare=False)
    rank: int = field(compare=False)
    since: float = field(compare=False)
    item: object = field(compare=False)
    gone: bool = field(default=False, compare=False)


class _Class:
    __slots__ = ("heap", "vtime", "last_finish", "waiting")

    def __init__(self) -> None:
        self.heap: list[Entry] = []
        self.vtime = 0.0
        self.last_finish: dict[str, float] = {}  # by owner: the finish tag of its last request queued
        self.waiting: dict[str, int] = {}  # by owner: its requests queued


class FairQueue:
    def __init__(self, max_size: int, max_wait: float) -> None:
        self.max_size = max_size
        self.max_wait = max_wait
        self.classes: dict[int, _Class] = {}
        self.size = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self.size

    def push(self, item, owner: str, weight: float, now: float, rank: int = 1) -> tuple[Entry | None, Entry | None]:
        """Queue `item`: (its entry, or None when the queue is full and it is
        refused; the entry it pushed out to make room, if any: refuse that one)."""
        out = None
        if self.size >= self.max_size:
            out = self._longest(owner)
            if out is None:
                return None, None
            self.remove(out)
            # Its last request pushed out: the owner's next is tagged as if it had never come,
            # not behind it (else each push-out would cost the owner a turn it never had).
            c = self.classes[out.rank]
            if c.last_finish.get(out.owner) == out.finish:
                c.last_finish[out.owner] = out.start
        c = self.classes.get(rank)
        if c is None:
            c = self.classes[rank] = _Class()
        start = max(c.vtime, c.last_finish.get(owner, 0.0))
        e = Entry(start + 1.0 / max(weight, 1e-6), next(self._seq), start, owner, rank, now, item)
        c.last_finish[owner] = e.finish
        c.waiting[owner] = c.waiting.get(owner, 0) + 1
        heapq.heappush(c.heap, e)
        self.size += 1
        return e, out

    def _longest(self, owner: str) -> Entry | None:
        """The last queued of the owner with the most queued, if it has more than `owner` (+1: the newcomer)."""
        counts: dict[str, int] = {}
        for c in self.classes.values():
            for o, n in c.waiting.items():
                counts[o] = counts.get(o, 0) + n
        if not counts:
            return None
        heaviest = max(counts, key=counts.__getitem__)
        if counts[heaviest] <= counts.get(owner, 0) + 1:
            return None
        last = None
        for rank in sorted(self.classes, reverse=True):  # from the lowest class
            for e in self.classes[rank].heap:
                if not e.gone and e.owner == heaviest and (last is None or e.finish > last.finish):
                    last = e
            if last is not None:
                return last
        return None

    def pop(self) -> Entry | None:
        """The next to go: the first class with any, its least finish tag."""
        for rank in sorted(self.classes):
            c = self.classes[rank]
            while c.heap:
                e = heapq.heappop(c.heap)
                if e.gone:
                    continue
                c.vtime = max(c.vtime, e.start)
                self._left(c, e)
                return e
        return None

    def remove(self, e: Entry) -> None:
        """`e` leaves before its turn (its client gone, its wait over)."""
        if not e.gone:
            e.gone = True
            self._left(self.classes[e.rank], e)

    def expired(self, now: float) -> list[Entry]:
        """Those queued longer than max_wait, removed."""
        out = []
        for c in self.classes.values():
            for e in c.heap:
                if not e.gone and now - e.since > self.max_wait:
                    out.append(e)
        for e in out:
            self.remove(e)
        return out

    def oldest(self) -> float | None:
        """When the longest waiting was queued (None: none is)."""
        since = [e.since for c in self.classes.values() for e in c.heap if not e.gone]
        return min(since) if since else None

    def _left(self, c: _Class, e: Entry) -> None:
        self.size -= 1
        n = c.waiting[e.owner] - 1
        if n:
            c.waiting[e.owner] = n
        else:  # an owner with nothing queued starts afresh from the virtual time
            del c.waiting[e.owner]
            c.last_finish.pop(e.owner, None)
        if not c.waiting:
            c.heap.clear()
