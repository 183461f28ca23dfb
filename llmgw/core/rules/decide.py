"""decide(state, now): what the control plane should do next, as plain data.

Pure given `now`: the same state and time give the same actions, which is what
lets `llmgw replay --verify` re-run every recorded pass and compare.

A pass returns everything it decided as one list; the shell publishes it as
one `Decided` message, so what must happen together (a failed replica stopped
and its replacement placed) cannot be split by a crash.

A pass is bounded by the size of that message (passes.py says why).

Per model, a pass follows the seeds' reconciler (restart.go): scale to the
desired count (scaling.py: load, on demand, min and max); drain and stop
what is above it; replace what failed; place what is missing unless the
model backs off or is parked after replicas that failed to start; then
finish and begin restarts (restarts.py). How the model's placements went
is an `Outcome`, which is what a restart is decided on. The pass's inputs
and what it decided so far are a `Pass` and a `ModelPass` (passes.py).

A pass reads only what may need doing: the fold keeps a tally per model
(`state.tallies`) of its replicas, failed ones and unwanted ones, so a model
with as many healthy replicas as it wants is passed over without reading
them, and a fleet with nothing to do costs one look at each model and node.
"""

from __future__ import annotations

from . import drains
from ..contract import events as ev
from ..contract import limits
from . import preempt
from .admission import overdue, start_overdue
from ..contract.bounds import MAX_TIME, clip
from .passes import ModelPass, Outcome, Pass, drain_s, place_one, why_no_fit
from .quota import need, over_limit_cause
from ..folding.replicaindex import replicas_of
from ..folding.replicas import replica_number
from .restarts import begin_restarts, restart_state, retire
from ..contract.policy import DEFAULT
from ..contract.reasons import K, because, cause, render
from .scaling import backoff_until, decided, desired, why_desired
from ..folding.state import Model, Replica, State
from .waits import Wait, WaitKind

__all__ = ["decide", "restart_state", "Outcome", "ADOPT_WAIT_S"]


def decide(state: State, now: float, budget: int | None = None) -> list[ev.Action]:
    """One pass of decisions, their message within `budget` bytes (None:
    limits.LIMITS.pass_bytes, the control plane's; a test or a benchmark
    passes another)."""
    p = Pass(state, now, limits.LIMITS.pass_bytes if budget is None else budget)

    # Strays first: they hold GPUs that placements are waiting for.
    with_strays = sorted(n for n, node in state.nodes.items() if node.strays and node.state == "ready")
    for name in with_strays:
        for shard, stray in state.nodes[name].strays.items():
            if not stray.stopping:
                p.add(ev.StopStray(node=name, shard=shard, generation=stray.generation, reason=stray.reason,
                                   cause=stray.cause))

    look = _models_to_look_at(state, now)
    if not look:
        return p.actions

    # The replicas of the models that need a look only (replicaindex.py), in
    # the state's order.
    by_model: dict[str, list[Replica]] = {}
    timed_out: set[str] = set()  # models with one stopped past its start deadline: no replacement before the backoff
    for rep in replicas_of(state, look):
        if rep.state == "stopping":
            continue
        why = _why_stop(state, rep, now)
        if why is not None:
            p.add(ev.StopReplica(replica=rep.id, **because(why)))
            continue
        why = start_overdue(state, rep, now)
        if why is not None:
            p.add(ev.StopReplica(replica=rep.id, **because(why), failed_to_start=True))
            timed_out.add(rep.model)
        else:
            by_model.setdefault(rep.model, []).append(rep)

    # Models whose victims have all gone first: the room was freed for them.
    # Decided in name order only, one found it taken by a model before it
    # (the victims' own, its hold over) and preempted again, and again.
    for name in sorted((n for n in look if n in state.models), key=lambda n: (not _room_freed(state, n), n)):
        if p.full:
            break
        _decide_model(p, state.models[name], by_model.get(name, []), name in timed_out)
    return p.actions


def _room_freed(state: State, name: str) -> bool:
    """Whether replicas were preempted for this model and have all gone."""
    preempting = state.models[name].preempting
    return bool(preempting) and not any(rid in state.replicas for rid in preempting)


# How long the shards of a multi-node replica rebuilt from registrations may
# take to all be reported (their agents register one by one).
ADOPT_WAIT_S = DEFAULT.adopt_wait_s  # the default of state.policy.adopt_wait_s


def _models_to_look_at(state: State, now: float) -> set[str]:
    """Models with a replica to stop, a restart to begin or finish, fewer or
    more replicas than they want, or a waiting reason to say again: the
    others need nothing this pass."""
    look = set()
    tallies = state.tallies
    for name, t in tallies.items():
        if t.failed or t.unwanted or t.retiring or t.assembling:
            look.add(name)
    if state.unstarted:
        look |= overdue(state, now)
    for name, model in state.models.items():
        t = tallies.get(name)
        live = t.live if t is not None else 0
        n = desired(model, now)
        if live != n or n != decided(model) or model.waiting or model.restart_queue:
            look.add(name)
    look |= drains.models_draining(state)  # replicas to move out of a drained domain
    return look


def _decide_model(p: Pass, model: Model, live: list[Replica], late: bool = False) -> None:
    """One model: its desired count, what is above and below it, its restarts.
    `late`: a replica of it was stopped past its start deadline in this pass,
    a start failure the fold counts when the pass lands; the replacement is
    placed by a later pass, after the backoff, as after any start failure."""
    name = model.spec.name
    if p.stopped:
        # Replicas of this model preempted earlier in this pass are gone
        # already: counted as serving, the model's own scale-down stopped
        # another one too and left it below its minimum (a critical one too).
        live = [r for r in live if r.id not in p.stopped]
    m = ModelPass(p, model, live)
    for node in model.late_nodes:  # where its replicas did not start in time: elsewhere first (admission.py)
        m.spread[node] = m.spread.get(node, 0) + 1
    n = m.n
    if n != decided(model):
        why = cause(K.DESIRED, model=name, scale=why_desired(model, p.now))
        p.add(ev.ScaleModel(model=name, desired=n, **because(why)))

    if len(m.serving) > n:
        # Scale down: those not yet serving first (nothing to drain), then the newest.
        extra = sorted(m.serving, key=lambda r: (r.state == "ready", -r.placed_at, -replica_number(r.id)))
        why = because(cause(K.SCALE_DOWN, model=name, count=n, scale=why_desired(model, p.now)))
        for rep in extra[: len(m.serving) - n]:
            p.add(ev.StopReplica(replica=rep.id, **why, drain_s=drain_s(m.spec, rep)))
            m.serving.remove(rep)

    numbered = p.numbers.get(name)  # changes when this pass places one of its replicas
    # The replacements placed in place of replicas stopped first count as
    # had: without them the placing below placed one more replica per
    # restart in place (max_unavailable), and the next pass scaled it down again.
    replaced = begin_restarts(p, m)  # (first: it moves replicas from serving to retiring)
    m.have = len(m.serving) + replaced
    placing = _place_missing(p, m, late)
    if placing is None:
        return  # the pass's message is full: the next pass goes on
    outcome, wait = placing

    if retire(p, m, outcome) >= n:
        # Its restarts were finished in place or refused, and it has what it
        # wants: not waiting. (The reason was said after the replacement's
        # placement, which had cleared it, so every restart in place read
        # "waits: no room" until the next pass.)
        wait = NOT_WAITING

    # Said only when it changes: a placement clears it at fold time (one in
    # place of a restarted replica too, hence no longer `have == len(serving)`).
    waiting = clip(wait.reason)  # as it is recorded (bounds.fit_action), so it is said once
    kind = wait.kind.value if waiting else ""
    if (waiting != model.waiting or kind != model.waiting_kind) and (waiting or p.numbers.get(name) == numbered):
        p.add(ev.ModelWaiting(model=name, reason=waiting, kind=kind, cause=wait.cause if waiting else None))


NOT_WAITING = Wait(WaitKind.NONE)


def _place_missing(p: Pass, m: ModelPass, late: bool = False) -> tuple[Outcome, Wait] | None:
    """Place the replicas the model is short of; how that went, and why it
    waits (NOT_WAITING when it does not). None: the pass's message filled up on the way."""
    if m.have >= m.n:
        return Outcome.ENOUGH, NOT_WAITING
    model, spec = m.model, m.spec
    blocked = _blocked(p, model)
    if not blocked.reason and late:
        blocked = _wait(WaitKind.BACKING_OFF, cause(K.LATE, model=m.name))
    if blocked.reason:
        return Outcome.NOT_TRIED, blocked
    number = p.next_number(m.name)
    restarting = f"; restarting {', '.join(r.id for r in m.retiring)}" if m.retiring else ""
    while m.have < m.n and not p.full:
        placed = place_one(p, m, f"{m.name}-{number}", _why_place(model, m.have, m.n) + restarting)
        if placed is None:
            limit = _over_limit(p, spec)
            if limit is not None:
                return Outcome.OVER_LIMIT, _wait(WaitKind.OVER_LIMIT, limit)
            if m.have + len(m.retiring) < m.n:
                # Short even counting the replicas being restarted (they
                # serve until replaced): only then does it take room from
                # others. A restart's replacement goes beside or in place
                # (_retire); preempting for it stopped a victim and then
                # restarted in place anyway.
                waiting = _preempt_for(p, m)
                if waiting is not None:
                    return Outcome.PREEMPTING, _wait(WaitKind.PREEMPTING, waiting)
                # Explained only when it neither preempts nor waits for its
                # victims: explaining reads every node (~10 ms on 2,000), and
                # a pass with hundreds of preemptors paid that for each.
                later = _why_young_victims(p, m)
                return Outcome.NO_ROOM, _wait(WaitKind.ROOM_LATER, later) if later is not None else _no_fit(p, spec)
            return Outcome.NO_ROOM, _no_fit(p, spec)
        if not p.add(placed):
            return None
        number += 1
        m.have += 1
        m.placed += 1
    return Outcome.PLACED, NOT_WAITING


def _wait(kind: WaitKind, c: ev.Cause) -> Wait:
    """A wait of this kind for this cause, with its words."""
    return Wait(kind, render(c), c)


def _no_fit(p: Pass, spec: ev.ModelSpec) -> Wait:
    """Why no profile fits: no room, or no node to fit on (one may register)."""
    kind = WaitKind.NO_ROOM if p.inv.has_ready() else WaitKind.NO_NODE
    return Wait(kind, why_no_fit(p, spec.profiles))


def _over_limit(p: Pass, spec: ev.ModelSpec) -> ev.Cause | None:
    """Why no profile of the model may be placed for its owner's limits (None when one may)."""
    state = p.state
    if not state.owners or not spec.owner:
        return None
    why = None
    for prof in spec.profiles:
        why = over_limit_cause(state, spec.owner, need(prof), p.usage)
        if why is None:
            return None
    return why


def _victim_index(p: Pass) -> preempt.VictimIndex:
    if p.victims is None:
        p.victims = preempt.VictimIndex(p.state, p.now, taken=p.stopped)
    return p.victims


def _preempt_for(p: Pass, m: ModelPass) -> ev.Cause | None:
    """Make room for a model that fits nowhere by stopping replicas that may
    give way (preempt.py); returns what it waits for (None when nothing)."""
    pending = preempt.waiting_for_victims(p.state, m.model)
    if pending:
        return cause(K.WAITING_FOR, replicas=pending)
    index = _victim_index(p)
    chosen = preempt.choose(index, p.inv, m.model, m.spread, have=m.have, pending=p.usage)
    if not chosen:
        return None
    if not p.add_together(preempt.decision(index, p.inv, m.model, chosen, p.now, m.have, m.n)):
        return None  # no room left in this pass's message: the next pass decides again
    return cause(K.PREEMPTING, replicas=[c.rep.id for _, c in chosen])


def _why_young_victims(p: Pass, m: ModelPass) -> ev.Cause | None:
    """Why a model that could preempt does not yet: the replicas that would
    make room for it are within their minimum lifetime. Said with the moment
    they become victims, where "no room" alone left a critical model
    waiting two minutes with nothing to say why."""
    later = preempt.choose(_victim_index(p), p.inv, m.model, m.spread, have=m.have, pending=p.usage, young=True)
    if not later:
        return None
    lifetime = p.state.policy.min_lifetime_s
    when = max(c.rep.ready_at for _, c in later) + lifetime
    return cause(K.YOUNG_VICTIMS, replicas=[c.rep.id for _, c in later], seconds=lifetime, at=min(when, MAX_TIME))


def _why_place(model: Model, have: int, n: int) -> str:
    if model.spec.target_load > 0 or model.spec.on_demand:
        return f"{model.spec.name} has {have} of {n} replicas (desired)"
    return f"{model.spec.name} has {have} of {n} replicas"


def _blocked(p: Pass, model: Model) -> Wait:
    """Why the model may not place now (parked, held, or backing off after
    replicas that failed to start), or NOT_WAITING. Parks it when it has
    failed often enough."""
    if model.parked:
        # Its words as the fold kept them (ParkModel's): the cause is in the log.
        return Wait(WaitKind.PARKED, model.parked)
    hold = preempt.held(p.state, model, p.now)
    if hold is not None:
        return _wait(WaitKind.HELD, hold)
    k = model.start_failures
    if k >= p.state.policy.park_after:
        why = cause(K.PARKED, model=model.spec.name, count=k, text=model.last_failure)
        p.add(ev.ParkModel(model=model.spec.name, **because(why)))
        return _wait(WaitKind.PARKED, why)
    until = backoff_until(model, p.state.policy)
    if p.now < until:
        return _wait(WaitKind.BACKING_OFF, cause(
            K.BACKING_OFF, count=k, text=model.last_failure, seconds=until - model.failed_at))
    return NOT_WAITING


# --------------------------------------------------------------------------- stopping


def _why_stop(state: State, rep: Replica, now: float) -> ev.Cause | None:
    """Why a replica should stop now, or None when it should keep running. A
    replica whose profile changed is not stopped: it is restarted
    (`_begin_restarts`), replaced before it goes."""
    model = state.models.get(rep.model)
    if model is None:
        return cause(K.MODEL_REMOVED, model=rep.model)
    if rep.state == "failed":
        return cause(K.REPLACED, text=rep.reason)
    wait = state.policy.adopt_wait_s
    if rep.want_shards and now - rep.placed_at > wait:
        return cause(K.ADOPTED_PARTLY, count=len(rep.shards), of=rep.want_shards, seconds=wait)
    return None
