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
finish and begin restarts (`_retire`, `_begin_restarts`). A restart is
a replacement placed beside the replica, which is drained once the
replacement serves; or, when asked or when the replica is the only thing in
its replacement's way, a stop and the replacement's placement in the same
pass, on what the stop frees, so that no other model takes it meanwhile.

A pass reads only what may need doing: the fold keeps a tally per model
(`state.tallies`) of its replicas, failed ones and unwanted ones, so a model
with as many healthy replicas as it wants is passed over without reading
them, and a fleet with nothing to do costs one look at each model and node.
"""

from __future__ import annotations

import msgspec

from . import events as ev
from .replicas import RETIRING, replica_number
from . import preempt
from .placement import Inventory, replicas_per_node, why_no_fit
from .quota import add, need, over_limit, replica_amount
from .scaling import PARK_AFTER, backoff_until, decided, desired, why_desired
from .state import Model, Replica, Shard, State

# Half the server's default payload limit: room for the message's own fields
# and headers, and for a server configured tighter than the default.
MAX_PASS_BYTES = 512 * 1024
# What a Decided message weighs besides its actions (type, times, basis, leader).
_ENVELOPE_BYTES = 256

_encode = msgspec.json.Encoder().encode


class _Pass:
    """The actions of one pass, and what their message will weigh."""

    def __init__(self, budget: int) -> None:
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

    def placed(self, owner: str, profile: ev.ProfileSpec) -> None:
        if owner:
            add(self.usage, owner, need(profile))


def decide(state: State, now: float, budget: int = MAX_PASS_BYTES) -> list[ev.Action]:
    out = _Pass(budget)

    # Strays first: they hold GPUs that placements are waiting for.
    with_strays = sorted(n for n, node in state.nodes.items() if node.strays and node.state == "ready")
    for name in with_strays:
        for shard, stray in state.nodes[name].strays.items():
            if not stray.stopping:
                out.add(ev.StopStray(node=name, shard=shard, generation=stray.generation, reason=stray.reason))

    look = _models_to_look_at(state, now)
    if not look:
        return out.actions

    # One read of the replicas, for the models that need a look only.
    by_model: dict[str, list[Replica]] = {}
    for rep in state.replicas.values():
        if rep.model not in look or rep.state == "stopping":
            continue
        why = _why_stop(state, rep, now)
        if why:
            out.add(ev.StopReplica(replica=rep.id, reason=why))
        else:
            by_model.setdefault(rep.model, []).append(rep)

    inv = Inventory(state)  # built at its first placement, if any
    # Models whose victims have all gone first: the room was freed for them.
    # Decided in name order only, one found it taken by a model before it
    # (the victims' own, its hold over) and preempted again, and again.
    for name in sorted((n for n in look if n in state.models), key=lambda n: (not _room_freed(state, n), n)):
        if out.full:
            break
        _decide_model(state, inv, name, by_model.get(name, []), out, now)
    return out.actions


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


def _decide_model(state: State, inv: Inventory, name: str, live: list[Replica], out: _Pass, now: float) -> None:
    """One model: its desired count, what is above and below it, its restarts."""
    model = state.models[name]
    spec = model.spec
    n = desired(model, now)
    if out.stopped:
        # Replicas of this model preempted earlier in this pass are gone
        # already: counted as serving, the model's own scale-down stopped
        # another one too and left it below its minimum (a critical one too).
        live = [r for r in live if r.id not in out.stopped]
    if n != decided(model):
        out.add(ev.ScaleModel(model=name, desired=n, reason=why_desired(model, now)))

    retiring = [r for r in live if r.restart in RETIRING]
    serving = [r for r in live if r.restart not in RETIRING]
    if len(serving) > n:
        # Scale down: those not yet serving first (nothing to drain), then the newest.
        extra = sorted(serving, key=lambda r: (r.state == "ready", -r.placed_at, -replica_number(r.id)))
        why = f"{name} scales down to {n}: {why_desired(model, now)}"
        for rep in extra[: len(serving) - n]:
            out.add(ev.StopReplica(replica=rep.id, reason=why, drain_s=_drain(spec, rep)))
            serving.remove(rep)

    spread = replicas_per_node(live)
    numbered = out.numbers.get(name)  # changes when this pass places one of its replicas
    began, replaced = _begin_restarts(state, inv, model, live, serving, retiring, spread, out)
    retiring += began
    serving = [r for r in serving if r not in began]

    # The replacements placed in place of replicas stopped above count as
    # had: without them the loop below placed one more replica per restart
    # in place (max_unavailable), and the next pass scaled it down again.
    have = len(serving) + replaced
    outcome, waiting = "enough", ""
    if have < n:
        blocked = _blocked(state, model, now, out)
        if blocked:
            outcome, waiting = "not tried", blocked
        else:
            number = _next_number(state, name, out)
            restarting = f"; restarting {', '.join(r.id for r in retiring)}" if retiring else ""
            while have < n and not out.full:
                why = _why_place(model, have, n) + restarting
                placed = _place_one(inv, spec, model.fingerprints, f"{name}-{number}", why, spread, state=state, out=out)
                if placed is None:
                    limit = _over_limit(state, spec, out)
                    if limit:
                        outcome, waiting = "over limit", limit
                    else:
                        outcome, waiting = "no room", ""
                        if have + len(retiring) < n:
                            # Short even counting the replicas being restarted (they
                            # serve until replaced): only then does it take room from
                            # others. A restart's replacement goes beside or in place
                            # (_retire); preempting for it stopped a victim and then
                            # restarted in place anyway.
                            waiting = _preempt_for(state, inv, model, spread, out, now, have, n)
                        # Explained only when it neither preempts nor waits for its
                        # victims: explaining reads every node (~10 ms on 2,000), and
                        # a pass with hundreds of preemptors paid that for each.
                        waiting = waiting or _why_no_fit(inv, spec.profiles, out)
                    break
                if not out.add(placed):
                    return
                for s in placed.shards:
                    spread[s.node] = spread.get(s.node, 0) + 1
                number += 1
                have += 1
            else:
                outcome = "placed"

    if _retire(state, inv, model, retiring, serving, have, n, outcome, spread, out, now) >= n:
        # Its restarts were finished in place or refused, and it has what it
        # wants: not waiting. (The reason was said after the replacement's
        # placement, which had cleared it, so every restart in place read
        # "waits: no room" until the next pass.)
        waiting = ""

    # Said only when it changes: a placement clears it at fold time (one in
    # place of a restarted replica too, hence no longer `have == len(serving)`).
    if waiting != model.waiting and (waiting or out.numbers.get(name) == numbered):
        out.add(ev.ModelWaiting(model=name, reason=waiting))


def _why_no_fit(inv: Inventory, profiles: list[ev.ProfileSpec], out: _Pass) -> str:
    """why_no_fit, said once per pass for models that ask for the same
    profiles, until a placement changes what is free: on a full fleet, the
    models that wait for room mostly ask alike, and each explanation reads
    every node."""
    key = (_encode(profiles), out.placements)
    why = out.explained.get(key)
    if why is None:
        why = out.explained[key] = why_no_fit(inv, profiles)
    return why


def _next_number(state: State, model: str, out: _Pass) -> int:
    """The number of the model's next replica id, after those placed earlier in this pass."""
    return out.numbers.get(model) or state.replica_numbers.get(model, 1)


def _over_limit(state: State, spec: ev.ModelSpec, out: _Pass) -> str:
    """Why no profile of the model may be placed for its owner's limits ("" when one may)."""
    if not state.owners or not spec.owner:
        return ""
    why = ""
    for p in spec.profiles:
        why = over_limit(state, spec.owner, need(p), out.usage)
        if not why:
            return ""
    return why


def _preempt_for(
    state: State, inv: Inventory, model: Model, spread: dict[str, int], out: _Pass, now: float, have: int, n: int,
) -> str:
    """Make room for a model that fits nowhere by stopping replicas that may
    give way (preempt.py); returns what it waits for ("" when nothing)."""
    pending = preempt.waiting_for_victims(state, model)
    if pending:
        return f"waiting for {', '.join(pending)}, preempted for it, to stop"
    if out.victims is None:
        out.victims = preempt.VictimIndex(state, now, taken=out.stopped)
    chosen = preempt.choose(out.victims, inv, model, spread, have=have, pending=out.usage)
    if not chosen:
        return ""
    if not out.add_together(preempt.decision(out.victims, inv, model, chosen, now, have, n)):
        return ""  # no room left in this pass's message: the next pass decides again
    return f"preempting {', '.join(c.rep.id for _, c in chosen)} to make room"


def _why_place(model: Model, have: int, n: int) -> str:
    if model.spec.target_load > 0 or model.spec.on_demand:
        return f"{model.spec.name} has {have} of {n} replicas (desired)"
    return f"{model.spec.name} has {have} of {n} replicas"


def _drain(spec: ev.ModelSpec, rep: Replica) -> float:
    """A replica that serves is drained before it stops; one that does not, not."""
    return spec.drain_grace_s if rep.state == "ready" else 0.0


def _blocked(state: State, model: Model, now: float, out: _Pass) -> str:
    """Why the model may not place now (parked, or backing off after replicas
    that failed to start), or "". Parks it when it has failed often enough."""
    if model.parked:
        return model.parked
    hold = preempt.held(state, model, now)
    if hold:
        return hold
    k = model.start_failures
    if k >= PARK_AFTER:
        why = (
            f"parked: {k} replicas in a row failed to start (the last: {model.last_failure}); "
            f"`llmgw ctl retry {model.spec.name}` tries again"
        )
        out.add(ev.ParkModel(model=model.spec.name, reason=why))
        return why
    until = backoff_until(model)
    if now < until:
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



def _retire(
    state: State, inv: Inventory, model: Model, retiring: list[Replica], serving: list[Replica],
    have: int, n: int, outcome: str, spread: dict[str, int], out: _Pass, now: float,
) -> int:
    """Finish the restarts under way (restart.go's retire); returns how many
    replicas the model has after them (`have`, with the replacements placed
    in place and the replicas whose restart was refused, which serve on).

    A retiring replica serves until its replacement does, and is then
    drained. When its replacement could not be placed beside it, what
    happens depends on what is in the way:
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
    spec = model.spec
    ready = sum(1 for r in serving if r.state == "ready")
    refused = 0
    for rep in retiring:
        if ready >= n:
            out.add(ev.StopReplica(replica=rep.id, reason="restarted: its replacement serves", drain_s=_drain(spec, rep)))
        elif have >= n:
            continue  # its replacement is placed and starting: wait for it
        elif model.parked or model.start_failures >= PARK_AFTER:
            # (Parked in this very pass too: refused at once rather than the
            # next pass, so the model never reads "waits: parked" while the
            # replica it could not replace serves on.)
            why = f"its replacements fail to start; the model is parked (llmgw ctl retry {spec.name})"
            out.add(ev.RefuseRestart(replica=rep.id, reason=why))
            refused += 1
        elif outcome in ("no room", "over limit"):
            why = "restarted in place: it was the only thing in its replacement's way"
            if _in_place(state, inv, model, rep, why, spread, out):
                have += 1
            elif outcome == "over limit":
                why = f"its replacement would take {spec.owner} past a limit even with this replica stopped"
                out.add(ev.RefuseRestart(replica=rep.id, reason=why))
                refused += 1
            else:
                out.add(ev.RefuseRestart(replica=rep.id, reason=_fits_nowhere(spec)))
                refused += 1
        elif outcome == "not tried" and now - rep.retiring_at > spec.drain_grace_s:
            why = f"restarted in place: no replacement beside it within {spec.drain_grace_s:g}s"
            if _in_place(state, inv, model, rep, why, spread, out):
                have += 1
    return have + refused


def _fits_nowhere(spec: ev.ModelSpec) -> str:
    return f"its replacement fits on no node even with this replica stopped (llmgw ctl explain-placement {spec.name})"


def _begin_restarts(
    state: State, inv: Inventory, model: Model, live: list[Replica], serving: list[Replica],
    retiring: list[Replica], spread: dict[str, int], out: _Pass,
) -> tuple[list[Replica], int]:
    """Begin queued restarts, as many at once as the model's pace allows;
    returns those now replaced beside themselves, and how many replacements
    were placed in place of replicas stopped first.

    The queue: what operators asked for (`llmgw ctl restart`), in order, then
    replicas whose profile changed since they were placed, which must be
    restarted to run what the catalog says. At once, `max_surge` are
    replaced beside themselves (no outage; needs room) and `max_unavailable`
    are stopped first, their replacements placed in what they free (an
    outage each while it loads; needs no room). A restart asked for in place
    takes one of the latter, at least one.
    """
    spec = model.spec
    queued = [rid for rid in model.restart_queue if rid in state.replicas]
    asked = set(queued)
    queued += [
        r.id
        for r in sorted(serving, key=lambda r: replica_number(r.id))
        if r.restart == "" and r.id not in asked and model.fingerprints.get(r.profile) != r.fingerprint
    ]
    began: list[Replica] = []
    replaced = 0
    if not queued:
        return began, replaced
    surge, unavailable = model.restart_surge, model.restart_unavailable
    if surge <= 0 and unavailable <= 0:
        surge = 1
    beside = surge - len(retiring)
    # Stopped for a replacement that does not serve yet: still unavailable.
    instead = sum(1 for r in live if r.replaced and r.state != "ready")
    for rid in queued:
        rep = state.replicas[rid]
        if rep.state != "ready" or rep.restart in RETIRING or rep not in serving:
            continue
        if rep.restart_in_place or beside <= 0:
            if instead >= max(unavailable, 1 if rep.restart_in_place else 0):
                break
            why = "restarted in place, as asked" if rep.restart_in_place else "restarted in place (max_unavailable)"
            if _in_place(state, inv, model, rep, why, spread, out, begin=True):
                replaced += 1
            elif rep.restart_in_place:
                # Asked for in place: stopped first, always, even if its
                # replacement must wait for room like any missing replica.
                out.add(ev.RestartReplica(replica=rid, reason=why, in_place=True))
                out.add(ev.StopReplica(replica=rid, reason=why, drain_s=_drain(spec, rep)))
            else:
                # Paced by max_unavailable, its replacement fits nowhere even
                # with it stopped: refused, as `_retire` refuses a surge
                # restart. (It was left queued for ever, still serving but
                # counted as stopped, so the model read "waits: no room".)
                out.add(ev.RefuseRestart(replica=rid, reason=_fits_nowhere(spec)))
                continue
            serving.remove(rep)
            instead += 1
            continue
        why = "asked by an operator" if rid in asked else f"profile {rep.profile} of {spec.name} changed"
        out.add(ev.RestartReplica(replica=rid, reason=why))
        began.append(rep)
        beside -= 1
    return began, replaced


def _in_place(
    state: State, inv: Inventory, model: Model, rep: Replica, why: str, spread: dict[str, int], out: _Pass,
    begin: bool = False,
) -> bool:
    """Stop a replica and place its replacement in what it frees, in one
    pass: placed on the next pass instead, the freed cards went to a model
    waiting for room (seen for real: a judge waiting for the only GPU took
    the card of the model restarted there). Nothing is stopped when the
    replacement would not fit even so."""
    inv.release(rep.shards)
    freed = replica_amount(rep)
    add(out.usage, rep.owner, freed, -1)  # what it holds is its replacement's to take, limits included
    name = model.spec.name
    placed = _place_one(inv, model.spec, model.fingerprints, f"{name}-{_next_number(state, name, out)}", why, spread,
                        replaces=rep.id, state=state, out=out)
    if placed is None:
        inv.hold(rep.shards)
        add(out.usage, rep.owner, freed, +1)
        return False
    if begin:
        out.add(ev.RestartReplica(replica=rep.id, reason=why, in_place=True))
    out.add(ev.StopReplica(replica=rep.id, reason=why, drain_s=_drain(model.spec, rep)))
    out.add(placed)
    for s in placed.shards:
        spread[s.node] = spread.get(s.node, 0) + 1
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


def _place_one(
    inv: Inventory, spec: ev.ModelSpec, fingerprints: dict[str, str], replica: str, reason: str,
    spread: dict[str, int], replaces: str = "", *, state: State, out: _Pass,
) -> ev.PlaceReplica | None:
    """The first profile, in the catalog's order of preference, that fits,
    within the owner's limits."""
    for profile in spec.profiles:
        if state.owners and spec.owner and over_limit(state, spec.owner, need(profile), out.usage):
            continue
        shards = inv.place(profile, replica, spread)
        if shards is not None:
            out.placed(spec.owner, profile)
            return ev.PlaceReplica(
                replica=replica,
                model=spec.name,
                profile=profile.name,
                fingerprint=fingerprints[profile.name],
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
