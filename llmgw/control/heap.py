"""The control plane's state and Python's cycle collector.

The folded state of a large fleet is a million or more small objects that
live as long as the process, and none of them is ever in a reference cycle.
Left to the collector, every full collection goes over all of them, and the
collector runs one each time the tracked objects grow by a quarter: a cold
start on 16,000 nodes, whose passes add 80,000 replicas to the state, paid
for about seven of them (a fifth of its time, benchmarks/placement.py).

So the objects alive after a pass are moved out of the collector's way
(`settle`: `gc.freeze`, which is a constant-time splice of its lists), and
only what the next pass makes is collected as usual. What is frozen is
still freed by reference counting when the fold lets go of it; only cyclic
garbage frozen by mistake (an asyncio future caught in flight) would stay,
so every `reclaim_every` seconds (control/config.py) the frozen objects
are collected once (`reclaim`), on the loop, like a snapshot.
"""

from __future__ import annotations

import gc

def settle() -> None:
    """What is alive now is the state's: out of the collector's way."""
    gc.freeze()


def reclaim() -> None:
    """Collect the frozen objects once, for cyclic garbage caught among them."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
