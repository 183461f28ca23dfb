"""What the control plane says (on `llmgw.control.>`): a pass of
decisions (`Decided`, its actions and their causes as data), a node lost,
a leader elected, a node muted; and the operator's unmute beside its mute."""

from __future__ import annotations

from typing import Union

from .. import bounds as b
from .base import Event, Struct


class Scale(Struct):
    """Why a model should run the replicas it should (scaling.why_desired), as
    data: `why` one of reasons.ScaleWhy, with the numbers it was decided on."""

    why: b.CauseKind
    load: b.Counter = 0  # requests in flight and queued, over the gateways heard lately
    per: b.Ratio = 0.0  # the model's target_load
    wants: b.Counter = 0  # replicas that load asks for
    recent: b.Counter = 0  # the most asked for within the scale-down delay
    delay_s: b.Duration = 0.0  # the scale-down delay
    least: b.ReplicaCount = 0
    most: b.ReplicaCount = 0
    idle_s: b.Time = 0.0  # since the last request (a difference of two times)
    idle_after_s: b.Duration = 0.0  # the model's idle_s


class Cause(Struct):
    """Why the control plane did something, as data (issue 33): a kind (one of
    core/contract/reasons.py's `CauseKind`, one per distinct reason a rule gives) and
    its parameters; `reasons.render` says it in words.

    Explicit optional fields rather than a map of names to values: each is
    typed and bounded where the contract is declared (bounds.py), a reader
    gets a number as a number, the schema says what a cause may hold, and a
    default is not encoded, so a cause costs only the fields its kind uses.
    A kind names the fields it reads (reasons.py's table). `text` is only
    ever words that are not the rules' own: a shard's failure as its agent
    said it, the reason an operator gave a hold. One level of nesting only
    (`scale`), so a cause is bounded in depth too."""

    kind: b.CauseKind
    model: b.ModelRef = ""
    replica: b.ReplicaRef = ""
    shard: b.ShardRef = ""
    replicas: b.ReplicaRefs = []
    node: b.NodeRef = ""
    nodes: b.NodeRefs = []
    profile: b.ProfileRef = ""
    owner: b.OwnerName = ""
    priority: b.Priority = ""
    domain: b.Domain = ""
    pool: b.LabelValue = ""
    node_pool: b.LabelValue = ""  # the pool the node is in ("": none)
    state: b.Word = ""  # a replica's state
    resource: b.Word = ""  # gpus, cpu_cores, memory_gb
    count: b.Counter = 0
    of: b.Counter = 0
    victims: b.ReplicaCount = 0
    tier: b.SmallCount = 0
    held: b.FleetMemoryGb = 0.0  # what an owner holds, of `resource`
    more: b.FleetMemoryGb = 0.0  # what would be taken on top
    limit: b.FleetMemoryGb = 0.0  # the owner's limit
    seconds: b.Duration = 0.0
    at: b.Time = 0.0
    text: b.Text = ""
    scale: Union[Scale, None] = None


class ShardPlacement(Struct):
    shard: b.ShardRef
    node: b.NodeRef
    rank: b.Rank
    gpus: b.GpuIndices
    port: b.Port


class PlaceReplica(Struct, tag_field="action", tag="place"):
    replica: b.ReplicaRef
    model: b.ModelRef
    profile: b.ProfileRef
    fingerprint: b.FingerprintRef
    shards: b.many(ShardPlacement, b.MAX_SHARDS_PER_REPLICA)
    reason: b.Text
    # A replica stopped in the same pass whose GPUs and ports this one takes
    # over: its shards start once the old ones on their node have exited.
    replaces: b.ReplicaRef = ""
    # The facility's refusals this placement met on its way, by domain
    # (`rack/r4-12 is held: maintenance`): kept on the replica for
    # `ctl describe replica`, since the state that caused them passes.
    rejections: b.Rejections = []


class StopReplica(Struct, tag_field="action", tag="stop"):
    replica: b.ReplicaRef
    reason: b.Text
    # Drain first: no new requests, and up to this long for those in flight.
    drain_s: b.Duration = 0.0
    # Stopped for not being ready by its start deadline (core/rules/admission.py):
    # the fold counts it as a start failure of its model (backoff, parking).
    failed_to_start: bool = False
    # Why, as data (reasons.py; None in one recorded before causes): `reason`
    # is its words, rendered when decided, for the state and older readers.
    cause: Union[Cause, None] = None


class ScaleModel(Struct, tag_field="action", tag="scale"):
    """The number of replicas a model should run changes, and why."""

    model: b.ModelRef
    desired: b.ReplicaCount
    reason: b.Text
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class RestartReplica(Struct, tag_field="action", tag="restart"):
    """A replica's restart begins: it keeps serving until its replacement does
    (or, `in_place`, it is stopped in this same pass)."""

    replica: b.ReplicaRef
    reason: b.Text
    in_place: bool = False
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class RefuseRestart(Struct, tag_field="action", tag="refuse-restart"):
    """A restart is given up; the replica keeps serving, with the reason kept on it."""

    replica: b.ReplicaRef
    reason: b.Text
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class Victim(Struct):
    """One replica stopped to make room, and why it was the one."""

    replica: b.ReplicaRef
    model: b.ModelRef
    priority: b.Priority
    tier: b.SmallCount
    why: b.Text  # the tier, in words (reasons.TIERS): the tier is the data
    idle_s: b.Duration = 0.0  # 0: unknown
    gpus: b.FleetAmount = 0


class Preempt(Struct, tag_field="action", tag="preempt"):
    """Replicas stopped so that a model fits: the StopReplica actions of the
    victims follow in the same pass. `inventory` says what the nodes
    involved had free before, for whoever asks why later."""

    model: b.ModelRef
    victims: b.many(Victim, b.MAX_VICTIMS)
    reason: b.Text
    inventory: b.LongText = ""
    # The models that gave room may not take it back before then (or before
    # `model` has what it asked for).
    hold_until: b.Time = 0.0
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class ParkModel(Struct, tag_field="action", tag="park"):
    """A model whose replicas keep failing to start is placed no more until
    an operator retries it (`llmgw ctl retry`)."""

    model: b.ModelRef
    reason: b.Text
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class ModelWaiting(Struct, tag_field="action", tag="wait"):
    """The model wants more replicas than it could get; `reason` says why.
    `kind` says it as data (core/rules/waits.py: no_room, over_limit, parked,
    ...), which is what a gateway reads to refuse a request at once rather
    than hold it; "" in one recorded before kinds (the fold reads its words)."""

    model: b.ModelRef
    reason: b.Text
    kind: b.WaitKind = ""
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


class StopStray(Struct, tag_field="action", tag="stop-stray"):
    """A running shard that no model claims is stopped; its port stays taken until it exits."""

    node: b.NodeRef
    shard: b.ShardRef
    generation: b.Seq
    reason: b.Text
    cause: Union[Cause, None] = None  # why, as data (see StopReplica.cause)


Action = Union[
    PlaceReplica, StopReplica, ModelWaiting, StopStray, ScaleModel, RestartReplica, RefuseRestart, ParkModel, Preempt
]


class Decided(Event, tag="control.decided"):
    """One pass of `decide`: actions that must land together, in one message.

    `basis` is the stream sequence of the state the pass was decided on, so the
    replay tool can decide again on exactly that state and compare.
    """

    basis: b.Seq
    actions: b.many(Action, b.MAX_REPLICAS)
    leader: b.Leader = ""


class NodeLost(Event, tag="node.lost"):
    """The control plane stopped hearing a node's heartbeat; its shards are gone."""

    node: b.NodeRef
    reason: b.Text
    basis: b.Seq = 0


class LeaderElected(Event, tag="leader.elected"):
    """A control plane took the lease (a key with a TTL in the NATS KV bucket
    LLMGW_LEADER) and leads from this event on. Terms only grow: the fold
    refuses a term that is not after the last one. Commands carry the term
    they were sent in, and an agent never acts on one of an older term than
    it has seen; decisions are fenced by the control subjects' sequence,
    which this event moves, so a deposed leader's next decision is refused."""

    term: b.Term
    leader: b.Leader
    previous: b.Leader = ""  # who led before ("": nobody since the log began)
    basis: b.Seq = 0



class NodeMuted(Event, tag="node.muted"):
    """The control plane stopped listening to a node that spoke past its
    rate (control/rates.py): from this event on, the fold quarantines
    everything that node's agent publishes ("muted"), and its replicas are
    lost with it (replaced elsewhere), until an operator unmutes it.

    Why: one node's credential stored ~609,000 events in seconds (issue 35,
    finding 6); the control plane fell 574,000 events behind and an
    operator's change waited more than two minutes. The server keeps what a
    node publishes; the fold need not read it. A decision in the log, so a
    replay mutes at the same place."""

    node: b.NodeName
    rate: b.EventRate  # events a second the control plane counted
    limit: b.EventRate  # the rate it allows a node (ControlConfig.node_rate)
    window_s: b.Duration = 0.0  # over how long the rate was averaged
    events: b.Counter = 0  # how many events it counted in that window
    basis: b.Seq = 0


class NodeUnmuted(Event, tag="node.unmuted"):
    """An operator unmuted a node (`llmgw ctl node unmute NODE`): its agent is
    heard again from here on; it registers again to be given work."""

    node: b.NodeName
    reason: b.Text = ""
