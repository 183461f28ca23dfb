"""Decisions folded: each action of a `Decided` checked again and applied, or voided.

A decision is an intent taken on the state folded so far; by the time it is
in the log an agent event may have come before it (a node lost, a shard
failed, GPUs taken by another leader's placement). Each action is checked
here, in log order, against the state as it is now; one that no longer holds
is voided with a reason (kept in `state.voided`), never applied. That is
what makes "no GPU given twice" true by construction, whoever published.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from ..rules import admission
from ..contract import events as ev
from ..contract import limits
from ..contract.catalog import profile_named
from ..scheduling.fit import cpu_short, memory_short, runs_real_engine
from .facility_facts import count_unmeasured, counted
from ..scheduling.facility import power_problem, shard_watts
from .nodeindex import touch
from .replicaindex import added, removed
from ..scheduling.ports import placement_problem
from ..rules.quota import add, count_shard, need, over_limit, replica_amount
from .replicas import RETIRING, TERMINAL, unwanted
from ..rules.waits import legacy_kind
from .state import Replica, Shard, State, Tally, Voided, add_gb


def fold_decided(state: State, e: ev.Decided, seq: int) -> None:
    """Apply each action in order, or void it with the reason it no longer holds."""
    for action in e.actions:
        why_not = _ACTIONS[type(action)](state, action, e, seq)
        if why_not:
            state.voided_count += 1
            state.voided.append(Voided(seq=seq, action=describe_action(action), reason=why_not))
            del state.voided[: -limits.LIMITS.kept_verbatim]


def _place(state: State, a: ev.PlaceReplica, e: ev.Decided, seq: int) -> str:
    """Apply a placement, or say why it no longer holds."""
    rid, model_name = a.replica, a.model
    if rid in state.replicas:
        return f"replica {rid} exists already"
    number = state.replica_numbers.get(model_name, 1)
    if rid != f"{model_name}-{number}":
        # Ids are handed out in order and never twice in one log: a stale
        # decision could name a replica that was placed and has gone since.
        return f"replica id {rid} is not the next one for {model_name} ({model_name}-{number})"
    model = state.models.get(model_name)
    if model is None:
        return f"model {model_name} is no longer in the catalog"
    if model.fingerprints.get(a.profile) != a.fingerprint:
        return f"profile {a.profile} of {model_name} changed since the decision"
    placements = a.shards
    if not placements or (len(placements) > 1 and len({s.node for s in placements}) != len(placements)):
        return "a replica needs one shard per distinct node"
    profile = profile_named(model.spec, a.profile)
    memory, cores = (profile.memory_gb, profile.cpu_cores) if profile is not None else (0.0, 0)
    if profile is not None:
        # What the shards take must be what the profile asks: the owner's
        # limits are counted by the profile (need), so a decision naming
        # three GPUs for a one-GPU profile took an owner past its limit
        # (found by tests/test_preemption_properties.py, a rogue decision).
        if len(placements) != max(profile.nodes, 1):
            return f"profile {a.profile} runs on {max(profile.nodes, 1)} node(s), not {len(placements)}"
        for s in placements:
            if len(s.gpus) != profile.gpus or (profile.gpus > 1 and len(set(s.gpus)) != profile.gpus):
                return f"shard {s.shard} takes GPUs {s.gpus}; profile {a.profile} asks {profile.gpus}"
    # In place: the shards of the replica it replaces (stopped in the same
    # pass) hand over what they hold on their nodes; the new ones start once
    # they have exited.
    handed: dict[str, Shard] = {}
    if a.replaces:
        old = state.replicas.get(a.replaces)
        if old is None or old.state != "stopping" or old.model != model_name:
            return f"replica {a.replaces} it replaces is not being stopped"
        handed = {sh.id: sh for sh in old.shards if sh.state not in TERMINAL}
    if state.owners and profile is not None:
        # What the replica it replaces holds is the replacement's to take,
        # limits included, as decide counted it (restarts.in_place): without
        # this credit a restart in place of an owner at its limit was voided
        # here after its predecessor's stop had been applied.
        credit: dict[str, ev.Resources] = {}
        if a.replaces:
            add(credit, old.owner, replica_amount(old), -1)
        why = over_limit(state, model.spec.owner, need(profile), credit)
        if why:
            return why
    nodes = state.nodes
    watts = []  # what each shard is counted as drawing (a comprehension after the loop cost a call)
    for s in placements:
        node = nodes.get(s.node)
        if node is None or node.state != "ready":
            return f"node {s.node} is not ready"
        if node.cordon:
            return f"node {s.node} {node.cordon}"
        if node.simulated and profile is not None and runs_real_engine(profile):
            return f"node {s.node} is simulated: profile {a.profile} runs {profile.engine} (simulate: true lets it)"
        memory_used, cpu_used = node.memory_used, node.cpu_used
        if handed:
            for sh in handed.values():
                if sh.node == s.node:
                    memory_used, cpu_used = add_gb(memory_used, -sh.memory_gb), cpu_used - sh.cpu_cores
        # Placement's own checks (fit.py), one implementation: a node that
        # does not say its memory or cores (0) is not limited by them, but
        # for a CPU-only profile, which runs on cores and needs a node that
        # says it has them (tests/test_cpu_only_placement.py).
        if profile is not None and memory_short(profile, node, memory_used):
            return (
                f"host memory on {s.node}: {memory:g} GB more would make {add_gb(memory_used, memory):g} "
                f"of {node.memory_gb:g} GB"
            )
        if profile is not None and cpu_short(profile, node, cpu_used):
            if not node.cpu_cores:
                return f"CPU on {s.node}: profile {a.profile} runs on cores, and the node reports none"
            return f"CPU on {s.node}: {cores} cores more would make {cpu_used + cores} of {node.cpu_cores}"
        gpus = node.gpus
        used = node.used
        for g in s.gpus:
            # GPUs are usually listed by index; look further only when not.
            if not (0 <= g < len(gpus) and gpus[g].index == g) and all(x.index != g for x in gpus):
                return f"node {s.node} has no GPU {g}"
            if g in used and used[g] not in handed:
                return f"GPU {g} on {s.node} is held by {used[g]}"
        if s.port in node.ports and node.ports[s.port] not in handed:
            return f"port {s.port} on {s.node} is held by {node.ports[s.port]}"
        why = placement_problem(node, s.port)
        if why:
            return why
        watts.append(shard_watts(profile, node, s.gpus) if profile is not None else 0.0)
    # Holds and power caps, checked again in log order (a hold, a cap or a
    # measurement may have come since the decision). What the replica it
    # replaces hands over on a node is credited, as decide released it.
    if state.holds or state.budgets:
        handed_w: dict[str, float] = {}
        for sh in handed.values():
            node = nodes.get(sh.node)
            if node is not None:
                handed_w[sh.node] = handed_w.get(sh.node, 0.0) + counted(node, sh)
        why = power_problem(state, [(nodes[s.node], w) for s, w in zip(placements, watts)], handed_w)
        if why:
            return why
    shards = []
    for s in placements:
        sid, port, gpus_taken = s.shard, s.port, s.gpus
        node = nodes[s.node]
        shards.append(
            Shard(
                id=sid,
                node=node.name,
                rank=s.rank,
                gpus=gpus_taken,
                port=port,
                generation=seq,
                memory_gb=memory,
                cpu_cores=cores,
                power_w=watts[len(shards)],
            )
        )
        count_unmeasured(state, node, shards[-1])
        touch(state, s.node)
        if handed:
            for old_sh in handed.values():
                if old_sh.node == s.node:
                    shards[-1].after.append(old_sh.id)
                    # And what it was itself waiting for: replaced in place
                    # again before it ever started, it hands over what the
                    # shard it replaced still holds until it exits (its port:
                    # the newest must not bind while that one drains on it).
                    shards[-1].after.extend(a for a in old_sh.after if a not in shards[-1].after)
                    # Handed over: its exit must not free them a second time,
                    # nor count them for its owner meanwhile.
                    node.memory_used = add_gb(node.memory_used, -old_sh.memory_gb)
                    node.cpu_used -= old_sh.cpu_cores
                    count_shard(state, old.owner, old_sh, -1)
                    old_sh.memory_gb, old_sh.cpu_cores = 0.0, 0
                    old_sh.gpus = [g for g in old_sh.gpus if g not in gpus_taken]
                    count_shard(state, old.owner, old_sh, +1)
        used = node.used
        for g in gpus_taken:
            used[g] = sid
        if port:
            node.ports[port] = sid
        if memory:
            node.memory_used = add_gb(node.memory_used, memory)
        node.cpu_used += cores
    state.replicas[rid] = Replica(
        id=rid,
        model=model_name,
        profile=a.profile,
        fingerprint=a.fingerprint,
        shards=shards,
        reason=a.reason,
        placed_at=e.at,
        replaced=a.replaces,
        owner=model.spec.owner,
        rejections=list(a.rejections),
    )
    added(state, state.replicas[rid])
    admission.placed(state, state.replicas[rid])
    if model.spec.owner:
        for sh in shards:
            count_shard(state, model.spec.owner, sh, +1)
    state.replica_numbers[model_name] = number + 1
    tally = state.tallies.get(model_name)
    if tally is None:
        tally = state.tallies[model_name] = Tally()
    tally.live += 1  # placing, on the profile the catalog has: neither failed nor unwanted
    model.waiting = model.waiting_kind = ""
    return ""


def _stop(state: State, a: ev.StopReplica, e: ev.Decided, seq: int) -> str:
    rep = state.replicas.get(a.replica)
    if rep is None:
        return f"replica {a.replica} is gone"
    if rep.state == "stopping":
        return f"replica {a.replica} is stopping already"
    if a.failed_to_start:
        if rep.ready_at:
            return f"replica {a.replica} became ready meanwhile"
        admission.count_start_failure(state, rep, a.reason, e.at)
    tally = state.tallies[rep.model]
    tally.live -= 1
    if rep.state == "failed":
        tally.failed -= 1
    if unwanted(state, rep):
        tally.unwanted -= 1
    if rep.restart in RETIRING:
        tally.retiring -= 1
    if rep.want_shards:
        tally.assembling -= 1
    model = state.models.get(rep.model)
    if model is not None and rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    running = False
    for sh in rep.shards:
        if sh.state not in TERMINAL:
            sh.state = "stopping"
            running = True
    if not running:
        # Nothing of it runs (a failed replica, the usual case): gone at once.
        del state.replicas[rep.id]
        removed(state, rep)
        return ""
    rep.state = "stopping"
    rep.reason = a.reason
    rep.stopping_at = e.at
    rep.drain_s = a.drain_s
    return ""


def _scale(state: State, a: ev.ScaleModel, e: ev.Decided, seq: int) -> str:
    model = state.models.get(a.model)
    if model is None:
        return f"model {a.model} is no longer in the catalog"
    model.desired = a.desired
    return ""


def _restart(state: State, a: ev.RestartReplica, e: ev.Decided, seq: int) -> str:
    rep = state.replicas.get(a.replica)
    if rep is None or rep.state == "stopping":
        return f"replica {a.replica} is gone or stopping"
    if rep.restart in RETIRING:
        return f"replica {a.replica} is restarting already"
    model = state.models.get(rep.model)
    if model is None:
        return f"model {rep.model} is no longer in the catalog"
    if rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    rep.restart = "in place" if a.in_place else "replacing"
    rep.restart_reason = a.reason
    rep.retiring_at = e.at
    state.tallies[rep.model].retiring += 1
    return ""


def _refuse_restart(state: State, a: ev.RefuseRestart, e: ev.Decided, seq: int) -> str:
    rep = state.replicas.get(a.replica)
    if rep is None or rep.state == "stopping":
        return f"replica {a.replica} is gone or stopping"
    model = state.models.get(rep.model)
    if model is None:
        # As a restart is (`_restart`): a replica of a removed model is being
        # stopped, not restarted, and a refusal would say it serves on.
        return f"model {rep.model} is no longer in the catalog"
    if rep.restart in RETIRING:
        state.tallies[rep.model].retiring -= 1
    if rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    rep.restart = "refused"
    rep.restart_reason = a.reason
    rep.retiring_at = 0.0
    rep.restart_in_place = False
    return ""


def _preempt(state: State, a: ev.Preempt, e: ev.Decided, seq: int) -> str:
    """Mark the victims and hold their models back; the victims' StopReplica
    actions, which follow, stop them."""
    model = state.models.get(a.model)
    if model is None:
        return f"model {a.model} is no longer in the catalog"
    for v in a.victims:
        rep = state.replicas.get(v.replica)
        if rep is None or rep.state == "stopping" or rep.preempted_for:
            return f"victim {v.replica} is gone, stopping or preempted already"
    for v in a.victims:
        state.replicas[v.replica].preempted_for = a.model
        gave = state.models.get(v.model)
        if gave is not None:
            gave.held_until, gave.held_for = a.hold_until, a.model
    model.preempting = [v.replica for v in a.victims]
    return ""


def _park(state: State, a: ev.ParkModel, e: ev.Decided, seq: int) -> str:
    model = state.models.get(a.model)
    if model is None:
        return f"model {a.model} is no longer in the catalog"
    model.parked = a.reason
    return ""


def _wait(state: State, a: ev.ModelWaiting, e: ev.Decided, seq: int) -> str:
    model = state.models.get(a.model)
    if model is None:
        return f"model {a.model} is no longer in the catalog"
    model.waiting = a.reason
    # A kind recorded is what is read; one recorded before kinds is read from its words.
    model.waiting_kind = a.kind or (legacy_kind(a.reason).value if a.reason else "")
    return ""


def _stop_stray(state: State, a: ev.StopStray, e: ev.Decided, seq: int) -> str:
    node = state.nodes.get(a.node)
    stray = node.strays.get(a.shard) if node is not None else None
    if stray is None or stray.generation != a.generation:
        return f"stray {a.shard} is no longer on {a.node}"
    if stray.stopping:
        return f"stray {a.shard} is stopping already"
    stray.stopping = True
    stray.reason, stray.cause = a.reason, a.cause
    return ""


def describe_action(a: ev.Action) -> str:
    if isinstance(a, ev.PlaceReplica):
        where = ", ".join(f"{s.node}:{s.gpus}" for s in a.shards)
        instead = f" in place of {a.replaces}" if a.replaces else ""
        return f"place {a.replica} ({a.model}/{a.profile}) on {where}{instead}"
    if isinstance(a, ev.StopReplica):
        return f"stop {a.replica}" + (f" after a drain of up to {a.drain_s:g}s" if a.drain_s else "")
    if isinstance(a, ev.ModelWaiting):
        return f"{a.model} waits"
    if isinstance(a, ev.StopStray):
        return f"stop stray {a.shard} on {a.node}"
    if isinstance(a, ev.ScaleModel):
        return f"scale {a.model} to {a.desired}"
    if isinstance(a, ev.RestartReplica):
        return f"restart {a.replica}" + (" in place" if a.in_place else "")
    if isinstance(a, ev.RefuseRestart):
        return f"refuse to restart {a.replica}"
    if isinstance(a, ev.ParkModel):
        return f"park {a.model}"
    if isinstance(a, ev.Preempt):
        victims = ", ".join(f"{v.replica} (tier {v.tier}: {v.why})" for v in a.victims)
        return f"preempt {victims} for {a.model}"
    return type(a).__name__


# Fields of actions added after logs were recorded with them: an action
# recorded before one has its default, and is compared without it.
_ADDED_LATER: dict[type, tuple[str, ...]] = {
    ev.ModelWaiting: ("kind", "cause"),
    # Causes (reasons.py, issue 33): the reason's words are compared all the same.
    **{t: ("cause",) for t in (ev.StopReplica, ev.StopStray, ev.ScaleModel, ev.RestartReplica, ev.RefuseRestart,
                               ev.ParkModel, ev.Preempt)},
}


def as_recorded(again: list[ev.Action], recorded: list[ev.Action]) -> list[ev.Action]:
    """The actions decided again, less the fields the recorded ones were
    written before (`_ADDED_LATER`), so that an old log still verifies."""
    if len(again) != len(recorded):
        return again
    out = []
    for a, r in zip(again, recorded):
        later = _ADDED_LATER.get(type(a))
        if later and type(r) is type(a):
            defaults = {f.name: f.default for f in msgspec.structs.fields(r) if f.name in later}
            unsaid = {name: d for name, d in defaults.items() if getattr(r, name) == d}
            if unsaid:
                a = msgspec.structs.replace(a, **unsaid)
        out.append(a)
    return out


_ACTIONS: dict[type, Callable[[State, ev.Action, ev.Decided, int], str]] = {
    ev.PlaceReplica: _place,
    ev.StopReplica: _stop,
    ev.ModelWaiting: _wait,
    ev.StopStray: _stop_stray,
    ev.ScaleModel: _scale,
    ev.RestartReplica: _restart,
    ev.RefuseRestart: _refuse_restart,
    ev.ParkModel: _park,
    ev.Preempt: _preempt,
}
