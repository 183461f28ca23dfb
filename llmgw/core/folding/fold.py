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

from ..rules import admission, adoption
from . import decisions, labels, muting
from .refused import Refused
from . import facility_facts
from ..contract import events as ev
from ..contract import limits
from ..contract.catalog import NAME_RE, fingerprint, spec_problem
from ..contract.policy import problem as policy_problem
from .nodeindex import touch
from ..scheduling.ports import held_by_another_program, in_range, node_ports, range_problem
from ..rules.quota import count, count_shard, replica_amount
from .replicas import RETIRING, TERMINAL, derive_replica_state, hand_back, release_ids, started, unwanted
from ..rules.scaling import current_load, note_peak, wants
from .state import RUNTIME, TERMINAL_SHARD_STATES, ApiKey, Load, Model, Node, Owner, Quarantined, Replica, State, add_gb


# Bump when evolve folds any event differently: snapshots of another version
# are not trusted, and the state is folded again from the whole log.
# 3: host memory and CPU accounted per node and shard, tallies per model.
# 4: restarts, scaling on load, start failures and parking, api keys.
# 5: owners, usage per owner, preemption.
# 6: a shard placed in place of another hands back what it took over when it
#    ends first; the limit check of a restart in place credits its predecessor.
# 7: a shard that stopped while its replica was not being stopped fails the
#    replica, which is replaced (it was "placing" for ever).
# 8: a shard keeps the identity its engine was given (ShardStatus.identity).
# 9: a node's engine port range and the ports other programs hold (NodePorts);
#    a shard failed on one of those is not a start failure of its model.
# 10: who leads (LeaderElected: state.term, leader, leader_since).
# 11: the facility (facility_facts.py): location labels, holds, power caps and
#     measured draw; a placement in a held domain or past a cap is voided.
# 12: the policy (PolicyApplied: state.policy), which the rules read.
# 13: a placement whose shards do not take what its profile asks (a GPU
#     count, a GPU twice, a shard count) is voided.
# 14: each domain's counted draw is kept by the fold (state.domain_draw).
# 15: admission (admission.py): a node's own pool is a claim, counted only
#     when an operator set it (or the policy is open); a node's report of a
#     replica placed elsewhere is a stray; a start deadline (state.unstarted);
#     under `admission: manual`, a node not admitted (NodeAdmitted) is cordoned.
# 16: muted nodes (muting.py): NodeMuted loses the node and quarantines its
#     agent's events until NodeUnmuted.
# 17: a model's waiting kind (Model.waiting_kind, waits.py) from ModelWaiting.kind
#     (or, recorded before it, its words); a node's `simulated` (NodeRegistered),
#     on which a real engine's profile is not placed (fit.SIMULATED).
# 18: ModelLoad.routes summed into Model.routed (issue 30: where the
#     gateways sent a model's requests, and why).
# 19: a stray keeps why it is one as data (Stray.cause, reasons.py), which
#     its StopStray carries (issue 33: reasons as data).
# 20: the fold checks a placement's memory and cores with placement's own
#     checks (fit.memory_short, fit.cpu_short): a CPU-only profile on a
#     node that reports no cores is voided, as placement refuses it (issue 33).
# 21: an owner's and a key's gateway limits (requests and tokens per minute,
#     tokens and spend per day and month: issue 32) kept in Owner and ApiKey.
FOLD_VERSION = 21


# --------------------------------------------------------------------------- entry points


def apply(state: State, seq: int, subject: str, data: bytes) -> State:
    """Fold one raw message from the log, quarantining it if it is bad.

    The hottest function of every replay: `evolve` and `decode` are inlined.
    """
    if state.muted and subject.startswith(_AGENT):
        # A muted node's messages are not even decoded (muting.py): its
        # flood costs a lookup each. By the subject, the part NATS checks.
        why = state.muted.get(subject[12:].partition(".")[0])
        if why is not None:
            quarantine(state, seq, subject, why)
            state.seq = seq
            return state
    try:
        event = _decode(data)
        cls = type(event)
        prefix = _PREFIX[cls]
        # The common case inline; check_origin says what is wrong otherwise.
        if prefix is _AGENT:
            if _agent_subjects.get(subject) != event.node:
                _checked(_agent_subjects, subject, event, event.node)
        elif prefix is _GATEWAY:
            if _gateway_subjects.get(subject) != event.gateway:
                _checked(_gateway_subjects, subject, event, event.gateway)
        elif not subject.startswith(prefix):
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


# The speaker (node, gateway) each subject was found to speak for, per
# origin: the subject of an agent's or a gateway's event is checked against
# the event once, then looked up. Sliced and concatenated at every event, the
# check was a tenth of folding the realistic log (benchmarks/replay.py
# --mixes realistic, where nearly every event is a gateway's model.load);
# a lookup is a third of that. Only what check_origin let through is kept,
# so the lookup says what the check would; bounded by clearing it (a fleet
# has a few subjects per node: limits.LIMITS.subjects_kept).
_agent_subjects: dict[str, str] = {}
_gateway_subjects: dict[str, str] = {}


def _checked(seen: dict[str, str], subject: str, event: ev.Event, speaker: str) -> None:
    check_origin(subject, event)  # raises OriginError when the speaker may not say it
    if len(seen) >= limits.LIMITS.subjects_kept:
        seen.clear()
    seen[subject] = speaker


def evolve(state: State, event: ev.Event, seq: int = 0) -> State:
    """Apply one decoded event. `seq` is its place in the log (0 in tests that
    do not care), used as the generation of shards a decision places."""
    _HANDLERS[type(event)](state, event, seq)
    return state


def quarantine(state: State, seq: int, subject: str, error: str) -> None:
    state.quarantine_count += 1
    state.quarantined.append(Quarantined(seq=seq, subject=subject, error=error))
    del state.quarantined[: -limits.LIMITS.kept_verbatim]


_decode = ev._decoder.decode
_PREFIX = ev._PREFIX
check_origin = ev.check_origin
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
            1 for r in state.replicas.values() if r.model == name and r.state != "stopping" and unwanted(state, r)
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
        if rep is None or model is None or rep.state != "ready" or rep.restart in RETIRING:
            continue
        if rep.restart == "refused":
            rep.restart, rep.restart_reason = "", ""
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
    model.late_nodes = []


def _owner_applied(state: State, e: ev.OwnerApplied, seq: int) -> None:
    parts = e.name.split("/")
    if not e.name or not all(NAME_RE.match(p) for p in parts):
        raise Refused(f"owner {e.name!r}: a path of names (letters, digits, _ and -) joined by /")
    state.owners[e.name] = Owner(
        guarantee=e.guarantee, limit=e.limit, requests_per_minute=e.requests_per_minute,
        tokens_per_minute=e.tokens_per_minute, tokens_per_day=e.tokens_per_day, tokens_per_month=e.tokens_per_month,
        spend_per_day=e.spend_per_day, spend_per_month=e.spend_per_month,
    )  # fmt: skip


def _owner_removed(state: State, e: ev.OwnerRemoved, seq: int) -> None:
    state.owners.pop(e.name, None)


def _policy_applied(state: State, e: ev.PolicyApplied, seq: int) -> None:
    problem = policy_problem(e.policy)
    if problem:
        raise Refused(problem)
    before = state.policy.admission
    state.policy = e.policy
    if e.policy.admission != before:
        admission.settle_all(state)


def _api_key_applied(state: State, e: ev.ApiKeyApplied, seq: int) -> None:
    if len(e.key_sha256) != 64:
        raise Refused(f"api key {e.name}: key_sha256 must be 64 hex digits")
    state.api_keys[e.name] = ApiKey(
        owner=e.owner,
        key_sha256=e.key_sha256,
        requests_per_minute=e.requests_per_minute,
        tokens_per_minute=e.tokens_per_minute,
        tokens_per_day=e.tokens_per_day,
        tokens_per_month=e.tokens_per_month,
        spend_per_day=e.spend_per_day,
        spend_per_month=e.spend_per_month,
    )


def _api_key_removed(state: State, e: ev.ApiKeyRemoved, seq: int) -> None:
    state.api_keys.pop(e.name, None)


def _credential_revoked(state: State, e: ev.CredentialRevoked, seq: int) -> None:
    # The server refuses the credential; what that means for the fleet is
    # decided (liveness.lost_nodes), as for a node gone quiet.
    if e.role == "agent":
        state.revoked_nodes[e.name] = seq


# --------------------------------------------------------------------------- gateway events


def _model_load(state: State, e: ev.ModelLoad, seq: int) -> None:
    """A gateway's load on a model. What it asks for is noted with the
    event's time, so the scale-down delay is measured in the log's time."""
    model = state.models.get(e.model)
    if model is None:
        return  # a model removed meanwhile, or asked for by a typo: nothing to scale
    # (Most events of a real day's log are these: kept in place, not made anew.)
    at, in_flight, queued = e.at, e.in_flight, e.queued
    load = model.load.get(e.gateway)
    if load is None:
        model.load[e.gateway] = Load(in_flight=in_flight, queued=queued, at=at)
    else:
        load.in_flight, load.queued, load.at = in_flight, queued, at
    last = e.last_used
    if (in_flight or queued) and at > last:
        last = at
    if last > model.last_used:
        model.last_used = last
    if e.routes:
        _routed(state, model, e.routes)
    spec = model.spec
    if spec.target_load > 0:
        note_peak(model, at, wants(spec, current_load(model, at)))


def _routed(state: State, model, routes) -> None:
    """ModelLoad.routes summed per replica of the state (a replica unknown
    or gone is not counted, and its figures are dropped)."""
    routed = model.routed
    for rc in routes:
        if rc.replica not in state.replicas or rc.reason not in ev.ROUTE_REASONS:
            continue
        row = routed.get(rc.replica)
        if row is None:
            for gone in [r for r in routed if r not in state.replicas]:
                del routed[gone]
            row = routed[rc.replica] = {}
        for key, n in ((rc.reason, rc.requests), ("prompt_tokens", rc.prompt_tokens), ("cached_tokens", rc.cached_tokens), ("hits", rc.hits)):
            if n:
                row[key] = row.get(key, 0) + n


# --------------------------------------------------------------------------- agent events


def _node_registered(state: State, e: ev.NodeRegistered, seq: int) -> None:
    """A node (re)joins, and says everything it runs: what the log believed
    ran there is matched against that (adoption.py)."""
    if not NAME_RE.match(e.node):
        raise Refused(f"node name {e.node!r} must be letters, digits, _ and - (at most 64)")
    if len({g.index for g in e.gpus}) != len(e.gpus):
        raise Refused(f"node {e.node} reports two GPUs with the same index")
    problem = range_problem(e.port_first, e.port_last)
    if problem:
        raise Refused(f"node {e.node}: {problem}")
    old = state.nodes.get(e.node)
    name = e.node
    node = Node(
        name=name,
        gpus=list(e.gpus),
        memory_gb=e.memory_gb,
        cpu_cores=e.cpu_cores,
        labels=dict(e.labels),
        agent=e.agent,
        registered_at=e.at,
        port_first=e.port_first,
        port_last=e.port_last,
        simulated=e.simulated,
        operator_labels=dict(state.node_labels.get(e.node, {})),
    )
    node.taken = in_range(node, e.ports_taken)
    admission.take_claims(node)  # its own pool is a claim; the operator's counts
    admission.settle(state, node)
    if old is not None:  # what it counted for its domains goes with it: its shards are held afresh
        facility_facts.forget_draw(state, old)
    state.nodes[name] = node
    facility_facts.relocate(state, name)
    # Registered after its credential was revoked: with a new one (the server
    # refuses the old since before the revocation was in the log).
    state.revoked_nodes.pop(e.node, None)
    adoption.take_reports(state, node, e)
    touch(state, e.node)


def _shard_status(state: State, e: ev.ShardStatus, seq: int) -> None:
    # Nearly every event of a long log is one of these: written for speed.
    st = e.state
    terminal = st in TERMINAL
    if terminal:
        node = state.nodes.get(e.node)
        if node is not None and node.strays:
            # A stray exiting frees what it held, whether or not its replica
            # is still known (a shard given up on a lost node, reported when
            # the node came back, is a stray of a replica that lives on).
            stray = node.strays.get(e.shard)
            if stray is not None and stray.generation == e.generation:
                del node.strays[e.shard]
                release_ids(node, e.shard, stray.gpus, stray.port)
                touch(state, e.node)
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
    if sh.generation != e.generation or current in TERMINAL:
        return  # a late report about an older incarnation: nothing to learn
    if terminal:
        if st == "failed" and not rep.ready_at and rep.state not in ("stopping", "failed"):
            if not held_by_another_program(state.nodes.get(e.node), sh.port):
                _failed_to_start(state, rep, e)
        sh.state = st
        sh.reason = e.reason
        node = state.nodes.get(e.node)
        if node is not None:
            touch(state, e.node)
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
            facility_facts.uncount(state, node, sid)
        count_shard(state, rep.owner, sh, -1)
        if sh.after and node is not None:
            hand_back(state, node, sh)
    elif current != "stopping":
        sh.state = st
        sh.reason = e.reason
        if e.endpoint:
            sh.endpoint = e.endpoint
            sh.identity = e.identity
        if len(rep.shards) == 1 and rep.state != "stopping" and not rep.want_shards:
            # One shard, not failed: the replica is where its shard is.
            if st == "ready" and rep.state != "ready":
                rep.ready_at = e.at
                started(state, rep)
            rep.state = st
            return
    derive_replica_state(state, rep, e.at)


def _node_lost(state: State, e: ev.NodeLost, seq: int) -> None:
    node = state.nodes.get(e.node)
    if node is None or node.state == "lost":
        return
    node.state = "lost"
    node.reason = e.reason
    touch(state, e.node)
    node.used.clear()
    node.ports.clear()
    node.strays.clear()
    node.taken = []
    node.memory_used = 0.0
    node.cpu_used = 0
    # Its shards are gone from the books, and what it last measured is stale.
    facility_facts.forget_draw(state, node)
    for rep in list(state.replicas.values()):
        touched = False
        for sh in rep.shards:
            if sh.node == e.node and sh.state not in TERMINAL_SHARD_STATES:
                count_shard(state, rep.owner, sh, -1)
                sh.state = "failed"
                sh.reason = f"node {e.node} lost: {e.reason}"
                touched = True
        if touched:
            derive_replica_state(state, rep, e.at)


def _leader_elected(state: State, e: ev.LeaderElected, seq: int) -> None:
    if e.term <= state.term:
        raise Refused(f"term {e.term} of {e.leader} is not after term {state.term} of {state.leader}")
    state.term, state.leader, state.leader_since = e.term, e.leader, e.at


# --------------------------------------------------------------------------- helpers


def _failed_to_start(state: State, rep: Replica, e: ev.ShardStatus) -> None:
    """A replica failed before it was ever ready: one more failure in a row
    for its model, which backs off and, after enough, is parked (decide)."""
    model = state.models.get(rep.model)
    if model is not None:
        model.start_failures += 1
        model.last_failure = f"shard {e.shard} on {e.node}: {e.reason or 'no reason given'}"
        model.failed_at = e.at


def _node_muted(state: State, e: ev.NodeMuted, seq: int) -> None:
    """A node muted past its rate (muting.py) is lost with it."""
    _node_lost(state, muting.muted(state, e), seq)


_HANDLERS: dict[type, Callable[[State, ev.Event, int], None]] = {
    ev.ModelApplied: _model_applied,
    ev.ModelRemoved: _model_removed,
    ev.NodeRegistered: _node_registered,
    ev.ShardStatus: _shard_status,
    ev.Decided: decisions.fold_decided,
    ev.NodeLost: _node_lost,
    ev.ReplicasRestart: _replicas_restart,
    ev.ModelRetry: _model_retry,
    ev.ApiKeyApplied: _api_key_applied,
    ev.ApiKeyRemoved: _api_key_removed,
    ev.ModelLoad: _model_load,
    ev.UsageReported: lambda state, e, seq: None,  # usage is read from the log (ctl get usage), not folded
    ev.OwnerApplied: _owner_applied,
    ev.OwnerRemoved: _owner_removed,
    ev.NodePorts: node_ports,
    ev.LeaderElected: _leader_elected,
    ev.CredentialRevoked: _credential_revoked,
    ev.PolicyApplied: _policy_applied,
}
_HANDLERS.update(facility_facts.HANDLERS)  # holds, power caps, measured draw
_HANDLERS[ev.NodeMuted] = _node_muted
_HANDLERS[ev.NodeUnmuted] = muting.node_unmuted
_HANDLERS.update(labels.HANDLERS)  # labels an operator set, nodes an operator admitted
