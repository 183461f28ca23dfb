"""Adoption (adopt.go): the fleet is authoritative about what runs.

An agent that registers says every shard it runs. `take_reports` matches
that against what the log believes runs on the node: shards we placed that
it reports are kept, those it does not mention have failed, and what else it
runs is adopted when the catalog still asks for it, or kept as a stray (its
GPUs and port held until it exits) when nothing claims it. A node claims
only what the log placed on it, and adopts only into a pool it is in
(admission.py): a replica placed on another node, reported here, is a stray
here (it was taken over, and its prompts with it: issue 35).
"""

from __future__ import annotations

from ..contract import events as ev
from .admission import claim_problem
from ..contract.catalog import profile_named
from ..scheduling.facility import shard_watts
from .quota import count_shard
from ..contract.reasons import K, cause, render
from ..folding.replicaindex import added
from ..folding.replicas import derive_live_state, derive_replica_state, forget, hold, replica_number, tally
from ..folding.state import TERMINAL_SHARD_STATES, Node, Replica, Shard, State, Stray, add_gb


def take_reports(state: State, node: Node, e: ev.NodeRegistered) -> None:
    """Match what a (re)registering agent runs against what the log believes
    runs on its node (see the module's docstring).

    A shard we believed ran there and that the agent did not mention has
    failed (seen for real: an engine died while its agent lived, and the
    replica stayed "ready" on a dead port for as long as anyone watched). A
    registration follows a fresh connection, so nothing dispatched before it
    can be legitimately starting unreported.
    """
    reported = {r.shard: r for r in e.running}
    ours: set[str] = set()
    # Shards we placed there: kept if reported, failed if not.
    for rep in list(state.replicas.values()):
        touched = False
        for sh in rep.shards:
            if sh.node != e.node or sh.state in TERMINAL_SHARD_STATES:
                continue
            r = reported.get(sh.id)
            if r is not None and r.generation == sh.generation:
                ours.add(sh.id)
                hold(state, node, sh)
                if sh.state != "stopping" and r.state in ("starting", "loading", "ready"):
                    sh.state = r.state
                    sh.endpoint = r.endpoint or sh.endpoint
                    sh.identity = r.identity or sh.identity
            elif r is None and sh.state == "placing" and any(a in ours for a in sh.after):
                # Placed in place of a shard the agent still runs (a restart
                # in place, its old engine draining): rightly not started yet,
                # so not failed; it keeps what it took over. (The old one's
                # replica was placed first, so it was matched above.)
                hold(state, node, sh)
                continue
            else:
                count_shard(state, rep.owner, sh, -1)
                sh.state = "failed"
                sh.reason = "the agent reports it is not running"
            touched = True
        if touched:
            derive_replica_state(state, rep, e.at)
    # What else runs there is adopted when the catalog still asks for it, or
    # else a stray: it holds its GPUs and port until it exits.
    unknown: dict[str, list[ev.RunningShard]] = {}
    for r in e.running:
        if r.shard not in ours:
            unknown.setdefault(r.replica, []).append(r)
    for rid, group in unknown.items():
        # Not a replica placed elsewhere, nor one of a pool the node is not
        # in (admission.py): those it may not claim are strays, stopped.
        refused = claim_problem(state, node, rid, group)
        for r in group if refused is not None else _adopt(state, node, rid, group, e.at):
            why = refused or _stray_reason(state, r, node.name)
            node.strays[r.shard] = Stray(generation=r.generation, gpus=list(r.gpus), port=r.port, reason=render(why),
                                         cause=why)
            for g in r.gpus:
                node.used.setdefault(g, r.shard)
            if r.port:
                node.ports.setdefault(r.port, r.shard)


def _adopt(state: State, node: Node, rid: str, group: list[ev.RunningShard], at: float) -> list[ev.RunningShard]:
    """Rebuild a replica from shards an agent runs and the log does not know
    (adopt.go); returns those that are strays instead.

    This is what lets a fleet outlive its log (a stream made anew while the
    engines ran on): without it the control plane sees an empty fleet,
    places duplicates, and the engines already running hold GPUs the state
    believes free. Rules:
    - The other shards of a multi-node replica being rebuilt are merged, not
      treated as rivals: they are simply on a node whose agent registered a
      moment later (treating them as a competing claim tore multi-node
      replicas apart on every restart).
    - A reported replica replaces one we merely placed under the same id on
      this node (one placed on another is refused before: admission.py); if
      ours has a shard that came up, two things really run, and the one we
      did not ask for is the stray.
    - Ids are never used twice in one log: a replica that this log placed
      and has forgotten since (stopped, replaced) is not brought back.
    - No model or profile in the catalog for it: a stray, stopped.
    """
    first = group[0]
    model = state.models.get(first.model)
    profile = profile_named(model.spec, first.profile) if model is not None else None
    if model is None or profile is None or rid.rpartition("-")[0] != first.model:
        return group
    existing = state.replicas.get(rid)
    if existing is None and replica_number(rid) < state.replica_numbers.get(first.model, 1):
        return group  # used before in this log, and gone: left over, not ours
    if existing is not None:
        if existing.want_shards and existing.state != "stopping":
            _merge(state, node, existing, group, profile, at)  # the rest of a replica being rebuilt
            return []
        if existing.state == "stopping" or any(sh.state in ("starting", "loading", "ready") for sh in existing.shards):
            # Two things really run; the one we did not ask for is the stray.
            # (The shards of ours that the agent reports were matched above:
            # `group` holds none of them, so ours keeps serving.)
            return group
        forget(state, existing)  # merely placed: what the fleet runs wins
    rep = Replica(
        id=rid,
        model=first.model,
        profile=first.profile,
        # From the agent, which was told it at the start; "" from one that
        # does not say, which reads as unknown: restarted onto what the catalog says.
        fingerprint=first.fingerprint,
        shards=[],
        placed_at=at,
        reason=f"adopted: running on {node.name} when its agent registered",
        want_shards=max(profile.nodes, 1),
        owner=model.spec.owner,
    )
    state.replicas[rid] = rep
    added(state, rep)
    state.replica_numbers[first.model] = max(state.replica_numbers.get(first.model, 1), replica_number(rid) + 1)
    _merge(state, node, rep, group, profile, at, counted=False)
    tally(state, rep, +1)
    return []


def _merge(
    state: State, node: Node, rep: Replica, group: list[ev.RunningShard], profile: ev.ProfileSpec, at: float,
    counted: bool = True,
) -> None:
    """Add reported shards to a replica being rebuilt, holding what they hold.
    Shards it has already are skipped: an agent that reconnects repeats what
    it runs, and counting those again would complete a replica that is not."""
    have = {sh.id for sh in rep.shards}
    for r in group:
        if r.shard in have:
            continue
        have.add(r.shard)
        sh = Shard(
            id=r.shard,
            node=node.name,
            rank=r.rank,
            gpus=list(r.gpus),
            port=r.port,
            generation=r.generation,
            state=r.state if r.state in ("starting", "loading", "ready") else "starting",
            endpoint=r.endpoint,
            identity=r.identity,
            # What the profile asks for, as a running process does not say;
            # no more than the node has free (a profile edited to ask for
            # more than the node has does not make the node hold more than it has).
            memory_gb=_at_most(profile.memory_gb, add_gb(node.memory_gb, -node.memory_used), node.memory_gb),
            cpu_cores=int(_at_most(profile.cpu_cores, node.cpu_cores - node.cpu_used, node.cpu_cores)),
            # Its draw counts as a placed one's does until its node measures it.
            power_w=shard_watts(profile, node, r.gpus),
        )
        rep.shards.append(sh)
        count_shard(state, rep.owner, sh, +1)
        hold(state, node, sh)
    rep.shards.sort(key=lambda s: s.rank)
    if len(rep.shards) >= rep.want_shards:
        if counted:
            state.tallies[rep.model].assembling -= 1
        rep.want_shards = 0  # whole again
        rep.reason = f"adopted: running on {', '.join(s.node for s in rep.shards)} when the agents registered"
    if counted:
        derive_replica_state(state, rep, at)
    else:
        derive_live_state(rep, at)


def _at_most(asked: float, free: float, total: float) -> float:
    """What a shard is counted as holding: what it asks, capped at what is
    free on a node that says how much it has (total 0: no limit)."""
    return min(asked, max(free, 0)) if total else asked


def _stray_reason(state: State, r: ev.RunningShard, node: str) -> ev.Cause:
    m = state.models.get(r.model)
    if m is None:
        return cause(K.NO_MODEL, model=r.model)
    if r.profile not in m.fingerprints:
        return cause(K.NO_PROFILE, model=r.model, profile=r.profile)
    rep = state.replicas.get(r.replica)
    if rep is not None:
        if any(sh.id == r.shard and sh.node == node for sh in rep.shards):
            return cause(K.GIVEN_UP, shard=r.shard, replica=r.replica)
        # Not "given up here": a second copy of a replica that runs elsewhere
        # (one placed under the same id that had come up when this was reported).
        return cause(K.SECOND_COPY, replica=r.replica, nodes=sorted({sh.node for sh in rep.shards}))
    return cause(K.UNKNOWN_REPLICA, replica=r.replica)
