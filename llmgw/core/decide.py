"""decide(state, now): what the control plane should do next, as plain data.

Pure given `now`: the same state and time give the same actions, which is what
lets `llmgw replay --verify` re-run every recorded pass and compare.

A pass returns everything it decided as one list; the shell publishes it as
one `Decided` message, so what must happen together (a failed replica stopped
and its replacement placed) cannot be split by a crash.

A pass is bounded by the size of that message, not by a count of actions:
the limit that matters is the server's payload limit (1 MB by default), and
an action weighs anything from 60 bytes (a stop) to a few kilobytes (a
multi-node placement). Counting bytes lets a cold start place ~2,000
replicas a pass instead of 500, so it takes a few passes, not dozens, each of
which reads the state again. What is left is decided by the next pass.

Per model, a pass follows the seeds' reconciler (restart.go): scale to the
desired count (scaling.py: load, on demand, min and max); drain and stop
what is above it; replace what failed; place what is missing unless the
model backs off or is parked after replicas that failed to start; then
finish and begin restarts (`_retire`, `_begin_restarts`). How the model's
placements went is an `Outcome`, which is what `_retire` reads. A restart is
a replacement placed beside the replica, which is drained once the
replacement serves; or, when asked or when the replica is the only thing in
its replacement's way, a stop and the replacement's placement in the same
pass, on what the stop frees, so that no other model takes it meanwhile.

The pass's inputs (state, time, inventory) and what it has decided so far
are held by a `Pass`, one model's counts by a `ModelPass`, as Nomad's
reconciler holds its inputs: the helpers take those, not a dozen arguments.

A pass reads only what may need doing: the fold keeps a tally per model
(`state.tallies`) of its replicas, failed ones and unwanted ones, so a model
with as many healthy replicas as it wants is passed over without reading
them, and a fleet with nothing to do costs one look at each model and node.
"""

from __future__ import annotations

import enum

import msgspec

from . import events as ev
from .replicas import RETIRING, replica_number
from . import preempt
from .placement import Inventory, replicas_per_node, why_no_fit
from .quota import add, need, over_limit, replica_amount
from .scaling import PARK_AFTER, backoff_until, decided, desired, why_desired
from .state import Model, Replica, Shard, State
from .times import utc

# Half the server's default payload limit: room for the message's own fields
# and headers, and for a server configured tighter than the default.
MAX_PASS_BYTES = 512 * 1024
# What a Decided message weighs besides its actions (type, times, basis, leader).
_ENVELOPE_BYTES = 256

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
        self.size = _ENVELOPE_BYTES
        self.full = False
        self.numbers: dict[str, int] = {}  # model -> number of its next replica id, after this pass's
        self.usage: dict = {}  # owner -> what this pass's placements add (quota limits)
        self.victims: preempt.VictimIndex | None = None  # built at the first preemption tried
        self.stopped: set[str] = set()  # replicas this pass stops (not victims again; see preempt.choose)
        self.placements = 0  # placements so far: what changes the inventory a waiting reason explains
        self.explained: dict[tuple[bytes, int], str] = {}  # (profiles, placements) -> why_no_fit

    def add(self, action: ev.Action) -> bool:
        """Keep an action if the message has room for it; once one does not
        fit, the pass is over (later actions must not overtake it)."""
        if self.full:
            return False
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
        size = sum(len(_encode(a)) + 1 for a in actions)
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
        self.spread = replicas_per_node(live)  # its replicas per node, for placements to spread
        self.have = 0  # replicas it counts as having, set once the restarts have begun
        self.placed = 0  # replicas placed for it in this pass (not in place of another)

    def took(self, placed: ev.PlaceReplica) -> None:
        for s in placed.shards:
            self.spread[s.node] = self.spread.get(s.node, 0) + 1


def decide(state: State, now: float, budget: int = MAX_PASS_BYTES) -> list[ev.Action]:
    p = Pass(state, now, budget)

    # Strays first: they hold GPUs that placements are waiting for.
    with_strays = sorted(n for n, node in state.nodes.items() if node.strays and node.state == "ready")
    for name in with_strays:
        for shard, stray in state.nodes[name].strays.items():
            if not stray.stopping:
                p.add(ev.StopStray(node=name, shard=shard, generation=stray.generation, reason=stray.reason))

    look = _models_to_look_at(state, now)
    if not look:
        return p.actions

    # One read of the replicas, for the models that need a look only.
    by_model: dict[str, list[Replica]] = {}
    for rep in state.replicas.values():
        if rep.model not in look or rep.state == "stopping":
            continue
        why = _why_stop(state, rep, now)
        if why:
            p.add(ev.StopReplica(replica=rep.id, reason=why))
        else:
            by_model.setdefault(rep.model, []).append(rep)

    # Models whose victims have all gone first: the room was freed for them.
    # Decided in name order only, one found it taken by a model before it
    # (the victims' own, its hold over) and preempted again, and again.
    for name in sorted((n for n in look if n in state.models), key=lambda n: (not _room_freed(state, n), n)):
        if p.full:
            break
        _decide_model(p, state.models[name], by_model.get(name, []))
    return p.actions


def _room_freed(state: State, name: str) -> bool:
    """Whether replicas were preempted for this model and have all gone."""
    preempting = state.models[name].preempting
    return bool(preempting) and not any(rid in state.replicas for rid in preempting)


# How long the shards of a multi-node replica rebuilt from registrations may
# take to all be reported (their agents register one by one).
ADOPT_WAIT_S = 120.0


def _models_to_look_at(state: State, now: float) -> set[str]:
    """Models with a replica to stop, a restart to begin or finish, fewer or
    more replicas than they want, or a waiting reason to say again: the
    others need nothing this pass."""
    look = set()
    tallies = state.tallies
    for name, t in tallies.items():
        if t.failed or t.unwanted or t.retiring or t.assembling:
            look.add(name)
    for name, model in state.models.items():
        t = tallies.get(name)
        live = t.live if t is not None else 0
        n = desired(model, now)
        if live != n or n != decided(model) or model.waiting or model.restart_queue:
            look.add(name)
    return look


def _decide_model(p: Pass, model: Model, live: list[Replica]) -> None:
    """One model: its desired count, what is above and below it, its restarts."""
    name = model.spec.name
    if p.stopped:
        # Replicas of this model preempted earlier in this pass are gone
        # already: counted as serving, the model's own scale-down stopped
        # another one too and left it below its minimum (a critical one too).
        live = [r for r in live if r.id not in p.stopped]
    m = ModelPass(p, model, live)
    n = m.n
    if n != decided(model):
        p.add(ev.ScaleModel(model=name, desired=n, reason=why_desired(model, p.now)))

    if len(m.serving) > n:
        # Scale down: those not yet serving first (nothing to drain), then the newest.
        extra = sorted(m.serving, key=lambda r: (r.state == "ready", -r.placed_at, -replica_number(r.id)))
        why = f"{name} scales down to {n}: {why_desired(model, p.now)}"
        for rep in extra[: len(m.serving) - n]:
            p.add(ev.StopReplica(replica=rep.id, reason=why, drain_s=_drain(m.spec, rep)))
            m.serving.remove(rep)

    numbered = p.numbers.get(name)  # changes when this pass places one of its replicas
    # The replacements placed in place of replicas stopped first count as
    # had: without them the placing below placed one more replica per
    # restart in place (max_unavailable), and the next pass scaled it down again.
    replaced = _begin_restarts(p, m)  # (first: it moves replicas from serving to retiring)
    m.have = len(m.serving) + replaced
    placing = _place_missing(p, m)
    if placing is None:
        return  # the pass's message is full: the next pass goes on
    outcome, waiting = placing

    if _retire(p, m, outcome) >= n:
        # Its restarts were finished in place or refused, and it has what it
        # wants: not waiting. (The reason was said after the replacement's
        # placement, which had cleared it, so every restart in place read
        # "waits: no room" until the next pass.)
        waiting = ""

    # Said only when it changes: a placement clears it at fold time (one in
    # place of a restarted replica too, hence no longer `have == len(serving)`).
    if waiting != model.waiting and (waiting or p.numbers.get(name) == numbered):
        p.add(ev.ModelWaiting(model=name, reason=waiting))


def _place_missing(p: Pass, m: ModelPass) -> tuple[Outcome, str] | None:
    """Place the replicas the model is short of; how that went, and why it
    waits ("" when it does not). None: the pass's message filled up on the way."""
    if m.have >= m.n:
        return Outcome.ENOUGH, ""
    model, spec = m.model, m.spec
    blocked = _blocked(p, model)
    if blocked:
        return Outcome.NOT_TRIED, blocked
    number = p.next_number(m.name)
    restarting = f"; restarting {', '.join(r.id for r in m.retiring)}" if m.retiring else ""
    while m.have < m.n and not p.full:
        placed = _place_one(p, m, f"{m.name}-{number}", _why_place(model, m.have, m.n) + restarting)
        if placed is None:
            limit = _over_limit(p, spec)
            if limit:
                return Outcome.OVER_LIMIT, limit
            if m.have + len(m.retiring) < m.n:
                # Short even counting the replicas being restarted (they
                # serve until replaced): only then does it take room from
                # others. A restart's replacement goes beside or in place
                # (_retire); preempting for it stopped a victim and then
                # restarted in place anyway.
                waiting = _preempt_for(p, m)
                if waiting:
                    return Outcome.PREEMPTING, waiting
                # Explained only when it neither preempts nor waits for its
                # victims: explaining reads every node (~10 ms on 2,000), and
                # a pass with hundreds of preemptors paid that for each.
                return Outcome.NO_ROOM, _why_young_victims(p, m) or _why_no_fit(p, spec.profiles)
            return Outcome.NO_ROOM, _why_no_fit(p, spec.profiles)
        if not p.add(placed):
            return None
        m.took(placed)
        number += 1
        m.have += 1
        m.placed += 1
    return Outcome.PLACED, ""


def _why_no_fit(p: Pass, profiles: list[ev.ProfileSpec]) -> str:
    """why_no_fit, said once per pass for models that ask for the same
    profiles, until a placement changes what is free: on a full fleet, the
    models that wait for room mostly ask alike, and each explanation reads
    every node."""
    key = (_encode(profiles), p.placements)
    why = p.explained.get(key)
    if why is None:
        why = p.explained[key] = why_no_fit(p.inv, profiles)
    return why


def _over_limit(p: Pass, spec: ev.ModelSpec) -> str:
    """Why no profile of the model may be placed for its owner's limits ("" when one may)."""
    state = p.state
    if not state.owners or not spec.owner:
        return ""
    why = ""
    for prof in spec.profiles:
        why = over_limit(state, spec.owner, need(prof), p.usage)
        if not why:
            return ""
    return why


def _victim_index(p: Pass) -> preempt.VictimIndex:
    if p.victims is None:
        p.victims = preempt.VictimIndex(p.state, p.now, taken=p.stopped)
    return p.victims


def _preempt_for(p: Pass, m: ModelPass) -> str:
    """Make room for a model that fits nowhere by stopping replicas that may
    give way (preempt.py); returns what it waits for ("" when nothing)."""
    pending = preempt.waiting_for_victims(p.state, m.model)
    if pending:
        return f"waiting for {', '.join(pending)}, preempted for it, to stop"
    index = _victim_index(p)
    chosen = preempt.choose(index, p.inv, m.model, m.spread, have=m.have, pending=p.usage)
    if not chosen:
        return ""
    if not p.add_together(preempt.decision(index, p.inv, m.model, chosen, p.now, m.have, m.n)):
        return ""  # no room left in this pass's message: the next pass decides again
    return f"preempting {', '.join(c.rep.id for _, c in chosen)} to make room"


def _why_young_victims(p: Pass, m: ModelPass) -> str:
    """Why a model that could preempt does not yet: the replicas that would
    make room for it are within their minimum lifetime. Said with the moment
    they become victims, where "no room" alone left a critical model
    waiting two minutes with nothing to say why."""
    later = preempt.choose(_victim_index(p), p.inv, m.model, m.spread, have=m.have, pending=p.usage, young=True)
    if not later:
        return ""
    ids = ", ".join(c.rep.id for _, c in later)
    when = max(c.rep.ready_at for _, c in later) + preempt.MIN_LIFETIME_S
    return (
        f"no room; {ids} would make room but became ready less than {preempt.MIN_LIFETIME_S:g}s ago "
        f"(a replica is not preempted before it has served that long): they may give way from {utc(when)}"
    )


def _why_place(model: Model, have: int, n: int) -> str:
    if model.spec.target_load > 0 or model.spec.on_demand:
        return f"{model.spec.name} has {have} of {n} replicas (desired)"
    return f"{model.spec.name} has {have} of {n} replicas"


def _drain(spec: ev.ModelSpec, rep: Replica) -> float:
    """A replica that serves is drained before it stops; one that does not, not."""
    return spec.drain_grace_s if rep.state == "ready" else 0.0


def _blocked(p: Pass, model: Model) -> str:
    """Why the model may not place now (parked, or backing off after replicas
    that failed to start), or "". Parks it when it has failed often enough."""
    if model.parked:
        return model.parked
    hold = preempt.held(p.state, model, p.now)
    if hold:
        return hold
    k = model.start_failures
    if k >= PARK_AFTER:
        why = (
            f"parked: {k} replicas in a row failed to start (the last: {model.last_failure}); "
            f"`llmgw ctl retry {model.spec.name}` tries again"
        )
        p.add(ev.ParkModel(model=model.spec.name, reason=why))
        return why
    until = backoff_until(model)
    if p.now < until:
        return (
            f"backing off: {k} replica(s) in a row failed to start (the last: {model.last_failure}); "
            f"the next try {until - model.failed_at:g}s after that failure"
        )
    return ""


# --------------------------------------------------------------------------- restarts


def restart_state(state: State, rep: Replica) -> str:
    """Where a replica's restart stands, for people: "queued", "replacing",
    "in place", "refused" (why: Replica.restart_reason), or "" when none was
    asked for."""
    if rep.restart:
        return rep.restart
    model = state.models.get(rep.model)
    if model is not None and rep.id in model.restart_queue:
        return "queued"
    return ""


def _retire(p: Pass, m: ModelPass, outcome: Outcome) -> int:
    """Finish the restarts under way (restart.go's retire); returns how many
    replicas the model has after them (`have`, with the replacements placed
    in place and the replicas whose restart was refused, which serve on).

    A retiring replica serves until its replacement does, and is then
    drained. When its replacement could not be placed beside it, what
    happens depends on what is in the way:
    - something being moved out of the way: replicas preempted for the
      model, or others of its replicas still coming up. Waited for: stopped
      meanwhile, it left the model with no replica ready while the room made
      for it was on its way (issue 11);
    - the replica itself (its node, or every card that fits, is what it
      holds): it is stopped now and its replacement placed in what it frees.
      Waiting would change nothing, and a restart shown as "replacing" for
      ever reads as one that never will;
    - more than it (its profile now needs more than any node has, even with
      it stopped): stopping it would leave the model short for nothing, so
      the restart is refused and the reason kept on the replica;
    - nothing was tried (a back-off): stopped after the drain grace with no
      replacement in sight, as if in place;
    - the model is parked: refused, its replacements fail to start.
    """
    model, spec, n = m.model, m.spec, m.n
    ready = sum(1 for r in m.serving if r.state == "ready")
    coming_up = m.placed or len(m.serving) > ready
    refused = 0
    for rep in m.retiring:
        if ready >= n:
            p.add(ev.StopReplica(replica=rep.id, reason="restarted: its replacement serves", drain_s=_drain(spec, rep)))
        elif m.have >= n:
            continue  # its replacement is placed and starting: wait for it
        elif model.parked or model.start_failures >= PARK_AFTER:
            # (Parked in this very pass too: refused at once rather than the
            # next pass, so the model never reads "waits: parked" while the
            # replica it could not replace serves on.)
            why = f"its replacements fail to start; the model is parked (llmgw ctl retry {spec.name})"
            p.add(ev.RefuseRestart(replica=rep.id, reason=why))
            refused += 1
        elif outcome is Outcome.PREEMPTING or (outcome is Outcome.NO_ROOM and coming_up):
            continue  # something is being moved out of the way: waited for
        elif outcome in (Outcome.NO_ROOM, Outcome.OVER_LIMIT):
            why = "restarted in place: it was the only thing in its replacement's way"
            if _in_place(p, m, rep, why):
                m.have += 1
            elif outcome is Outcome.OVER_LIMIT:
                why = f"its replacement would take {spec.owner} past a limit even with this replica stopped"
                p.add(ev.RefuseRestart(replica=rep.id, reason=why))
                refused += 1
            else:
                p.add(ev.RefuseRestart(replica=rep.id, reason=_fits_nowhere(spec)))
                refused += 1
        elif outcome is Outcome.NOT_TRIED and p.now - rep.retiring_at > spec.drain_grace_s:
            why = f"restarted in place: no replacement beside it within {spec.drain_grace_s:g}s"
            if _in_place(p, m, rep, why):
                m.have += 1
    return m.have + refused


def _fits_nowhere(spec: ev.ModelSpec) -> str:
    return f"its replacement fits on no node even with this replica stopped (llmgw ctl explain-placement {spec.name})"


def _begin_restarts(p: Pass, m: ModelPass) -> int:
    """Begin queued restarts, as many at once as the model's pace allows;
    those replaced beside themselves join `m.retiring`. Returns how many
    replacements were placed in place of replicas stopped first.

    The queue: what operators asked for (`llmgw ctl restart`), in order, then
    replicas whose profile changed since they were placed, which must be
    restarted to run what the catalog says. At once, `max_surge` are
    replaced beside themselves (no outage; needs room) and `max_unavailable`
    are stopped first, their replacements placed in what they free (an
    outage each while it loads; needs no room). A restart asked for in place
    takes one of the latter, at least one.
    """
    state, model, spec = p.state, m.model, m.spec
    queued = [rid for rid in model.restart_queue if rid in state.replicas]
    asked = set(queued)
    queued += [
        r.id
        for r in sorted(m.serving, key=lambda r: replica_number(r.id))
        if r.restart == "" and r.id not in asked and model.fingerprints.get(r.profile) != r.fingerprint
    ]
    replaced = 0
    if not queued:
        return replaced
    surge, unavailable = model.restart_surge, model.restart_unavailable
    if surge <= 0 and unavailable <= 0:
        surge = 1
    beside = surge - len(m.retiring)
    # Stopped for a replacement that does not serve yet: still unavailable.
    instead = sum(1 for r in m.live if r.replaced and r.state != "ready")
    for rid in queued:
        rep = state.replicas[rid]
        if rep.state != "ready" or rep.restart in RETIRING or rep not in m.serving:
            continue
        if rep.restart_in_place or beside <= 0:
            if instead >= max(unavailable, 1 if rep.restart_in_place else 0):
                break
            why = "restarted in place, as asked" if rep.restart_in_place else "restarted in place (max_unavailable)"
            if _in_place(p, m, rep, why, begin=True):
                replaced += 1
            elif rep.restart_in_place:
                # Asked for in place: stopped first, always, even if its
                # replacement must wait for room like any missing replica.
                p.add(ev.RestartReplica(replica=rid, reason=why, in_place=True))
                p.add(ev.StopReplica(replica=rid, reason=why, drain_s=_drain(spec, rep)))
            else:
                # Paced by max_unavailable, its replacement fits nowhere even
                # with it stopped: refused, as `_retire` refuses a surge
                # restart. (It was left queued for ever, still serving but
                # counted as stopped, so the model read "waits: no room".)
                p.add(ev.RefuseRestart(replica=rid, reason=_fits_nowhere(spec)))
                continue
            m.serving.remove(rep)
            instead += 1
            continue
        why = "asked by an operator" if rid in asked else f"profile {rep.profile} of {spec.name} changed"
        p.add(ev.RestartReplica(replica=rid, reason=why))
        m.retiring.append(rep)
        m.serving.remove(rep)
        beside -= 1
    return replaced


def _in_place(p: Pass, m: ModelPass, rep: Replica, why: str, begin: bool = False) -> bool:
    """Stop a replica and place its replacement in what it frees, in one
    pass: placed on the next pass instead, the freed cards went to a model
    waiting for room (seen for real: a judge waiting for the only GPU took
    the card of the model restarted there). Nothing is stopped when the
    replacement would not fit even so."""
    inv = p.inv
    inv.release(rep.shards)
    freed = replica_amount(rep)
    add(p.usage, rep.owner, freed, -1)  # what it holds is its replacement's to take, limits included
    placed = _place_one(p, m, f"{m.name}-{p.next_number(m.name)}", why, replaces=rep.id)
    if placed is None:
        inv.hold(rep.shards)
        add(p.usage, rep.owner, freed, +1)
        return False
    if begin:
        p.add(ev.RestartReplica(replica=rep.id, reason=why, in_place=True))
    p.add(ev.StopReplica(replica=rep.id, reason=why, drain_s=_drain(m.spec, rep)))
    p.add(placed)
    m.took(placed)
    inv.hold(_kept_till_exit(rep, placed))
    return True


def _kept_till_exit(rep: Replica, placed: ev.PlaceReplica) -> list[Shard]:
    """What a replica stopped for its replacement in place still holds until
    it exits: the fold hands over (decisions._place), on a node where the
    replacement has a shard, its memory, cores, and the GPUs and port the
    replacement took; the rest stays its own. Held again in the pass's
    inventory: counted free, a later placement of the pass took the GPU a
    2-GPU replica restarted on one left behind, and was voided."""
    took = {(s.node, g) for s in placed.shards for g in s.gpus}
    ports = {(s.node, s.port) for s in placed.shards}
    nodes = {s.node for s in placed.shards}
    return [
        Shard(
            id=sh.id, node=sh.node, rank=sh.rank, generation=sh.generation, state=sh.state,
            gpus=[g for g in sh.gpus if (sh.node, g) not in took],
            port=sh.port if (sh.node, sh.port) not in ports else 0,
            memory_gb=0.0 if sh.node in nodes else sh.memory_gb,
            cpu_cores=0 if sh.node in nodes else sh.cpu_cores,
        )
        for sh in rep.shards
    ]


# --------------------------------------------------------------------------- placing and stopping


def _place_one(p: Pass, m: ModelPass, replica: str, reason: str, replaces: str = "") -> ev.PlaceReplica | None:
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
            )
    return None


def _why_stop(state: State, rep: Replica, now: float) -> str:
    """Why a replica should stop now, or "" when it should keep running. A
    replica whose profile changed is not stopped: it is restarted
    (`_begin_restarts`), replaced before it goes."""
    model = state.models.get(rep.model)
    if model is None:
        return f"model {rep.model} was removed from the catalog"
    if rep.state == "failed":
        return f"replaced: {rep.reason}"
    if rep.want_shards and now - rep.placed_at > ADOPT_WAIT_S:
        return (
            f"adopted with {len(rep.shards)} of its {rep.want_shards} shards; "
            f"the others were not reported within {ADOPT_WAIT_S:g}s"
        )
    return ""
