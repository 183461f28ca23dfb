"""Preemption (preempt.go): which replicas give way when a model does not fit.

What may be taken from whom:
- A lower class gives way to a higher: opportunistic to standard, standard
  to critical.
- Within a class, only a replica above its model's minimum, and only for a
  model still below its own. Room a model grew into under load is not a
  promise; its minimum is.
- A critical model's minimum is never taken.
- A replica within its owner's guarantee is taken only for a model of the
  same owner: a guarantee another tenant's higher class could take is none.
Victims only ever come from a lower class, or from above a minimum for a
model below one, so two models cannot take turns stopping each other.

Victims come in tiers, tried in order (`TIERS`); within a tier the longest
idle first, then the smallest (GPUs, then memory), then by id. The smaller
first: when it is enough the least capacity is lost, and pruning keeps a
larger one only when it is needed. Idle times are unknown (0) when no
gateway has reported a model, after a restart of everything for instance:
then size alone decides, never the order of a map.

Not victims: a replica within MIN_LIFETIME_S of becoming ready (stopping
it throws away a model load only just paid for), a multi-node replica (its
own decision), one already preempted, restarting or stopping.

At most MAX_VICTIMS, taken in order until the model fits, tried on the
pass's inventory with their room released, then pruned to those actually
needed: an idle replica on the wrong node, tried first, is kept. Nothing is
stopped when the set would not make room: stopping replicas that do not
make room is the one outcome worse than not preempting.
"""

from __future__ import annotations

import msgspec

from . import events as ev
from .placement import Inventory
from .quota import borrowed, governing, need, within_guarantee
from .scaling import current_load, desired
from .state import Model, Replica, State

CLASSES = {"opportunistic": 0, "standard": 1, "critical": 2}
MAX_VICTIMS = 3
EVICTION_GRACE_S = 300.0  # idle this long, an on-demand replica of a lower class goes first
MIN_LIFETIME_S = 120.0
HOLD_S = 120.0  # how long a model that gave room may not take it back

TIERS = {
    0: "idle on-demand replica of a lower class",
    1: "borrowed past its owner's guarantee, taken back by an owner within its own",
    2: "a lower class, above its minimum",
    3: "the same class, above its minimum, for a model below its own",
    4: "a lower class's minimum",
}


def rank(spec: ev.ModelSpec) -> int:
    return CLASSES.get(spec.priority, 1)


class Candidate(msgspec.Struct, kw_only=True):
    rep: Replica
    model: str
    rank: int
    above_min: bool
    idle: float  # 0: unknown
    idle_on_demand: bool  # on demand and idle past the eviction grace
    owner: str
    gpus: int
    memory_gb: float


class VictimIndex:
    """What could be stopped to make room, gathered once per pass: one read of
    the replicas, then each preemptor's ordered list of victims, computed for
    each kind of preemptor (its class, whether it is below its minimum, its
    owner where quotas matter) and reused by the next one of that kind."""

    def __init__(self, state: State, now: float) -> None:
        self.state = state
        self.now = now
        self.taken: set[str] = set()  # victims chosen earlier in this pass
        self._candidates: list[Candidate] | None = None
        self._ordered: dict[tuple, list[tuple[int, Candidate]]] = {}
        self._borrowed: set[str] | None = None
        self._quotas = any(_has_guarantee(o) for o in state.owners.values())

    def candidates(self) -> list[Candidate]:
        if self._candidates is not None:
            return self._candidates
        state, now = self.state, self.now
        by_model: dict[str, list[Replica]] = {}
        for rep in state.replicas.values():
            if rep.state == "stopping" or rep.restart in ("replacing", "in place") or rep.preempted_for:
                continue
            if rep.state in ("failed",):
                continue
            by_model.setdefault(rep.model, []).append(rep)
        out = []
        for name, reps in by_model.items():
            model = state.models.get(name)
            if model is None:
                continue
            spec = model.spec
            # Newest first: the newest are the ones above its minimum.
            reps.sort(key=lambda r: (-r.placed_at, r.id), reverse=False)
            above = max(len(reps) - spec.min_replicas, 0)
            idle = now - model.last_used if model.last_used else 0.0
            idle_on_demand = spec.on_demand and current_load(model, now) == 0 and (
                not model.last_used or idle >= EVICTION_GRACE_S)
            for i, rep in enumerate(reps):
                if rep.ready_at and now - rep.ready_at < MIN_LIFETIME_S:
                    continue
                if len(rep.shards) > 1:
                    continue
                gpus = sum(len(s.gpus) for s in rep.shards)
                memory = sum(s.memory_gb for s in rep.shards)
                out.append(Candidate(
                    rep=rep, model=name, rank=rank(spec), above_min=i < above, idle=idle,
                    idle_on_demand=idle_on_demand, owner=rep.owner, gpus=gpus, memory_gb=memory,
                ))
        self._candidates = out
        return out

    def borrowed(self) -> set[str]:
        if self._borrowed is None:
            self._borrowed = borrowed(self.state) if self._quotas else set()
        return self._borrowed

    def ordered(self, model: Model) -> list[tuple[int, Candidate]]:
        """(tier, candidate) for a preemptor, in the order they are tried."""
        spec = model.spec
        my_rank = rank(spec)
        t = self.state.tallies.get(spec.name)
        live = (t.live - t.retiring) if t is not None else 0
        below_min = live < spec.min_replicas
        reclaim = False
        if self._quotas:
            p = spec.profiles[0]
            reclaim = within_guarantee(self.state, spec.owner, need(p))
        key = (my_rank, below_min, spec.owner if self._quotas else "", reclaim)
        out = self._ordered.get(key)
        if out is None:
            out = self._ordered[key] = self._order(my_rank, below_min, spec.owner, reclaim)
        return out

    def _order(self, my_rank: int, below_min: bool, owner: str, reclaim: bool) -> list[tuple[int, Candidate]]:
        lent = self.borrowed() if self._quotas else set()
        out = []
        for c in self.candidates():
            tier = -1
            if c.rank < my_rank and c.idle_on_demand:
                tier = 0
            elif c.rank < my_rank and c.above_min:
                tier = 2
            elif c.rank == my_rank and c.above_min and below_min:
                tier = 3
            elif c.rank < my_rank and c.rank != CLASSES["critical"]:
                tier = 4
            if self._quotas and c.owner != owner:
                if c.rep.id in lent and reclaim and (c.rank != CLASSES["critical"] or c.above_min):
                    if tier != 0:
                        tier = 1
                elif c.rep.id not in lent and governing(self.state, c.owner):
                    continue  # within its owner's guarantee
            if tier < 0:
                continue
            out.append((tier, c))
        out.sort(key=lambda tc: (tc[0], -tc[1].idle, tc[1].gpus, tc[1].memory_gb, tc[1].rep.id))
        return out


def _has_guarantee(o) -> bool:
    g = o.guarantee
    return bool(g.gpus or g.cpu_cores or g.memory_gb)


def waiting_for_victims(state: State, model: Model) -> list[str]:
    """Replicas stopped for this model that have not gone yet: it waits for
    them rather than stopping more."""
    return [rid for rid in model.preempting if rid in state.replicas]


def held(state: State, model: Model, now: float) -> str:
    """Why a model that gave room may not take it back now, or "". The hold
    ends early once the model it gave room to has what it asked for."""
    if not model.held_for or now >= model.held_until:
        return ""
    to = state.models.get(model.held_for)
    if to is None:
        return ""
    t = state.tallies.get(to.spec.name)
    live = (t.live - t.retiring) if t is not None else 0
    if live >= desired(to, now):
        return ""
    return f"held: it gave room to {model.held_for}, which is still short, until {model.held_until - now:.0f}s from now"


def choose(index: VictimIndex, inv: Inventory, model: Model, spread: dict[str, int]) -> list[tuple[int, Candidate]]:
    """The victims to stop so that one more replica of `model` fits, or []
    when no allowed set of at most MAX_VICTIMS would make room."""
    chosen: list[tuple[int, Candidate]] = []
    name = model.spec.name
    for tier, c in index.ordered(model):
        if len(chosen) == MAX_VICTIMS:
            break
        if c.model == name or c.rep.id in index.taken:
            continue
        chosen.append((tier, c))
        if not _fits_without(inv, model, spread, [c for _, c in chosen]):
            continue
        # Enough: now keep every one whose stopping turns out not to be needed.
        for i in range(len(chosen) - 1, -1, -1):
            if len(chosen) == 1:
                break
            fewer = chosen[:i] + chosen[i + 1:]
            if _fits_without(inv, model, spread, [c for _, c in fewer]):
                chosen = fewer
        return chosen
    return []


def _fits_without(inv: Inventory, model: Model, spread: dict[str, int], gone: list[Candidate]) -> bool:
    """Whether a replica of the model would fit with these replicas gone,
    tried on the pass's inventory and given back after."""
    for c in gone:
        inv.release(c.rep.shards)
    try:
        return any(inv.fits(p, spread) for p in model.spec.profiles)
    finally:
        for c in gone:
            inv.hold(c.rep.shards)


def decision(
    index: VictimIndex, inv: Inventory, model: Model, chosen: list[tuple[int, Candidate]], now: float, have: int, n: int,
) -> list[ev.Action]:
    """The Preempt action and the victims' stops, with their reasons."""
    name = model.spec.name
    victims = [
        ev.Victim(
            replica=c.rep.id, model=c.model, priority=index.state.models[c.model].spec.priority, tier=tier,
            why=TIERS[tier], idle_s=round(c.idle, 3), gpus=c.gpus,
        )
        for tier, c in chosen
    ]
    nodes = [s.node for _, c in chosen for s in c.rep.shards]
    reason = (
        f"{name} ({model.spec.priority}) has {have} of {n} replicas and fits nowhere; "
        f"stopping {len(victims)} replica(s) makes room"
    )
    out: list[ev.Action] = [
        ev.Preempt(model=name, victims=victims, reason=reason, inventory=inv.describe_nodes(nodes),
                   hold_until=now + HOLD_S)
    ]
    for v in victims:
        index.taken.add(v.replica)
        spec = index.state.models[v.model].spec
        out.append(ev.StopReplica(
            replica=v.replica, reason=f"preempted for {name} (tier {v.tier}: {v.why})", drain_s=spec.drain_grace_s,
        ))
    return out
