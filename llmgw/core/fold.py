"""evolve(state, event): the only way the state changes.

Pure: the result depends on the state and the event alone. `evolve` mutates
the state it is given, for speed; callers that need the old one copy it first
(`copy_state`).

Decisions are intents taken on an older state, so they are checked again
here, in log order: an action that no longer holds (GPUs taken meanwhile, a
node lost, a model removed) is voided with a reason instead of applied. That
is what makes "no GPU given twice" true by construction, whoever published.

A malformed event, one from a speaker that may not say it, or one that breaks
a rule of the fold is quarantined by `apply`: kept in the log, counted and
listed in the state, never able to stop the fold.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from . import events as ev
from .catalog import NAME_RE, fingerprint, profile_named, spec_problem
from .ports import held_by_another_program, in_range, node_ports, placement_problem, range_problem
from .quota import add, count, need, over_limit, replica_amount, shard_amount
from .scaling import current_load, note_peak, wants
from .state import (
    KEEP_LAST,
    RUNTIME,
    ApiKey,
    Load,
    Owner,
    TERMINAL_SHARD_STATES,
    Model,
    Node,
    Quarantined,
    Replica,
    Shard,
    State,
    Stray,
    Tally,
    Voided,
    add_gb,
)


# Bump when evolve folds any event differently: snapshots of another version
# are not trusted, and the state is folded again from the whole log.
# 3: host memory and CPU accounted per node and shard, tallies per model.
# 4: restarts, scaling on load, start failures and parking, api keys.
# 5: owners, usage per owner, preemption.
# 6: a shard placed in place of another hands back what it took over when it
#    ends first; the limit check of a restart in place credits its predecessor.
# 7: a shard that stopped while its replica was not being stopped fails the
#    replica, which is replaced (it was "placing" for ever).
# 8: a node's engine port range and the ports other programs hold (NodePorts);
#    a shard failed on one of those is not a start failure of its model.
FOLD_VERSION = 8


class Refused(ValueError):
    """The event breaks a rule of the fold; it is quarantined, not applied."""


# --------------------------------------------------------------------------- entry points


def apply(state: State, seq: int, subject: str, data: bytes) -> State:
    """Fold one raw message from the log, quarantining it if it is bad.

    The hottest function of every replay: `evolve` and `decode` are inlined.
    """
    try:
        event = _decode(data)
        cls = type(event)
        prefix = _PREFIX[cls]
        # The common case inline; check_origin says what is wrong otherwise.
        if prefix is _AGENT:
            node = event.node
            end = 12 + len(node)
            if subject[:end] != prefix + node or subject[end : end + 1] != ".":
                check_origin(subject, event)
        elif not subject.startswith(prefix) or prefix is _GATEWAY:
            check_origin(subject, event)
        elif prefix is _CONTROL:
            state.control_seq = seq
        _HANDLERS[cls](state, event, seq)
    except (msgspec.DecodeError, msgspec.ValidationError, ev.OriginError, Refused) as e:
        quarantine(state, seq, subject, str(e))
        if subject.startswith(_CONTROL):
            state.control_seq = seq
    except Exception as e:  # a bug in a handler must not stop the fold either
        quarantine(state, seq, subject, f"{type(e).__name__}: {e}")
        if subject.startswith(_CONTROL):
            state.control_seq = seq
    state.seq = seq
    return state


def evolve(state: State, event: ev.Event, seq: int = 0) -> State:
    """Apply one decoded event. `seq` is its place in the log (0 in tests that
    do not care), used as the generation of shards a decision places."""
    _HANDLERS[type(event)](state, event, seq)
    return state


def quarantine(state: State, seq: int, subject: str, error: str) -> None:
    state.quarantine_count += 1
    state.quarantined.append(Quarantined(seq=seq, subject=subject, error=error))
    del state.quarantined[:-KEEP_LAST]


_decode = ev._decoder.decode
_PREFIX = ev._PREFIX
check_origin = ev.check_origin
_TERMINAL = frozenset(TERMINAL_SHARD_STATES)
_AGENT = ev._PREFIX[ev.ShardStatus]
_CONTROL = ev._PREFIX[ev.Decided]
_GATEWAY = ev._PREFIX[ev.ModelLoad]
_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(State)


def copy_state(state: State) -> State:
    return _state_decoder.decode(_state_encoder.encode(state))


def encode_state(state: State) -> bytes:
    return _state_encoder.encode(state)


def decode_state(data: bytes) -> State:
    return _state_decoder.decode(data)


# --------------------------------------------------------------------------- operator events


def _model_applied(state: State, e: ev.ModelApplied, seq: int) -> None:
    problem = spec_problem(e.model)
    if problem:
        raise Refused(problem)
    name = e.model.name
    old = state.models.get(name)
    model = state.models[name] = Model(
        spec=e.model,
        fingerprints={p.name: fingerprint(p) for p in e.model.profiles},
        applied_at=e.at,
    )
    if old is not None:
        # A new definition, the same model: what it learned while running stays.
        for field in RUNTIME:
            setattr(model, field, getattr(old, field))
        if old.spec.owner != e.model.owner:
            # Its replicas now count for the new owner (rare: a scan is fine).
            for rep in state.replicas.values():
                if rep.model == name and rep.owner != e.model.owner:
                    amount = replica_amount(rep)
                    count(state, rep.owner, amount, -1)
                    count(state, e.model.owner, amount, +1)
                    rep.owner = e.model.owner
    tally = state.tallies.get(name)
    if tally is not None and tally.live and (old is None or old.fingerprints != model.fingerprints):
        # Which of its replicas the catalog still asks for changed: count
        # again. Rare (a new definition), so a scan of the replicas is fine.
        tally.unwanted = sum(
            1 for r in state.replicas.values() if r.model == name and r.state != "stopping" and _unwanted(state, r)
        )


def _model_removed(state: State, e: ev.ModelRemoved, seq: int) -> None:
    state.models.pop(e.name, None)
    tally = state.tallies.get(e.name)
    if tally is not None:
        tally.unwanted = tally.live  # none of them is asked for any more


def _replicas_restart(state: State, e: ev.ReplicasRestart, seq: int) -> None:
    """Queue restarts. Asked of a replica that is not ready (or gone), or of
    one restarting already, it means nothing: the request is kept in the log,
    the queue unchanged (ctl refuses such requests before publishing)."""
    for rid in e.replicas:
        rep = state.replicas.get(rid)
        model = state.models.get(rep.model) if rep is not None else None
        if rep is None or model is None or rep.state != "ready" or rep.restart in ("replacing", "in place"):
            continue
        if rep.restart.startswith("refused"):
            rep.restart = ""
        rep.restart_in_place = e.in_place
        if rid not in model.restart_queue:
            model.restart_queue.append(rid)
        model.restart_surge, model.restart_unavailable = e.max_surge, e.max_unavailable


def _model_retry(state: State, e: ev.ModelRetry, seq: int) -> None:
    model = state.models.get(e.name)
    if model is None:
        raise Refused(f"there is no model {e.name} to retry")
    model.parked = ""
    model.start_failures = 0


def _owner_applied(state: State, e: ev.OwnerApplied, seq: int) -> None:
    parts = e.name.split("/")
    if not e.name or not all(NAME_RE.match(p) for p in parts):
        raise Refused(f"owner {e.name!r}: a path of names (letters, digits, _ and -) joined by /")
    state.owners[e.name] = Owner(guarantee=e.guarantee, limit=e.limit)


def _owner_removed(state: State, e: ev.OwnerRemoved, seq: int) -> None:
    state.owners.pop(e.name, None)


def _api_key_applied(state: State, e: ev.ApiKeyApplied, seq: int) -> None:
    if len(e.key_sha256) != 64:
        raise Refused(f"api key {e.name}: key_sha256 must be 64 hex digits")
    state.api_keys[e.name] = ApiKey(
        owner=e.owner,
        key_sha256=e.key_sha256,
        requests_per_minute=e.requests_per_minute,
        tokens_per_minute=e.tokens_per_minute,
    )


def _api_key_removed(state: State, e: ev.ApiKeyRemoved, seq: int) -> None:
    state.api_keys.pop(e.name, None)


# --------------------------------------------------------------------------- gateway events


def _model_load(state: State, e: ev.ModelLoad, seq: int) -> None:
    """A gateway's load on a model. What it asks for is noted with the
    event's time, so the scale-down delay is measured in the log's time."""
    model = state.models.get(e.model)
    if model is None:
        return  # a model removed meanwhile, or asked for by a typo: nothing to scale
    model.load[e.gateway] = Load(in_flight=e.in_flight, queued=e.queued, at=e.at)
    busy = e.in_flight + e.queued
    last = max(e.last_used, e.at if busy else 0.0)
    if last > model.last_used:
        model.last_used = last
    if model.spec.target_load > 0:
        note_peak(model, e.at, wants(model.spec, current_load(model, e.at)))


# --------------------------------------------------------------------------- agent events


def _node_registered(state: State, e: ev.NodeRegistered, seq: int) -> None:
    """A node (re)joins, and says everything it runs.

    The fleet is authoritative about what runs: a shard we believed ran there
    and that the agent did not mention has failed (seen for real: an engine
    died while its agent lived, and the replica stayed "ready" on a dead port
    for as long as anyone watched). A registration follows a fresh connection,
    so nothing dispatched before it can be legitimately starting unreported.
    """
    if not NAME_RE.match(e.node):
        raise Refused(f"node name {e.node!r} must be letters, digits, _ and - (at most 64)")
    if len({g.index for g in e.gpus}) != len(e.gpus):
        raise Refused(f"node {e.node} reports two GPUs with the same index")
    problem = range_problem(e.port_first, e.port_last)
    if problem:
        raise Refused(f"node {e.node}: {problem}")
    node = Node(
        name=e.node,
        gpus=list(e.gpus),
        memory_gb=e.memory_gb,
        cpu_cores=e.cpu_cores,
        labels=dict(e.labels),
        agent=e.agent,
        registered_at=e.at,
        port_first=e.port_first,
        port_last=e.port_last,
    )
    node.taken = in_range(node, e.ports_taken)
    state.nodes[e.node] = node
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
                _hold(node, sh)
                if sh.memory_gb:
                    node.memory_used = add_gb(node.memory_used, sh.memory_gb)
                node.cpu_used += sh.cpu_cores
                if sh.state != "stopping" and r.state in ("starting", "loading", "ready"):
                    sh.state = r.state
                    sh.endpoint = r.endpoint or sh.endpoint
            elif r is None and sh.state == "placing" and any(a in ours for a in sh.after):
                # Placed in place of a shard the agent still runs (a restart
                # in place, its old engine draining): rightly not started yet,
                # so not failed; it keeps what it took over. (The old one's
                # replica was placed first, so it was matched above.)
                _hold(node, sh)
                if sh.memory_gb:
                    node.memory_used = add_gb(node.memory_used, sh.memory_gb)
                node.cpu_used += sh.cpu_cores
                continue
            else:
                count(state, rep.owner, shard_amount(sh), -1)
                sh.state = "failed"
                sh.reason = "the agent reports it is not running"
            touched = True
        if touched:
            _derive_replica_state(state, rep, e.at)
    # What else runs there is adopted when the catalog still asks for it, or
    # else a stray: it holds its GPUs and port until it exits.
    unknown: dict[str, list[ev.RunningShard]] = {}
    for r in e.running:
        if r.shard not in ours:
            unknown.setdefault(r.replica, []).append(r)
    for rid, group in unknown.items():
        for r in _adopt(state, node, rid, group, e.at):
            why = _stray_reason(state, r, node.name)
            node.strays[r.shard] = Stray(generation=r.generation, gpus=list(r.gpus), port=r.port, reason=why)
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
    - A reported replica replaces one we merely placed under the same id; if
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
        _forget(state, existing)  # merely placed: what the fleet runs wins
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
    state.replica_numbers[first.model] = max(state.replica_numbers.get(first.model, 1), replica_number(rid) + 1)
    _merge(state, node, rep, group, profile, at, counted=False)
    _tally(state, rep, +1)
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
            # What the profile asks for, as a running process does not say;
            # no more than the node has free (a profile edited to ask for
            # more than the node has does not make the node hold more than it has).
            memory_gb=_at_most(profile.memory_gb, add_gb(node.memory_gb, -node.memory_used), node.memory_gb),
            cpu_cores=int(_at_most(profile.cpu_cores, node.cpu_cores - node.cpu_used, node.cpu_cores)),
        )
        rep.shards.append(sh)
        count(state, rep.owner, shard_amount(sh), +1)
        _hold(node, sh)
        if sh.memory_gb:
            node.memory_used = add_gb(node.memory_used, sh.memory_gb)
        node.cpu_used += sh.cpu_cores
    rep.shards.sort(key=lambda s: s.rank)
    if len(rep.shards) >= rep.want_shards:
        if counted:
            state.tallies[rep.model].assembling -= 1
        rep.want_shards = 0  # whole again
        rep.reason = f"adopted: running on {', '.join(s.node for s in rep.shards)} when the agents registered"
    if counted:
        _derive_replica_state(state, rep, at)
    else:
        _derive_live_state(rep, at)


def _at_most(asked: float, free: float, total: float) -> float:
    """What a shard is counted as holding: what it asks, capped at what is
    free on a node that says how much it has (total 0: no limit)."""
    return min(asked, max(free, 0)) if total else asked


def _forget(state: State, rep: Replica) -> None:
    """Drop a replica from the state, freeing what its shards hold."""
    for sh in rep.shards:
        node = state.nodes.get(sh.node)
        if node is None or sh.state in _TERMINAL:
            continue
        _release_ids(node, sh.id, sh.gpus, sh.port)
        if sh.memory_gb:
            node.memory_used = add_gb(node.memory_used, -sh.memory_gb)
        node.cpu_used -= sh.cpu_cores
        count(state, rep.owner, shard_amount(sh), -1)
    _tally(state, rep, -1)
    del state.replicas[rep.id]


def _tally(state: State, rep: Replica, sign: int) -> None:
    """Count a replica in (or out of) its model's tally, as it stands."""
    t = state.tallies.get(rep.model)
    if t is None:
        t = state.tallies[rep.model] = Tally()
    t.live += sign
    if rep.state == "failed":
        t.failed += sign
    if _unwanted(state, rep):
        t.unwanted += sign
    if rep.restart in _RETIRING:
        t.retiring += sign
    if rep.want_shards:
        t.assembling += sign


def _stray_reason(state: State, r: ev.RunningShard, node: str) -> str:
    m = state.models.get(r.model)
    if m is None:
        return f"no model {r.model} in the catalog claims it"
    if r.profile not in m.fingerprints:
        return f"model {r.model} has no profile {r.profile} any more"
    rep = state.replicas.get(r.replica)
    if rep is not None:
        if any(sh.id == r.shard and sh.node == node for sh in rep.shards):
            return (
                f"shard {r.shard} of {r.replica} was given up here (failed or lost) and its replica went on without it"
            )
        # Not "given up here": a second copy of a replica that runs elsewhere
        # (one placed under the same id that had come up when this was reported).
        where = ", ".join(sorted({sh.node for sh in rep.shards})) or "another node"
        return f"replica {r.replica} runs on {where} already: this copy of it is not the one the control plane placed"
    return f"replica {r.replica} is not one the control plane knows"


def _shard_status(state: State, e: ev.ShardStatus, seq: int) -> None:
    # Nearly every event of a long log is one of these: written for speed.
    st = e.state
    terminal = st in _TERMINAL
    if terminal:
        node = state.nodes.get(e.node)
        if node is not None and node.strays:
            # A stray exiting frees what it held, whether or not its replica
            # is still known (a shard given up on a lost node, reported when
            # the node came back, is a stray of a replica that lives on).
            stray = node.strays.get(e.shard)
            if stray is not None and stray.generation == e.generation:
                del node.strays[e.shard]
                _release_ids(node, e.shard, stray.gpus, stray.port)
                return
    rep = state.replicas.get(e.replica)
    if rep is None:
        return  # a replica long gone: nothing to learn
    sh = rep.shards[0]
    if sh.id != e.shard:
        for sh in rep.shards:
            if sh.id == e.shard:
                break
        else:
            return
    if sh.node != e.node:
        node = state.nodes.get(e.node)
        if node is not None and e.shard in node.strays:
            # About the stray of that id its agent runs (a copy of a replica
            # that runs elsewhere): nothing to learn until it exits, and no
            # reason to quarantine what its rightful speaker said.
            return
        raise Refused(f"shard {sh.id} runs on {sh.node}, not on {e.node}")
    current = sh.state
    if sh.generation != e.generation or current in _TERMINAL:
        return  # a late report about an older incarnation: nothing to learn
    if terminal:
        if st == "failed" and not rep.ready_at and rep.state not in ("stopping", "failed"):
            if not held_by_another_program(state.nodes.get(e.node), sh.port):
                _failed_to_start(state, rep, e)
        sh.state = st
        sh.reason = e.reason
        node = state.nodes.get(e.node)
        if node is not None:
            sid, used = sh.id, node.used
            for g in sh.gpus:
                if used.get(g) == sid:
                    del used[g]
            if sh.port and node.ports.get(sh.port) == sid:
                del node.ports[sh.port]
            # A live shard on a ready node always holds what it took (a lost
            # node's shards failed with it; a registration holds afresh).
            if sh.memory_gb:
                node.memory_used = add_gb(node.memory_used, -sh.memory_gb)
            node.cpu_used -= sh.cpu_cores
        count(state, rep.owner, shard_amount(sh), -1)
        if sh.after and node is not None:
            _hand_back(state, node, sh)
    elif current != "stopping":
        sh.state = st
        sh.reason = e.reason
        if e.endpoint:
            sh.endpoint = e.endpoint
        if len(rep.shards) == 1 and rep.state != "stopping" and not rep.want_shards:
            # One shard, not failed: the replica is where its shard is.
            if st == "ready" and rep.state != "ready":
                rep.ready_at = e.at
                _started(state, rep)
            rep.state = st
            return
    _derive_replica_state(state, rep, e.at)


# --------------------------------------------------------------------------- control events


def _decided(state: State, e: ev.Decided, seq: int) -> None:
    for action in e.actions:
        why_not = _ACTIONS[type(action)](state, action, e, seq)
        if why_not:
            state.voided_count += 1
            state.voided.append(Voided(seq=seq, action=describe_action(action), reason=why_not))
            del state.voided[:-KEEP_LAST]


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
    # In place: the shards of the replica it replaces (stopped in the same
    # pass) hand over what they hold on their nodes; the new ones start once
    # they have exited.
    handed: dict[str, Shard] = {}
    if a.replaces:
        old = state.replicas.get(a.replaces)
        if old is None or old.state != "stopping" or old.model != model_name:
            return f"replica {a.replaces} it replaces is not being stopped"
        handed = {sh.id: sh for sh in old.shards if sh.state not in _TERMINAL}
    if state.owners and profile is not None:
        # What the replica it replaces holds is the replacement's to take,
        # limits included, as decide counted it (decide._in_place): without
        # this credit a restart in place of an owner at its limit was voided
        # here after its predecessor's stop had been applied.
        credit: dict[str, ev.Resources] = {}
        if a.replaces:
            add(credit, old.owner, replica_amount(old), -1)
        why = over_limit(state, model.spec.owner, need(profile), credit)
        if why:
            return why
    nodes = state.nodes
    for s in placements:
        node = nodes.get(s.node)
        if node is None or node.state != "ready":
            return f"node {s.node} is not ready"
        memory_used, cpu_used = node.memory_used, node.cpu_used
        if handed:
            for sh in handed.values():
                if sh.node == s.node:
                    memory_used, cpu_used = add_gb(memory_used, -sh.memory_gb), cpu_used - sh.cpu_cores
        # A node that does not say its memory or cores (0) is not limited by them.
        if memory and node.memory_gb and add_gb(memory_used, memory) > node.memory_gb:
            return (
                f"host memory on {s.node}: {memory:g} GB more would make {add_gb(memory_used, memory):g} "
                f"of {node.memory_gb:g} GB"
            )
        if cores and node.cpu_cores and cpu_used + cores > node.cpu_cores:
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
    shards = []
    for s in placements:
        sid, port, gpus_taken = s.shard, s.port, s.gpus
        shards.append(
            Shard(
                id=sid,
                node=s.node,
                rank=s.rank,
                gpus=gpus_taken,
                port=port,
                generation=seq,
                memory_gb=memory,
                cpu_cores=cores,
            )
        )
        node = nodes[s.node]
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
                    count(state, old.owner, shard_amount(old_sh), -1)
                    old_sh.memory_gb, old_sh.cpu_cores = 0.0, 0
                    old_sh.gpus = [g for g in old_sh.gpus if g not in gpus_taken]
                    count(state, old.owner, shard_amount(old_sh), +1)
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
    )
    if model.spec.owner:
        for sh in shards:
            count(state, model.spec.owner, shard_amount(sh), +1)
    state.replica_numbers[model_name] = number + 1
    tally = state.tallies.get(model_name)
    if tally is None:
        tally = state.tallies[model_name] = Tally()
    tally.live += 1  # placing, on the profile the catalog has: neither failed nor unwanted
    model.waiting = ""
    return ""


def _stop(state: State, a: ev.StopReplica, e: ev.Decided, seq: int) -> str:
    rep = state.replicas.get(a.replica)
    if rep is None:
        return f"replica {a.replica} is gone"
    if rep.state == "stopping":
        return f"replica {a.replica} is stopping already"
    tally = state.tallies[rep.model]
    tally.live -= 1
    if rep.state == "failed":
        tally.failed -= 1
    if _unwanted(state, rep):
        tally.unwanted -= 1
    if rep.restart in _RETIRING:
        tally.retiring -= 1
    if rep.want_shards:
        tally.assembling -= 1
    model = state.models.get(rep.model)
    if model is not None and rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    running = False
    for sh in rep.shards:
        if sh.state not in _TERMINAL:
            sh.state = "stopping"
            running = True
    if not running:
        # Nothing of it runs (a failed replica, the usual case): gone at once.
        del state.replicas[rep.id]
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
    if rep.restart in _RETIRING:
        return f"replica {a.replica} is restarting already"
    model = state.models.get(rep.model)
    if model is None:
        return f"model {rep.model} is no longer in the catalog"
    if rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    rep.restart = "in place" if a.in_place else "replacing"
    rep.retiring_at = e.at
    state.tallies[rep.model].retiring += 1
    return ""


def _refuse_restart(state: State, a: ev.RefuseRestart, e: ev.Decided, seq: int) -> str:
    rep = state.replicas.get(a.replica)
    if rep is None or rep.state == "stopping":
        return f"replica {a.replica} is gone or stopping"
    if rep.restart in _RETIRING:
        state.tallies[rep.model].retiring -= 1
    model = state.models.get(rep.model)
    if model is not None and rep.id in model.restart_queue:
        model.restart_queue.remove(rep.id)
    rep.restart = f"refused: {a.reason}"
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
    return ""


def _stop_stray(state: State, a: ev.StopStray, e: ev.Decided, seq: int) -> str:
    node = state.nodes.get(a.node)
    stray = node.strays.get(a.shard) if node is not None else None
    if stray is None or stray.generation != a.generation:
        return f"stray {a.shard} is no longer on {a.node}"
    if stray.stopping:
        return f"stray {a.shard} is stopping already"
    stray.stopping = True
    stray.reason = a.reason
    return ""


def _node_lost(state: State, e: ev.NodeLost, seq: int) -> None:
    node = state.nodes.get(e.node)
    if node is None or node.state == "lost":
        return
    node.state = "lost"
    node.reason = e.reason
    node.used.clear()
    node.ports.clear()
    node.strays.clear()
    node.taken = []
    node.memory_used = 0.0
    node.cpu_used = 0
    for rep in list(state.replicas.values()):
        touched = False
        for sh in rep.shards:
            if sh.node == e.node and sh.state not in TERMINAL_SHARD_STATES:
                count(state, rep.owner, shard_amount(sh), -1)
                sh.state = "failed"
                sh.reason = f"node {e.node} lost: {e.reason}"
                touched = True
        if touched:
            _derive_replica_state(state, rep, e.at)


# --------------------------------------------------------------------------- helpers


def _hand_back(state: State, node: Node, sh: Shard) -> None:
    """A shard placed in place of another (a restart in place) ended before
    that one exited (stopped while it waited, failed to start): what it took
    over goes back to the one still running there, until it exits. Freed
    instead, the GPUs and port of an engine still draining were handed to the
    next placement, which then failed to bind or to allocate. What the new
    one held beyond what it took over goes back too: held a little longer,
    never given twice."""
    for old_id in sh.after:
        old = state.replicas.get(old_id.rpartition(".")[0])
        old_sh = next((o for o in old.shards if o.id == old_id), None) if old is not None else None
        if old_sh is None or old_sh.node != sh.node or old_sh.state in _TERMINAL:
            continue
        gpus = [g for g in sh.gpus if g not in node.used and g not in old_sh.gpus]
        for g in gpus:
            node.used[g] = old_id
        if old_sh.port and old_sh.port not in node.ports:
            node.ports[old_sh.port] = old_id
        back = Shard(id=old_id, node=sh.node, rank=0, gpus=gpus, port=0, generation=0,
                     memory_gb=sh.memory_gb, cpu_cores=sh.cpu_cores)
        old_sh.gpus = sorted(old_sh.gpus + gpus)
        old_sh.memory_gb = add_gb(old_sh.memory_gb, sh.memory_gb)
        old_sh.cpu_cores += sh.cpu_cores
        if sh.memory_gb:
            node.memory_used = add_gb(node.memory_used, sh.memory_gb)
        node.cpu_used += sh.cpu_cores
        count(state, old.owner, shard_amount(back), +1)
        return


def _hold(node: Node, sh: Shard) -> None:
    for g in sh.gpus:
        node.used[g] = sh.id
    if sh.port:
        node.ports[sh.port] = sh.id


def _release_ids(node: Node, holder: str, gpus: list[int], port: int) -> None:
    for g in gpus:
        if node.used.get(g) == holder:
            del node.used[g]
    if port and node.ports.get(port) == holder:
        del node.ports[port]


_RETIRING = ("replacing", "in place")


def _unwanted(state: State, rep: Replica) -> bool:
    """The catalog no longer asks for this replica: its model is gone or its profile changed."""
    model = state.models.get(rep.model)
    return model is None or model.fingerprints.get(rep.profile) != rep.fingerprint


def _derive_replica_state(state: State, rep: Replica, at: float) -> None:
    """A replica's state follows from its shards'; one that was stopping and
    whose shards have all exited is forgotten (the log keeps its history)."""
    shards = rep.shards
    was = rep.state
    if was == "stopping":
        for s in shards:
            if s.state not in TERMINAL_SHARD_STATES:
                return
        del state.replicas[rep.id]
        return
    _derive_live_state(rep, at)
    if (rep.state == "failed") != (was == "failed"):
        state.tallies[rep.model].failed += 1 if rep.state == "failed" else -1
    if rep.state == "ready" and was != "ready":
        _started(state, rep)


def _failed_to_start(state: State, rep: Replica, e: ev.ShardStatus) -> None:
    """A replica failed before it was ever ready: one more failure in a row
    for its model, which backs off and, after enough, is parked (decide)."""
    model = state.models.get(rep.model)
    if model is not None:
        model.start_failures += 1
        model.last_failure = f"shard {e.shard} on {e.node}: {e.reason or 'no reason given'}"
        model.failed_at = e.at


def _started(state: State, rep: Replica) -> None:
    model = state.models.get(rep.model)
    if model is not None and model.start_failures:
        model.start_failures = 0


def _derive_live_state(rep: Replica, at: float) -> None:
    """The state of a replica that is not stopping, from its shards'."""
    shards = rep.shards
    # One pass over the shards (most replicas have one): the first failure
    # wins, else the least advanced shard says where the replica is.
    failed = None
    ready = loading = starting = 0
    for s in shards:
        st = s.state
        if st == "ready":
            ready += 1
        elif st == "failed" or st == "stopped":
            # A shard that ended though its replica was not being stopped
            # (its agent stopped it: Ctrl-C of `llmgw up`) serves no more.
            # Read as "placing", as it once was, the replica counted as live
            # and nothing ever replaced it: a rerun of `llmgw up` never served.
            failed = s
            break
        elif st == "loading":
            loading += 1
        elif st == "starting":
            starting += 1
    if failed is not None:
        rep.state = "failed"
        ended = "failed" if failed.state == "failed" else "stopped unasked"
        rep.reason = f"shard {failed.id} on {failed.node} {ended}: {failed.reason or 'no reason given'}"
    elif rep.want_shards:  # being rebuilt from what agents report: not whole yet
        rep.state = "starting"
    elif ready == len(shards):
        if rep.state != "ready":
            rep.ready_at = at
        rep.state = "ready"
    elif loading:
        rep.state = "loading"
    elif starting:
        rep.state = "starting"
    else:
        rep.state = "placing"


def replica_number(replica_id: str) -> int:
    _, _, n = replica_id.rpartition("-")
    return int(n) if n.isdigit() else 0


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


_HANDLERS: dict[type, Callable[[State, ev.Event, int], None]] = {
    ev.ModelApplied: _model_applied,
    ev.ModelRemoved: _model_removed,
    ev.NodeRegistered: _node_registered,
    ev.ShardStatus: _shard_status,
    ev.Decided: _decided,
    ev.NodeLost: _node_lost,
    ev.ReplicasRestart: _replicas_restart,
    ev.ModelRetry: _model_retry,
    ev.ApiKeyApplied: _api_key_applied,
    ev.ApiKeyRemoved: _api_key_removed,
    ev.ModelLoad: _model_load,
    ev.OwnerApplied: _owner_applied,
    ev.OwnerRemoved: _owner_removed,
    ev.NodePorts: node_ports,
}

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
