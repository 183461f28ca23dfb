"""Restarts (restart.go): a replica replaced by one running what the catalog says now.

A restart is asked for by an operator (`llmgw ctl restart`) or follows from a
changed profile (its fingerprint). The replacement is placed beside the
replica first (surge), which is drained once the replacement serves; paced
by max_surge and max_unavailable; in place when asked, or when the replica
is the only thing in its replacement's way, in which case the stop and the
replacement's placement are one pass, so that no other model takes the room
meanwhile. Refused, with the reason kept on the replica, when the
replacement fits nowhere even with it stopped, or the model is parked. What
happens when there is no room is decided on the `Outcome` of the model's
placements in the pass (see `retire`).
"""

from __future__ import annotations

from . import drains
from ..contract import events as ev
from .passes import ModelPass, Outcome, Pass, drain_s, place_one
from .quota import add, replica_amount
from ..contract.reasons import K, because, cause, render
from ..folding.replicas import RETIRING, replica_number
from ..folding.state import Replica, Shard, State


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


def retire(p: Pass, m: ModelPass, outcome: Outcome) -> int:
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
            p.add(ev.StopReplica(replica=rep.id, **because(cause(K.RESTART_SERVED)), drain_s=drain_s(spec, rep)))
        elif m.have >= n:
            continue  # its replacement is placed and starting: wait for it
        elif model.parked or model.start_failures >= p.state.policy.park_after:
            # (Parked in this very pass too: refused at once rather than the
            # next pass, so the model never reads "waits: parked" while the
            # replica it could not replace serves on.)
            p.add(ev.RefuseRestart(replica=rep.id, **because(cause(K.REFUSE_PARKED, model=spec.name))))
            refused += 1
        elif outcome is Outcome.PREEMPTING or (outcome is Outcome.NO_ROOM and coming_up):
            continue  # something is being moved out of the way: waited for
        elif outcome in (Outcome.NO_ROOM, Outcome.OVER_LIMIT):
            if _in_place(p, m, rep, cause(K.IN_PLACE_ONLY)):
                m.have += 1
            elif outcome is Outcome.OVER_LIMIT:
                p.add(ev.RefuseRestart(replica=rep.id, **because(cause(K.REFUSE_OVER_LIMIT, owner=spec.owner))))
                refused += 1
            else:
                why = drains.refusal(p.state, rep) or _fits_nowhere(spec)
                p.add(ev.RefuseRestart(replica=rep.id, **because(why)))
                refused += 1
        elif outcome is Outcome.NOT_TRIED and p.now - rep.retiring_at > spec.drain_grace_s:
            if _in_place(p, m, rep, cause(K.IN_PLACE_GRACE, seconds=spec.drain_grace_s)):
                m.have += 1
    return m.have + refused


def _fits_nowhere(spec: ev.ModelSpec) -> ev.Cause:
    return cause(K.REFUSE_FITS_NOWHERE, model=spec.name)


def begin_restarts(p: Pass, m: ModelPass) -> int:
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
    # Replicas in a domain held for draining: moved as restarts with surge.
    moving = {rep.id: why for rep, why in drains.to_move(p, m, set(queued))}
    queued += list(moving)
    replaced = 0
    if not queued:
        return replaced
    surge, unavailable = model.restart_surge, model.restart_unavailable
    if surge <= 0 and unavailable <= 0:
        surge = state.policy.restart_max_surge
    beside = surge - len(m.retiring)
    # Stopped for a replacement that does not serve yet: still unavailable.
    instead = sum(1 for r in m.live if r.replaced and r.state != "ready")
    for rid in queued:
        rep = state.replicas[rid]
        if rep.state != "ready" or rep.restart in RETIRING or rep not in m.serving:
            continue
        if rid in moving:
            # Out of a drained domain: always beside itself, never an outage;
            # at least one at a time whatever the model's pace.
            if beside <= 0 and m.retiring:
                continue
        elif rep.restart_in_place or beside <= 0:
            if instead >= max(unavailable, 1 if rep.restart_in_place else 0):
                break
            why = cause(K.IN_PLACE_ASKED if rep.restart_in_place else K.IN_PLACE_PACED)
            if _in_place(p, m, rep, why, begin=True):
                replaced += 1
            elif rep.restart_in_place:
                # Asked for in place: stopped first, always, even if its
                # replacement must wait for room like any missing replica.
                p.add(ev.RestartReplica(replica=rid, **because(why), in_place=True))
                p.add(ev.StopReplica(replica=rid, **because(why), drain_s=drain_s(spec, rep)))
            else:
                # Paced by max_unavailable, its replacement fits nowhere even
                # with it stopped: refused, as `_retire` refuses a surge
                # restart. (It was left queued for ever, still serving but
                # counted as stopped, so the model read "waits: no room".)
                p.add(ev.RefuseRestart(replica=rid, **because(_fits_nowhere(spec))))
                continue
            m.serving.remove(rep)
            instead += 1
            continue
        why = (cause(K.RESTART_ASKED) if rid in asked
               else moving.get(rid) or cause(K.PROFILE_CHANGED, profile=rep.profile, model=spec.name))
        p.add(ev.RestartReplica(replica=rid, **because(why)))
        m.retiring.append(rep)
        m.serving.remove(rep)
        beside -= 1
    return replaced


def _in_place(p: Pass, m: ModelPass, rep: Replica, why: ev.Cause, begin: bool = False) -> bool:
    """Stop a replica and place its replacement in what it frees, in one
    pass: placed on the next pass instead, the freed cards went to a model
    waiting for room (seen for real: a judge waiting for the only GPU took
    the card of the model restarted there). Nothing is stopped when the
    replacement would not fit even so."""
    inv = p.inv
    inv.release(rep.shards, handover=True)
    freed = replica_amount(rep)
    add(p.usage, rep.owner, freed, -1)  # what it holds is its replacement's to take, limits included
    placed = place_one(p, m, f"{m.name}-{p.next_number(m.name)}", render(why), replaces=rep.id)
    if placed is None:
        inv.hold(rep.shards, handover=True)
        add(p.usage, rep.owner, freed, +1)
        return False
    if begin:
        p.add(ev.RestartReplica(replica=rep.id, **because(why), in_place=True))
    p.add(ev.StopReplica(replica=rep.id, **because(why), drain_s=drain_s(m.spec, rep)))
    p.add(placed)
    inv.hold(_kept_till_exit(rep, placed), handover=True)
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
            # Its draw too (facility_facts.counted), as the fold credits it: on a
            # node the replacement took, handed over; elsewhere its own.
            power_w=0.0 if sh.node in nodes else sh.power_w,
            measured=sh.measured,
        )
        for sh in rep.shards
    ]
