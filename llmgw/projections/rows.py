"""What a batch of events changes, as rows: no I/O, no clock.

The projector keeps a `State` folded with `llmgw.core.folding.fold.apply`, the very
fold the control plane runs, and never interprets an event itself. For each
batch it folds the events one by one and notes:

* the append-only rows each event makes (events, event_mentions, decisions,
  quarantined), from what the core says of it (`history.summary`,
  `history.mentions`, the state's quarantine and voided counters);
* which models, nodes and replicas the event may have changed: every entity
  it mentions, plus (at the end of the batch) every replica with a shard on
  a mentioned node, in the state or still in the database (as the mirror
  remembers it). That second part catches the side effects no event names:
  a node lost or re-registering fails the shards on it, and a stopping
  replica whose last shard ends that way leaves the state. Widening by node
  is cheap (one pass over the replicas per batch) and stays right if the
  fold grows new side effects on a node.

The entity rows are then made from the state as it is at the end of the
batch (`mirror.Mirror.changes`): an upsert for what exists and differs from
the database, a delete for what does not exist. Rows from the end state, not
event by event, is what makes a batch of thousands of events cost about as
much as its distinct entities, not its events.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ..core.contract import events as ev
from ..core.contract.catalog import max_replicas
from ..core.rules import admission
from ..core.folding import facility_facts
from ..core.folding.decisions import describe_action
from ..core.folding.fold import apply
from ..core.simulation.history import action_about, mentions, summary
from ..core.rules.decide import restart_state
from ..core.rules.quota import report
from ..core.contract.reasons import words
from ..core.rules.scaling import decided
from ..core.folding.state import Model, Node, Replica, State

Record = tuple[int, str, bytes]

# The columns of every table the projector writes, in the order of the rows
# made here (projections/*.sql has the types). The statements and the
# mirror name them from this, never with SELECT *.
COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("seq", "at", "type", "subject", "summary"),
    "entities": ("id", "kind", "name"),
    "event_mentions": ("entity", "seq"),
    "decisions": ("seq", "idx", "at", "kind", "model", "replica", "node", "reason", "voided", "leader"),
    "quarantined": ("seq", "subject", "error"),
    "models": ("name", "owner", "min_replicas", "max_replicas", "aliases", "profiles", "waiting", "applied_at",
               "desired", "parked", "routing"),
    "nodes": ("name", "state", "reason", "gpus_total", "gpus_used", "gpus", "labels", "memory_gb", "cpu_cores",
              "agent", "strays", "registered_at", "location", "power_w", "unadmitted"),
    "replicas": ("id", "model", "profile", "fingerprint", "state", "reason", "placed_at", "ready_at", "stopping_at",
                 "restart", "restart_reason", "rejections"),
    "shards": ("id", "replica", "node", "rank", "gpus", "port", "generation", "state", "reason", "endpoint"),
    "quotas": ("owner", "guarantee", "limits", "usage", "borrowed"),
    "preemptions": ("seq", "idx", "at", "model", "victims", "reason", "inventory", "voided"),
    "domains": tuple(facility_facts.DomainRow.__struct_fields__),
}

_json = msgspec.json.Encoder()
_decode = ev._decoder.decode
_TAG = {cls: ev.tag_of(cls) for cls in ev.EVENT_TYPES}
_NOT_DECODED = (msgspec.DecodeError, msgspec.ValidationError)
_DECIDED, _NODE_LOST, _LEADER_ELECTED = ev.Decided, ev.NodeLost, ev.LeaderElected
# A mention is one int, entity id << SEQ_BITS | seq (a sequence below 2**40):
# ints sort ~5x faster than tuples, and SQLite unpacks them (see projector).
SEQ_BITS = 40
SEQ_MASK = (1 << SEQ_BITS) - 1


class _Loose(msgspec.Struct):
    """Just enough of a message that does not decode as an event to list it."""

    type: str = ""
    at: float | None = None


_loose = msgspec.json.Decoder(_Loose)


def _json_text(obj) -> str:
    return _json.encode(obj).decode()


class Batch:
    """The rows and dirty entities of a run of consecutive events."""

    __slots__ = (
        "first_seq", "last_seq", "events", "entities", "mentions", "decisions", "quarantined", "dirty", "preemptions",
    )

    def __init__(self) -> None:
        self.first_seq = 0
        self.last_seq = 0
        self.events: list[tuple] = []  # (seq, at, type, subject, summary)
        self.entities: list[tuple] = []  # (id, kind, name): first mentioned in this batch
        self.mentions: list[int] = []  # entity id << SEQ_BITS | seq
        self.decisions: list[tuple] = []  # (seq, idx, at, kind, model, replica, node, reason, voided, leader)
        self.quarantined: list[tuple] = []  # (seq, subject, error)
        self.preemptions: list[tuple] = []  # (seq, idx, at, model, victims, reason, inventory, voided)
        self.dirty: dict[str, set[str]] = {"model": set(), "node": set(), "replica": set()}

    @property
    def models(self) -> set[str]:
        return self.dirty["model"]

    @property
    def nodes(self) -> set[str]:
        return self.dirty["node"]

    @property
    def replicas(self) -> set[str]:
        return self.dirty["replica"]

    def __len__(self) -> int:
        return len(self.events)


def fold(state: State, records: Iterable[Record], ids: dict[tuple[str, str], int], batch: Batch | None = None) -> Batch:
    """Fold `records` into `state` (mutating it) and collect what they change.

    `ids` numbers every entity ever mentioned, (kind, name) -> id, and is
    extended here with those first mentioned now (also listed in
    `batch.entities`). Records at or below `state.seq` (redelivered) are
    skipped."""
    if batch is None:
        batch = Batch()
    for seq, subject, data in records:
        if seq <= state.seq:
            continue
        if not batch.first_seq:
            batch.first_seq = seq
        _fold_one(state, batch, ids, seq, subject, data)
        batch.last_seq = seq
    return batch


def _fold_one(state: State, batch: Batch, ids: dict, seq: int, subject: str, data: bytes) -> None:
    quarantined, voided = state.quarantine_count, state.voided_count
    try:
        event = _decode(data)
    except _NOT_DECODED:
        event = None
    cls = type(event)
    if cls is _DECIDED:
        # Where a replica about to be stopped runs, before the fold may forget it.
        stop_nodes = {}
        for a in event.actions:
            if type(a) is ev.StopReplica:
                rep = state.replicas.get(a.replica)
                stop_nodes[a.replica] = _nodes_of(rep) if rep is not None else ""
    apply(state, seq, subject, data)
    error = ""
    if state.quarantine_count != quarantined:
        error = state.quarantined[-1].error
        batch.quarantined.append((seq, subject, error))
    if event is None:
        try:
            loose = _loose.decode(data)
            tag, at = loose.type, loose.at
        except (*_NOT_DECODED, UnicodeDecodeError):
            tag, at = "", None
        batch.events.append((seq, at, tag, subject, f"not an event: {error}"))
        return
    batch.events.append((seq, event.at, _TAG[cls], subject, summary(event)))
    mention, dirty, new = batch.mentions.append, batch.dirty, None
    for entity in mentions(event):
        id_ = ids.get(entity)
        if id_ is None:
            new = [entity] if new is None else [*new, entity]
            continue
        mention(id_ << SEQ_BITS | seq)
        dirty[entity[0]].add(entity[1])
    if new is not None:
        # Numbered in sorted order: a set's order differs from one process
        # to the next, and the same log must number its entities alike.
        for entity in sorted(new):
            id_ = ids[entity] = len(ids) + 1
            batch.entities.append((id_, *entity))
            mention(id_ << SEQ_BITS | seq)
            dirty[entity[0]].add(entity[1])
    if cls is _DECIDED:
        actions = event.actions
        if error:
            why_void = [f"the event was quarantined: {error}"] * len(actions)
        else:
            why_void = _voided(state, actions, state.voided_count - voided)
        at, append = event.at, batch.decisions.append
        leader = event.leader
        for i, a in enumerate(actions):
            append((seq, i, at, *_action_row(a, stop_nodes), words(a), why_void[i], leader))
            if type(a) is ev.Preempt:
                victims = _json_text(a.victims)
                batch.preemptions.append((seq, i, at, a.model, victims, words(a), a.inventory, why_void[i]))
    elif cls is _NODE_LOST:
        why_void = error and f"the event was quarantined: {error}"
        batch.decisions.append((seq, 0, event.at, "node-lost", "", "", event.node, event.reason, why_void, state.leader))
    elif cls is ev.NodeMuted:  # a decision of the control plane, as a node lost is
        why_void = error and f"the event was quarantined: {error}"
        batch.decisions.append((seq, 0, event.at, "node-muted", "", "", event.node, summary(event), why_void, state.leader))
    elif cls is _LEADER_ELECTED:
        # Who leads, as a decision of its own: `ctl get decisions` shows each
        # term begin, and every decision says the leader that took it.
        why_void = error and f"the event was quarantined: {error}"
        batch.decisions.append((seq, 0, event.at, "leader", "", "", "", summary(event), why_void, event.leader))


def _voided(state: State, actions: list[ev.Action], count: int) -> list[str]:
    """Which actions of one event the fold voided, and why.

    The fold appends a `Voided(action=describe_action(a), reason)` per voided
    action, in action order. Matched from the last action backwards, so that
    of two identical actions the later one is taken as voided, which is what
    the fold does (the first took effect, the second finds it done). The
    state keeps only its last `kept_verbatim` entries (core/contract/
    limits.py): beyond that, an action known voided by the count but
    without its entry says so.
    """
    out = [""] * len(actions)
    if not count:
        return out
    entries = state.voided[-count:] if count <= len(state.voided) else list(state.voided)
    j = len(entries) - 1
    left = count
    for i in range(len(actions) - 1, -1, -1):
        if left == 0:
            break
        if j >= 0 and entries[j].action == describe_action(actions[i]):
            out[i] = entries[j].reason
            j -= 1
            left -= 1
    if left and count > len(state.voided):
        for i in range(len(actions)):
            if left == 0:
                break
            if not out[i]:
                out[i] = "voided (its reason is no longer kept in the state)"
                left -= 1
    return out


def _action_row(a: ev.Action, stop_nodes: dict[str, str]) -> tuple[str, str, str, str]:
    """(kind, model, replica, node) of one action; a stop's nodes as they were before it."""
    if type(a) is ev.PlaceReplica and len(a.shards) == 1:  # the common case, without sorting
        return "place", a.model, a.replica, a.shards[0].node
    kind, model, replica, node = action_about(a)
    if kind == "stop":
        node = stop_nodes.get(replica, "")
    return kind, model, replica, node


def _rank(s: ev.ShardPlacement) -> int:
    return s.rank


def _nodes_of(rep: Replica) -> str:
    shards = rep.shards
    return shards[0].node if len(shards) == 1 else ",".join(s.node for s in sorted(shards, key=_rank))


# --------------------------------------------------------------------------- entity rows


def quota_rows(state: State) -> dict[str, tuple]:
    """The quotas table for a state: a row per owner (core.quota.report)."""
    return {
        q.owner: (q.owner, _json_text(q.guarantee), _json_text(q.limit), _json_text(q.usage), _json_text(q.borrowed))
        for q in report(state)
    }


def replicas_on(state: State, nodes: set[str]) -> set[str]:
    """Replicas in the state with a shard on one of `nodes`."""
    out = set()
    if nodes:
        for rep in state.replicas.values():
            for sh in rep.shards:
                if sh.node in nodes:
                    out.add(rep.id)
                    break
    return out


class EntityRows(msgspec.Struct):
    """Every row the entity tables must hold for a state, keyed like the tables."""

    models: dict[str, tuple]
    nodes: dict[str, tuple]
    replicas: dict[str, tuple]
    shards: dict[str, tuple]
    quotas: dict[str, tuple]
    domains: dict[str, tuple]


def all_entity_rows(state: State) -> EntityRows:
    """What the entity tables must hold for `state`: the tests and the
    benchmark hold the database to it."""
    shards = {}
    for r in state.replicas.values():
        for row in shard_rows(r):
            shards[row[0]] = row
    return EntityRows(
        models={name: model_row(m) for name, m in state.models.items()},
        nodes={name: node_row(n) for name, n in state.nodes.items()},
        replicas={rid: replica_row(r, state) for rid, r in state.replicas.items()},
        shards=shards,
        quotas=quota_rows(state),
        domains=domain_rows(state),
    )


def model_row(m: Model) -> tuple:
    spec = m.spec
    profiles = [{**msgspec.structs.asdict(p), "fingerprint": m.fingerprints.get(p.name, "")} for p in spec.profiles]
    return (
        spec.name,
        spec.owner,
        spec.min_replicas,
        max_replicas(spec),
        _json_text(spec.aliases),
        _json_text(profiles),
        m.waiting,
        m.applied_at,
        decided(m),
        m.parked,
        _json_text({"policy": spec.routing, "replicas": m.routed}),
    )


def node_row(n: Node) -> tuple:
    used = n.used
    gpus = [
        {"index": g.index, "model": g.model, "memory_gb": g.memory_gb, "shard": used.get(g.index, "")} for g in n.gpus
    ]
    return (
        n.name,
        n.state,
        n.reason or n.cordon,  # (a ready node cordoned says why: admission.py)
        len(n.gpus),
        len(used),
        _json_text(gpus),
        _json_text(n.labels),
        n.memory_gb,
        n.cpu_cores,
        n.agent,
        _json_text(n.strays),
        n.registered_at,
        _json_text(facility_facts.location(n)),
        facility_facts.node_draw(n),
        _json_text(admission.unadmitted(n)),
    )


def replica_row(r: Replica, state: State) -> tuple:
    return (
        r.id, r.model, r.profile, r.fingerprint, r.state, r.reason, r.placed_at, r.ready_at, r.stopping_at,
        restart_state(state, r), r.restart_reason, _json_text(r.rejections),
    )


def domain_rows(state: State) -> dict[str, tuple]:
    """The facility's domains, keyed by domain (facility_facts.domain_rows)."""
    return {r.domain: msgspec.structs.astuple(r) for r in facility_facts.domain_rows(state)}


def shard_rows(r: Replica) -> list[tuple]:
    return [
        (s.id, r.id, s.node, s.rank, _json_text(s.gpus), s.port, s.generation, s.state, s.reason, s.endpoint)
        for s in r.shards
    ]
