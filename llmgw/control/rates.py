"""Each node's rate of events, as the control plane receives them, and
which nodes are past it (a decision recorded as NodeMuted: core/folding/muting.py).

Why: nothing bounded what one node's credential may write. One stored
~609,000 events in seconds (issue 35, finding 6): the control plane fell
574,000 events behind, an operator's change waited over two minutes, the
console's memory grew from 44 to 382 MB. The server still stores what a
node sends (its limits are the bus's); past its rate, the control plane
records that it mutes the node, and from then on every reader of the log
skips that node's messages by their subject, undecoded.

Counted per node in a window of whole seconds (a ring of per-second counts,
O(1) an event): a node is past its rate when the window holds more than
rate x window + burst of its events. The burst is what a legitimate node
says at once: a registration, then starting, loading and ready for each of
up to 64 shards, ports and power; the rate is far above what an agent
sends steadily (a status per shard change, power every few seconds). Only
events folded after the control plane caught up are counted: a catch-up
reads hours of a node's events in a moment.
"""

from __future__ import annotations

import math

# A node may send NODE_RATE events a second averaged over NODE_RATE_WINDOW_S,
# plus NODE_BURST at once, before it is muted.
NODE_RATE = 100.0
NODE_RATE_WINDOW_S = 10
NODE_BURST = 2000
# Nodes counted at most; past it the counts start afresh (a fleet has one
# agent subject prefix per node: 16,000 in the largest we design for).
MAX_NODES_COUNTED = 1 << 17


class _Window:
    __slots__ = ("first", "second", "counts", "total")

    def __init__(self, second: int, width: int) -> None:
        self.first = second  # the first second counted since the window was last empty
        self.second = second
        self.counts = [0] * width
        self.total = 0


class NodeRates:
    """Counts events per node; `count` says when a node goes past its rate."""

    def __init__(self, rate: float = NODE_RATE, window_s: int = NODE_RATE_WINDOW_S, burst: int = NODE_BURST) -> None:
        self.rate = rate
        self.window_s = max(1, int(window_s))
        self.burst = burst
        self.allowed = rate * self.window_s + burst
        self._windows: dict[str, _Window] = {}

    def count(self, node: str, now: float) -> bool:
        """One event of `node` at `now` (seconds, any monotonic clock): True
        when the node's window now holds more than it may."""
        second = math.floor(now)
        w = self._windows.get(node)
        if w is None:
            if len(self._windows) >= MAX_NODES_COUNTED:
                self._windows.clear()
            w = self._windows[node] = _Window(second, self.window_s)
        elif second != w.second:
            self._slide(w, second)
        w.counts[second % self.window_s] += 1
        w.total += 1
        return w.total > self.allowed

    def past(self, node: str, now: float) -> bool:
        """Whether the node's window ending at `now` holds more than it may
        (a standby that counted a flood and leads later mutes only a node
        still past its rate)."""
        w = self._windows.get(node)
        if w is None:
            return False
        second = math.floor(now)
        if second > w.second:
            self._slide(w, second)
        return w.total > self.allowed

    def _slide(self, w: _Window, second: int) -> None:
        """Move the window's end to `second`, forgetting the seconds it leaves."""
        width = self.window_s
        if second - w.second >= width:
            w.counts = [0] * width
            w.total = 0
            w.first = second
        else:
            for s in range(w.second + 1, second + 1):
                i = s % width
                w.total -= w.counts[i]
                w.counts[i] = 0
        w.second = second

    def seen(self, node: str) -> tuple[int, float]:
        """(events in the window, events a second averaged over the part of
        it the node has spoken in: 3,000 events in its first second is
        3,000/s, not 300/s over ten)."""
        w = self._windows.get(node)
        if w is None:
            return 0, 0.0
        seconds = min(self.window_s, w.second - w.first + 1)
        return w.total, w.total / seconds

    def forget(self, node: str) -> None:
        self._windows.pop(node, None)
