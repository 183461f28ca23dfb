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
idle first, then the smallest (GPUs, then CPU cores, then host memory), then
by id. The smaller first: when it is enough the least capacity is lost, and
pruning keeps a larger one only when it is needed. (CPU cores before memory:
of a 1-core and a 4-core replica the 1-core one goes, and on a CPU-only
fleet, where every victim has 0 GPUs, cores are what tells them apart.) Idle times are unknown (0) when no
gateway has reported a model, after a restart of everything for instance:
then size alone decides, never the order of a map.

Not victims: a replica within MIN_LIFETIME_S of becoming ready (stopping
it throws away a model load only just paid for; `choose(young=True)` says
which would be, so that a model waiting for them says so), a multi-node replica (its
own decision, one being adopted shard by shard included), one already
preempted, restarting or stopping, one placed in place of a replica still
draining (stopping it frees nothing until that one exits).

At most MAX_VICTIMS, taken in order until the model fits, tried on the
pass's inventory with their room released, then pruned to those actually
needed: an idle replica on the wrong node, tried first, is kept. Nothing is
stopped when the set would not make room: stopping replicas that do not
make room is the one outcome worse than not preempting.
"""

from __future__ import annotations

import msgspec

from ..contract import events as ev
from ..contract import reasons
from ..contract.events import Resources
from ..contract.reasons import K, because, cause
from ..folding.replicas import RETIRING, replica_number
from ..scheduling.placement import Inventory
from ..contract.policy import DEFAULT
from .quota import borrowed, governing, need, over_limit, plus, within_guarantee
from .scaling import current_load, desired
from ..folding.state import Model, Replica, State

CLASSES = {"opportunistic": 0, "standard": 1, "critical": 2}
# The defaults of what the rules read from state.policy (policy.py).
MAX_VICTIMS = DEFAULT.max_victims
EVICTION_GRACE_S = DEFAULT.eviction_grace_s  # idle this long, an on-demand replica of a lower class goes first
MIN_LIFETIME_S = DEFAULT.min_lifetime_s
HOLD_S = DEFAULT.hold_s  # how long a model that gave room may not take it back

TIERS = reasons.TIERS  # the tiers, in words: a Victim's `tier` is its why


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
    cpu_cores: int
    memory_gb: float
    young: bool = False  # within MIN_LIFETIME_S of becoming ready: a victim only with `young`
    # Where quotas matter, read once per pass (see VictimIndex.ordered):
    lent: bool = False  # past its owner's guarantee (quota.borrowed)
    guarded: bool = False  # not lent, and its owner has a guarantee up its tree


class VictimIndex:
    """What could be stopped to make room, gathered once per pass: one read of
    the replicas, then each preemptor's ordered list of victims, computed for
    each kind of preemptor (its class, whether it is below its minimum, its
    owner where quotas matter) and reused by the next one of that kind."""

    def __init__(self, state: State, now: float, taken: set[str] | None = None) -> None:
        self.state = state
        self.now = now
        # Replicas stopped earlier in this pass, victims or not: decide passes
        # its own set of every replica the pass stops, so that one stopped by
        # a scale-down is not chosen as a victim too (its Preempt was voided).
        self.taken: set[str] = taken if taken is not None else set()
        # Per model, the ids of its replicas that count (not stopping, not
        # failed): how many of them are not taken is whether it is above its
        # minimum *now*, in this pass (see `choose`).
        self.counted: dict[str, list[str]] = {}
        self._candidates: list[Candidate] | None = None
        self._ordered: dict[tuple, list[tuple[int, Candidate]]] = {}
        # Per ordered list, how many of its first entries are taken already:
        # the next preemptor of that kind starts after them (taken only grows
        # in a pass), rather than stepping over every victim chosen so far.
        self._skip: dict[int, int] = {}
        self._borrowed: set[str] | None = None
        self._quotas = any(_has_guarantee(o) for o in state.owners.values())
        self._by_size: list[Candidate] | None = None

    def candidates(self) -> list[Candidate]:
        if self._candidates is not None:
            return self._candidates
        state, now = self.state, self.now
        by_model: dict[str, list[Replica]] = {}
        for rep in state.replicas.values():
            if rep.state == "stopping" or rep.restart in RETIRING or rep.preempted_for:
                continue
            if rep.state in ("failed",):
                continue
            by_model.setdefault(rep.model, []).append(rep)
        out = []
        policy = state.policy
        for name, reps in by_model.items():
            model = state.models.get(name)
            if model is None:
                continue
            spec = model.spec
            self.counted[name] = [r.id for r in reps]
            # Newest first: the newest are the ones above its minimum. Of
            # replicas placed in one pass, the higher number is the newer, as
            # a scale-down takes them (decide); by id, "m-1" came before "m-2".
            reps.sort(key=lambda r: (-r.placed_at, -replica_number(r.id), r.id))
            above = max(len(reps) - spec.min_replicas, 0)
            idle = now - model.last_used if model.last_used else 0.0
            idle_on_demand = spec.on_demand and current_load(model, now) == 0 and (
                not model.last_used or idle >= policy.eviction_grace_s)
            for i, rep in enumerate(reps):
                young = bool(rep.ready_at) and now - rep.ready_at < policy.min_lifetime_s
                # Multi-node: its own decision. One being rebuilt from what
                # agents report (want_shards) is multi-node before all its
                # shards are back, not a single-node replica.
                if len(rep.shards) > 1 or rep.want_shards > 1:
                    continue
                if rep.replaced and rep.replaced in state.replicas:
                    # Placed in place of a replica still draining: stopped,
                    # what it took over goes back to that one (replicas.hand_back),
                    # so it frees nothing until that one exits.
                    continue
                sh = rep.shards[0] if rep.shards else None  # its one shard (none yet: rebuilt from reports)
                out.append(Candidate(
                    rep=rep, model=name, rank=rank(spec), above_min=i < above, idle=idle,
                    idle_on_demand=idle_on_demand, owner=rep.owner, gpus=len(sh.gpus) if sh else 0,
                    cpu_cores=sh.cpu_cores if sh else 0, memory_gb=sh.memory_gb if sh else 0, young=young,
                ))
        self._candidates = out
        return out

    def _sorted(self) -> list[Candidate]:
        """The candidates in the order they are tried within a tier: the
        longest idle first, then the smallest (GPUs, CPU cores, host
        memory), then by id;
        sorted once, each kind of preemptor then sorts them into tiers alone
        (a stable split keeps this order within each tier)."""
        if self._by_size is None:
            out = sorted(self.candidates(), key=lambda c: (-c.idle, c.gpus, c.cpu_cores, c.memory_gb, c.rep.id))
            if self._quotas:
                lent = self.borrowed()
                guarantees: dict[str, bool] = {}
                for c in out:
                    c.lent = c.rep.id in lent
                    g = guarantees.get(c.owner)
                    if g is None:
                        g = guarantees[c.owner] = bool(governing(self.state, c.owner))
                    c.guarded = not c.lent and g
            self._by_size = out
        return self._by_size

    def borrowed(self) -> set[str]:
        if self._borrowed is None:
            self._borrowed = borrowed(self.state) if self._quotas else set()
        return self._borrowed

    def ordered(
        self, model: Model, have: int | None = None, pending: dict[str, Resources] | None = None,
        young: bool = False,
    ) -> list[tuple[int, Candidate]]:
        """(tier, candidate) for a preemptor, in the order they are tried.
        `have`: how many replicas decide counts the preemptor as having (its
        serving ones); by default, as the tallies say. `pending`: what the
        pass's placements so far add per owner. `young`: replicas within
        their minimum lifetime too."""
        spec = model.spec
        my_rank = rank(spec)
        live = serving(self.state, spec.name) if have is None else have
        below_min = live < spec.min_replicas
        reclaim = False
        if self._quotas:
            # Within its guarantee whichever of its profiles it is placed
            # with. Asked of the first alone, a model whose first profile
            # fitted nowhere took a replica back for its second, larger one,
            # which took its owner past its guarantee: borrowed, so taken by
            # a higher class, then taken back again, the two in turns for ever.
            amount = Resources()
            for p in spec.profiles:
                n = need(p)
                amount = Resources(gpus=max(amount.gpus, n.gpus), cpu_cores=max(amount.cpu_cores, n.cpu_cores),
                                   memory_gb=max(amount.memory_gb, n.memory_gb))
            g = governing(self.state, spec.owner) if pending else ""
            if pending and g in pending:  # placed earlier in this pass: held already, for the guarantee
                amount = plus(amount, pending[g])
            reclaim = within_guarantee(self.state, spec.owner, amount)
        key = (my_rank, below_min, spec.owner if self._quotas else "", reclaim, young)
        out = self._ordered.get(key)
        if out is None:
            out = self._ordered[key] = self._order(my_rank, below_min, spec.owner, reclaim, young)
        return out

    def _order(
        self, my_rank: int, below_min: bool, owner: str, reclaim: bool, young: bool,
    ) -> list[tuple[int, Candidate]]:
        quotas = self._quotas
        critical = CLASSES["critical"]
        tiers: tuple[list, list, list, list, list] = ([], [], [], [], [])
        for c in self._sorted():
            if c.young and not young:
                continue
            r = c.rank
            if r < my_rank:
                # (r < my_rank: never critical, whose minimum is never taken.)
                tier = 0 if c.idle_on_demand else 2 if c.above_min else 4
            elif r == my_rank and c.above_min and below_min:
                tier = 3
            else:
                tier = -1
            if quotas and c.owner != owner:
                if c.lent:
                    # Past its owner's guarantee, wanted by an owner within
                    # its own: taken back whatever the classes.
                    if reclaim and tier != 0 and (r != critical or c.above_min):
                        tier = 1
                elif c.guarded:
                    continue  # within its owner's guarantee
            if tier >= 0:
                tiers[tier].append((tier, c))
        return [tc for t in tiers for tc in t]


def serving(state: State, name: str) -> int:
    """A model's replicas that count as serving, from its tally: neither
    stopping, nor restarting (replaced beside themselves), nor failed. (The
    tally's `live` counts failed replicas too: a failed one is stopped and
    replaced in the same pass, and counting it made a model with one failed
    replica below its minimum look as if it were not, for a pass.)"""
    t = state.tallies.get(name)
    if t is None:
        return 0
    return max(t.live - t.retiring - t.failed, 0)


def _has_guarantee(o) -> bool:
    g = o.guarantee
    return bool(g.gpus or g.cpu_cores or g.memory_gb)


def waiting_for_victims(state: State, model: Model) -> list[str]:
    """Replicas stopped for this model that have not gone yet: it waits for
    them rather than stopping more."""
    return [rid for rid in model.preempting if rid in state.replicas]


def held(state: State, model: Model, now: float) -> ev.Cause | None:
    """Why a model that gave room may not take it back now, or None. The hold
    ends early once the model it gave room to has what it asked for, and
    lasts past its end while the replicas stopped for that model drain."""
    if not model.held_for:
        return None
    to = state.models.get(model.held_for)
    if to is None:
        return None
    # Held past held_until while what was preempted still drains: a drain
    # longer than the hold let the model that gave the room take it back the
    # moment it was free, and be preempted again.
    if now >= model.held_until and not waiting_for_victims(state, to):
        return None
    if serving(state, to.spec.name) >= desired(to, now):
        return None
    # Said without a countdown: a waiting reason is published each time it
    # changes, and one that counted seconds was a new decision every pass
    # for as long as the hold lasted.
    return cause(K.HELD, model=model.held_for, seconds=state.policy.hold_s)


def choose(
    index: VictimIndex, inv: Inventory, model: Model, spread: dict[str, int], *,
    have: int | None = None, pending: dict[str, Resources] | None = None, young: bool = False,
) -> list[tuple[int, Candidate]]:
    """The victims to stop so that one more replica of `model` fits, or []
    when no allowed set of at most MAX_VICTIMS would make room. `have`: the
    preemptor's serving replicas as decide counts them; `pending`: what the
    pass's placements so far add per owner (quota limits); `young`: replicas
    within their minimum lifetime may be chosen too (to say what a model
    waits for, never to stop them)."""
    spec = model.spec
    state = index.state
    # Only the profiles its owner's limits allow: room made for one it may
    # not take is room made for nothing (both victims of a 2-GPU profile
    # past the limit were stopped, and the next pass placed nothing).
    profiles = [
        p for p in spec.profiles
        if not (state.owners and spec.owner and over_limit(state, spec.owner, need(p), pending))
    ]
    if not profiles:
        return []
    chosen: list[tuple[int, Candidate]] = []
    name = spec.name
    ordered = index.ordered(model, have, pending, young)
    taken = index.taken
    skip = index._skip.get(id(ordered), 0)
    while skip < len(ordered) and ordered[skip][1].rep.id in taken:
        skip += 1
    index._skip[id(ordered)] = skip
    for i in range(skip, len(ordered)):
        tier, c = ordered[i]
        if len(chosen) == index.state.policy.max_victims:
            break
        if c.model == name or c.rep.id in taken:
            continue
        if _needs_above_min(tier, c) and not _above_min_now(index, c, chosen):
            # Above its minimum when the index was built, no longer: others
            # of its model were stopped since in this pass (victims of
            # another preemptor, a scale-down). Taken now it would leave its
            # model below its minimum, a critical one included.
            continue
        chosen.append((tier, c))
        if not _fits_without(inv, profiles, spread, [c for _, c in chosen]):
            continue
        # Enough: now keep every one whose stopping turns out not to be needed.
        for i in range(len(chosen) - 1, -1, -1):
            if len(chosen) == 1:
                break
            fewer = chosen[:i] + chosen[i + 1:]
            if _fits_without(inv, profiles, spread, [c for _, c in fewer]):
                chosen = fewer
        return chosen
    return []


def _needs_above_min(tier: int, c: Candidate) -> bool:
    """Whether a victim of this tier may only be taken above its model's
    minimum: tiers 2 and 3, and a critical replica taken back as borrowed."""
    return tier in (2, 3) or (tier == 1 and c.rank == CLASSES["critical"])


def _above_min_now(index: VictimIndex, c: Candidate, chosen: list[tuple[int, Candidate]]) -> bool:
    """Whether the candidate's model keeps its minimum without it: counted
    on its replicas not stopped in this pass nor chosen already."""
    taken = index.taken
    left = sum(1 for rid in index.counted.get(c.model, ()) if rid not in taken)
    left -= sum(1 for _, o in chosen if o.model == c.model)
    return left > index.state.models[c.model].spec.min_replicas


def _fits_without(
    inv: Inventory, profiles: list[ev.ProfileSpec], spread: dict[str, int], gone: list[Candidate],
) -> bool:
    """Whether a replica of one of these profiles would fit with these
    replicas gone, tried on the pass's inventory and given back after."""
    for c in gone:
        inv.release(c.rep.shards)
    try:
        return any(inv.fits(p, spread) for p in profiles)
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
    why = cause(K.PREEMPT, model=name, priority=model.spec.priority, count=have, of=n, victims=len(victims))
    out: list[ev.Action] = [
        ev.Preempt(model=name, victims=victims, **because(why), inventory=inv.describe_nodes(nodes),
                   hold_until=now + index.state.policy.hold_s)
    ]
    for v in victims:
        index.taken.add(v.replica)
        spec = index.state.models[v.model].spec
        out.append(ev.StopReplica(
            replica=v.replica, **because(cause(K.PREEMPTED, model=name, tier=v.tier)), drain_s=spec.drain_grace_s,
        ))
    return out
