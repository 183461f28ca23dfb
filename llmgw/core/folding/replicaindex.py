"""Each model's replicas, kept by the fold beside the state (as nodeindex.py
keeps the ready nodes), so that a pass reads the replicas of the models it
looks at, not every replica of the fleet.

A pass used to read all of `state.replicas` to find those of the models
that need a look: 15 ms at 80,000 replicas, most of the pass after one
failure on 16,000 nodes and a share of every pass of a cold start
(benchmarks/placement.py --nodes 16000). Now the fold tells the index of
each replica that enters or leaves `state.replicas` (`added`, `removed`),
and `replicas_of` gives a pass the replicas of some models in the state's
own order (the order decide stops them in, which replay compares).

Registered at the first pass on a state (built by one read of its
replicas); a state no pass asked about pays nothing. An index that does not
count as many replicas as the state holds (a handler that forgot to say) is
built again rather than trusted; the property test in tests/test_properties.py
compares it with a fresh one after every step.
"""

from __future__ import annotations

import weakref

from .state import Replica, State


class _ByModel:
    """model -> its replica ids, each with its place in the state's order."""

    __slots__ = ("models", "next", "count")

    def __init__(self, state: State) -> None:
        self.models: dict[str, dict[str, int]] = {}
        self.next = 0
        self.count = 0
        for rid, rep in state.replicas.items():
            self.add(rep.model, rid)

    def add(self, model: str, rid: str) -> None:
        ids = self.models.get(model)
        if ids is None:
            ids = self.models[model] = {}
        if rid not in ids:
            self.count += 1
        ids[rid] = self.next  # (ids are never used twice in a log: a new one comes last)
        self.next += 1

    def remove(self, model: str, rid: str) -> None:
        ids = self.models.get(model)
        if ids is not None and ids.pop(rid, None) is not None:
            self.count -= 1
            if not ids:
                del self.models[model]


# id(state) -> its index; an entry goes when its state does (a finalizer).
_INDEXES: dict[int, _ByModel] = {}


def added(state: State, rep: Replica) -> None:
    """The fold put a new replica into state.replicas."""
    idx = _INDEXES.get(id(state))
    if idx is not None:
        idx.add(rep.model, rep.id)


def removed(state: State, rep: Replica) -> None:
    """The fold took a replica out of state.replicas."""
    state.unstarted.pop(rep.id, None)  # no start deadline for what is gone (admission.py)
    idx = _INDEXES.get(id(state))
    if idx is not None:
        idx.remove(rep.model, rep.id)


def _index(state: State) -> _ByModel:
    idx = _INDEXES.get(id(state))
    if idx is None:
        idx = _INDEXES[id(state)] = _ByModel(state)
        weakref.finalize(state, _INDEXES.pop, id(state), None)
    elif idx.count != len(state.replicas):
        idx = _INDEXES[id(state)] = _ByModel(state)
    return idx


def track(state: State) -> None:
    """Keep the index for this state from now on: what a control plane does
    once caught up (with nodeindex.track), so that its first pass after an
    event does not pay for a read of every replica."""
    _index(state)


def replicas_of(state: State, models: set[str]) -> list[Replica]:
    """The replicas of these models, in the order of state.replicas."""
    idx = _index(state)
    found: list[tuple[int, str]] = []
    by_model = idx.models
    for model in models:
        ids = by_model.get(model)
        if ids:
            found.extend((at, rid) for rid, at in ids.items())
    found.sort()
    replicas = state.replicas
    try:
        return [replicas[rid] for _, rid in found]
    except KeyError:  # not told of a replica gone: read them all, as before the index
        _INDEXES[id(state)] = _ByModel(state)
        return [r for r in replicas.values() if r.model in models]


def check(state: State) -> list[str]:
    """What differs from the state (the tests call it after every event)."""
    mine = _INDEXES.get(id(state))
    if mine is None:
        return []
    kept = [rid for _, rid in sorted((at, rid) for ids in mine.models.values() for rid, at in ids.items())]
    out = []
    if kept != list(state.replicas):
        out.append(f"the replicas kept ({len(kept)}) are not the state's ({len(state.replicas)}), in its order")
    if any(state.replicas[rid].model != model for model, ids in mine.models.items() for rid in ids if rid in state.replicas):
        out.append("a replica kept under another model")
    if mine.count != len(kept):
        out.append(f"{mine.count} replicas counted, {len(kept)} kept")
    return out
