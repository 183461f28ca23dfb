"""One pass of `decide`: its inputs and what it has decided so far.

A `Pass` holds the state, the time and the inventory its placements take
from, and the actions decided, with what their message will weigh; a
`ModelPass` holds one model's counts as the pass changes them. This is how
Nomad's reconciler holds its inputs: the rules (decide.py, restarts.py,
preempt.py) take these, not a dozen arguments each. The outcome of a model's
placements is an `Outcome`, which is what a restart is decided on.

A pass is bounded by the size of its message, not by a count of actions:
the limit that matters is the server's payload limit (1 MB by default), and
an action weighs anything from 60 bytes (a stop) to a few kilobytes (a
multi-node placement). Counting bytes lets a cold start place ~2,000
replicas a pass instead of 500, so it takes a few passes, not dozens, each of
which reads the state again. What is left is decided by the next pass.
The budget is `limits.LIMITS.pass_bytes` (contract/limits.py).
"""

from __future__ import annotations

import enum

import msgspec

from ..contract import events as ev
from ..contract import limits
from ..contract.bounds import fit_action
from . import preempt
from ..scheduling.explain import profile_refusals, why_no_fit as explain_no_fit
from ..scheduling.placement import Inventory, replicas_per_node
from .quota import add, need, over_limit
from ..folding.replicas import RETIRING, replica_number
from .scaling import desired
from ..folding.state import Model, Replica, State

_encode = msgspec.json.Encoder().encode


class Outcome(enum.Enum):
    """How a model's placements went in a pass (restart.go's scaleOutcome):
    what `_retire` decides a restart on. A string said "no room" after the
    model had just preempted a victim, and its restart went in place,
    stopping the only serving replica while the room made for it was on its
    way (issue 11)."""

    ENOUGH = "enough"  # it had what it wants: nothing to place
    PLACED = "placed"  # every replica it was short was placed
    NO_ROOM = "no room"  # one fitted nowhere
    OVER_LIMIT = "over limit"  # one would take its owner past a limit
    NOT_TRIED = "not tried"  # parked, held or backing off: nothing was tried
    PREEMPTING = "preempting"  # replicas are being stopped to make room for it


class Pass:
    """One pass of `decide`: its inputs (the state, the time, the inventory
    its placements take from) and the actions decided so far, with what
    their message will weigh."""

    def __init__(self, state: State, now: float, budget: int) -> None:
        self.state = state
        self.now = now
        self.inv = Inventory(state)  # built at its first placement, if any
        self.actions: list[ev.Action] = []
        self.budget = budget
        self.size = limits.LIMITS.pass_envelope_bytes
        self.full = False
        self.numbers: dict[str, int] = {}  # model -> number of its next replica id, after this pass's
        self.usage: dict = {}  # owner -> what this pass's placements add (quota limits)
        self.victims: preempt.VictimIndex | None = None  # built at the first preemption tried
        self.stopped: set[str] = set()  # replicas this pass stops (not victims again; see preempt.choose)
        self.placements = 0  # placements so far: what changes the inventory a waiting reason explains
        self.explained: dict[tuple[bytes, int], str] = {}  # (profiles, placements) -> why_no_fit
        self.refusals: dict[tuple[bytes, int], str] = {}  # (profile, placements) -> its refusals (`_refusals`)

    def add(self, action: ev.Action) -> bool:
        """Keep an action if the message has room for it; once one does not
        fit, the pass is over (later actions must not overtake it)."""
        if self.full:
            return False
        fit_action(action)  # within the contract's bounds, or it would be quarantined
        size = len(_encode(action)) + 1
        if self.size + size > self.budget and self.actions:
            self.full = True
            return False
        self.size += size
        self.actions.append(action)
        if type(action) is ev.PlaceReplica:
            self.numbers[action.model] = replica_number(action.replica) + 1
            self.placements += 1
        elif type(action) is ev.StopReplica:
            self.stopped.add(action.replica)
        return True

    def add_together(self, actions: list[ev.Action]) -> bool:
        """Keep all of these actions or none: a Preempt that landed without
        its victims' stops (the pass full after it) marked them preempted
        and made its model wait for them to stop, for ever."""
        if self.full:
            return False
        size = sum(len(_encode(fit_action(a))) + 1 for a in actions)
        if self.size + size > self.budget and self.actions:
            self.full = True
            return False
        # (Past the budget only as the pass's first actions, as `add` allows one.)
        self.budget = max(self.budget, self.size + size)
        for a in actions:
            self.add(a)
        return True

    def next_number(self, model: str) -> int:
        """The number of the model's next replica id, after those placed earlier in this pass."""
        return self.numbers.get(model) or self.state.replica_numbers.get(model, 1)


class ModelPass:
    """One model in a pass: what it wants and how its replicas stand, as the
    pass changes them."""

    def __init__(self, p: Pass, model: Model, live: list[Replica]) -> None:
        self.model = model
        self.spec = model.spec
        self.name = model.spec.name
        self.n = desired(model, p.now)  # how many replicas it should have
        self.live = live  # its replicas, neither stopping nor to be stopped
        self.retiring = [r for r in live if r.restart in RETIRING]  # restarting: serve until replaced
        self.serving = [r for r in live if r.restart not in RETIRING]
        self.spread = replicas_per_node(live)  # its replicas per node, for placements to spread (Inventory.place counts in it)
        self.have = 0  # replicas it counts as having, set once the restarts have begun
        self.placed = 0  # replicas placed for it in this pass (not in place of another)


def place_one(p: Pass, m: ModelPass, replica: str, reason: str, replaces: str = "") -> ev.PlaceReplica | None:
    """The first profile, in the catalog's order of preference, that fits,
    within the owner's limits."""
    state, spec = p.state, m.spec
    for profile in spec.profiles:
        if state.owners and spec.owner and over_limit(state, spec.owner, need(profile), p.usage):
            continue
        shards = p.inv.place(profile, replica, m.spread)
        if shards is not None:
            if spec.owner:
                add(p.usage, spec.owner, need(profile))
            return ev.PlaceReplica(
                replica=replica,
                model=spec.name,
                profile=profile.name,
                fingerprint=m.model.fingerprints[profile.name],
                shards=shards,
                reason=reason,
                replaces=replaces,
                rejections=p.inv.rejections(),
            )
    return None


def drain_s(spec: ev.ModelSpec, rep: Replica) -> float:
    """A replica that serves is drained before it stops; one that does not, not."""
    return spec.drain_grace_s if rep.state == "ready" else 0.0


def why_no_fit(p: Pass, profiles: list[ev.ProfileSpec]) -> str:
    """why_no_fit, said once per pass for models that ask for the same
    profiles, until a placement changes what is free: on a full fleet, the
    models that wait for room mostly ask alike (1,962 waits, 55 countings,
    in a cold start of benchmarks/placement.py --facility --nodes 16000,
    which takes 4x the time without)."""
    key = (_encode(profiles), p.placements)
    why = p.explained.get(key)
    if why is None:
        why = p.explained[key] = explain_no_fit(p.inv, profiles, lambda inv, q: _refusals(p, q))
    return why


def _refusals(p: Pass, q: ev.ProfileSpec) -> str:
    """explain.profile_refusals, once per profile until a placement: the
    models of one size mostly ask the same fallback profile after their own
    (a cold start at 16,000 nodes counted 108 times, now 45)."""
    key = (_encode(q), p.placements)
    said = p.refusals.get(key)
    if said is None:
        said = p.refusals[key] = profile_refusals(p.inv, q)
    return said
