"""The event contract: every fact and decision llmgw records, as one tagged union.

The log is forever, so these types only ever grow: a field may be added with a
default, never removed, renamed or retyped, and a tag never changes.
`tests/test_contract.py` holds the code to that against `events/schema/`.

Every event carries its tag (`type`), a schema version (`v`) and the time its
publisher assigned (`at`, Unix seconds). Time enters the fold only this way.

Who may say what is part of the contract too: each event type belongs to one
origin (the operator's CLI, an agent, the control plane), and `origin_of`
tells which subject prefix it must arrive on. An agent speaks only for its
own node: the node named in the subject must be the node in the event.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from . import bounds as b
from .policy import Policy

SCHEMA_VERSION = 1


class Struct(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Base of every plain record in the contract (not itself an event)."""


class Event(msgspec.Struct, kw_only=True, tag_field="type", gc=False):
    """Base of every event; subclasses set an explicit string tag."""

    v: b.Version = SCHEMA_VERSION
    at: b.Time


# --------------------------------------------------------------------------- catalog


class ProfileSpec(Struct):
    """One way to run a model: an engine and what each shard of it needs.

    `gpus` is per shard; `nodes` is shards per replica (one per node, all on
    nodes of one fabric: the node label `llmgw.io/fabric`).
    `gpu_memory_gb` is what each of those GPUs must have, `gpu_model` what
    they must be (whole words of the name the agent reports, case aside:
    "H100" suits "NVIDIA H100 80GB HBM3"; "" any), `memory_gb` host memory
    and `cpu_cores` CPU cores per shard, `pool` the node label
    `llmgw.io/pool` the nodes must carry ("" any node).

    Fields added later have defaults that ask for nothing, and a default is
    not encoded, so the fingerprint of a profile written before them stays.
    """

    name: b.ProfileName
    engine: b.Engine = "sim"
    args: b.Args = []
    gpus: b.GpuCount = 1
    nodes: b.ShardCount = 1
    gpu_memory_gb: b.GpuMemoryGb = 0.0
    memory_gb: b.HostMemoryGb = 0.0
    gpu_model: b.GpuModel = ""
    cpu_cores: b.CpuCores = 0
    pool: b.LabelValue = ""
    # What the engine serves: a path to weights on the node, or a name the
    # agent knows (its agent file's `models`, or `smollm2`, the demo model).
    model: b.EnginePath = ""
    # The share of requests a replica of this profile gets from a gateway,
    # relative to the others of the model (least outstanding requests per
    # unit of weight). Routing only: it does not change the fingerprint.
    weight: b.Ratio = 1.0
    # Facility (core/scheduling/facility.py). The declared draw of one shard in watts
    # (0: not declared; its GPUs' power limits are counted instead), and a
    # domain kind (site, room, row, rack, pdu) every shard of a multi-node
    # replica must share ("": no such rule).
    power_w: b.NodeWatts = 0.0
    keep_within: b.DomainKind = ""
    # Whether a replica may run simulated, on a simulated node (NodeRegistered.
    # simulated), where its engine would not run: a profile of a real engine
    # (any but "sim") goes on a simulated node only when this says so.
    simulate: bool = False
    # Whether its engine can call tools (false: a model whose chat template
    # has none, which llama.cpp answers with prose). The gateway refuses a
    # request's tools for a model any of whose profiles says false, rather
    # than let them be dropped (gateway/serves.py). Serving only: it does not
    # change the fingerprint.
    tools: bool = True


class ModelSpec(Struct):
    """What the catalog says of one model. Profiles are in order of preference."""

    name: b.ModelName
    profiles: b.many(ProfileSpec, b.MAX_PROFILES)
    aliases: b.Aliases = []
    owner: b.OwnerName = ""
    min_replicas: b.ReplicaCount = 1
    max_replicas: b.ReplicaCount = 0  # 0: as many as min_replicas
    # Scaling on load (what the gateways report in flight and queued): the
    # desired count is load / target_load per replica, rounded up, between
    # min and max. 0: no scaling on load, min_replicas run.
    target_load: b.Ratio = 0.0
    # A lower desired count must hold this long before replicas are drained,
    # so a dip in traffic does not stop what the next burst needs.
    scale_down_delay_s: b.Duration = 300.0
    # On demand: no replica until a request asks for the model, and none
    # again once no request came for idle_s.
    on_demand: bool = False
    idle_s: b.Duration = 600.0
    # How long a replica being stopped may finish the requests it has.
    drain_grace_s: b.Duration = 30.0
    # Who gives way to whom when the fleet is full: critical > standard >
    # opportunistic (see preempt.py).
    priority: b.Priority = "standard"
    # How a gateway picks among its ready replicas (gateway/choose.py):
    # "prefix" (where the prompt's prefix is warm, bounded by load; else where
    # it hashes), "least-load" (fewest outstanding per unit of weight) or
    # "round-robin". Routing only: no replica is restarted for it.
    routing: b.Routing = "prefix"
    # What 1,000 of its tokens cost, prompt and answer (in the catalog's
    # currency, whatever it is): spend in `ctl get usage`. 0: no price.
    price_in_per_1k: b.Price = 0.0
    price_out_per_1k: b.Price = 0.0


class Resources(Struct):
    """An amount of the fleet: GPUs, CPU cores, host memory."""

    gpus: b.FleetAmount = 0
    cpu_cores: b.FleetAmount = 0
    memory_gb: b.FleetMemoryGb = 0.0


class Limit(Struct):
    """The most an owner may hold; None: no limit on that."""

    gpus: b.FleetAmount | None = None
    cpu_cores: b.FleetAmount | None = None
    memory_gb: b.FleetMemoryGb | None = None


# --------------------------------------------------------------------------- fleet records


class Gpu(Struct):
    index: b.GpuIndex
    model: b.GpuModel = ""
    memory_gb: b.GpuMemoryGb = 0.0
    # Its power limit in watts (agent file, or NVML's enforced limit): the
    # derived draw of a shard on it before the agent measures one. 0: unknown.
    power_w: b.GpuWatts = 0.0


class RunningShard(Struct):
    """A shard an agent says it is running, as reported when it registers."""

    shard: b.ShardId
    replica: b.ReplicaId
    model: b.ModelName
    profile: b.ProfileName
    generation: b.Seq
    rank: b.Rank = 0
    gpus: b.GpuIndices = []
    port: b.Port = 0
    state: b.Word = "ready"
    endpoint: b.Endpoint = ""
    fingerprint: b.Fingerprint = ""  # of the profile it was started with ("" : not said)
    identity: b.Identity = ""  # what its engine answers to (see ShardStatus.identity)


ShardState = Literal["starting", "loading", "ready", "failed", "stopped"]


# --------------------------------------------------------------------------- operator (llmgw.ctl.>)


class ModelApplied(Event, tag="model.applied"):
    model: ModelSpec


class ModelRemoved(Event, tag="model.removed"):
    name: b.ModelRef


class ReplicasRestart(Event, tag="replicas.restart"):
    """An operator asks for replicas to be replaced (`llmgw ctl restart`).

    Each is replaced beside itself (surge) unless `in_place`: stopped first,
    its replacement started in what it frees. `max_surge` and
    `max_unavailable` pace a model's restarts (0 and 0: one at a time)."""

    replicas: b.ReplicaIds
    in_place: bool = False
    max_surge: b.ReplicaCount = 0
    max_unavailable: b.ReplicaCount = 0


class ModelRetry(Event, tag="model.retry"):
    """An operator unparks a model whose replicas kept failing to start."""

    name: b.ModelRef


class OwnerApplied(Event, tag="owner.applied"):
    """An owner of models (an organisation, a team: "org/team" is a team of
    org), with what it is guaranteed and the most it may hold. Usage counts
    up the tree: a team's replicas count for its organisation too."""

    name: b.OwnerPath
    guarantee: Resources = msgspec.field(default_factory=Resources)
    limit: Limit = msgspec.field(default_factory=Limit)
    # What its keys may ask of the gateways together, counted up the tree (a
    # team's requests count for its organisation too); 0: no limit
    # (gateway/quota.py).
    requests_per_minute: b.Counter = 0
    tokens_per_minute: b.Counter = 0
    tokens_per_day: b.Counter = 0
    tokens_per_month: b.Counter = 0
    spend_per_day: b.Price = 0.0  # in the catalog's currency, at its models' prices
    spend_per_month: b.Price = 0.0


class OwnerRemoved(Event, tag="owner.removed"):
    name: b.OwnerName


class ApiKeyApplied(Event, tag="apikey.applied"):
    """A key of the gateway, for one owner. Only its SHA-256 travels and is
    kept: the key itself is never in the log."""

    name: b.KeyName
    owner: b.OwnerName
    key_sha256: b.KeySha256
    requests_per_minute: b.Counter = 0  # 0: no limit
    tokens_per_minute: b.Counter = 0
    tokens_per_day: b.Counter = 0  # a budget per UTC day (gateway/quota.py)
    tokens_per_month: b.Counter = 0  # a budget per UTC calendar month
    spend_per_day: b.Price = 0.0  # budgets in the catalog's currency, at its models' prices
    spend_per_month: b.Price = 0.0


class ApiKeyRemoved(Event, tag="apikey.removed"):
    name: b.KeyName


class CredentialRevoked(Event, tag="credential.revoked"):
    """An operator revoked a bus credential (`llmgw creds revoke`): the NATS
    server refuses it from then on. A node whose agent's credential it was is
    treated as lost, until it registers again (with a new credential)."""

    role: b.Role  # agent, gateway, operator, control, projector
    name: b.NodeName  # the node, gateway or operator it was issued for
    public_key: b.PublicKey = ""


class NodeLabeled(Event, tag="node.labeled"):
    """An operator set or removed location labels of a node (`llmgw ctl label
    NODE rack=r4-12 pdu=pdu-a`, `rack-` to remove). Labels set this way win
    over the agent's own (from its agent file) until removed, when the
    agent's show again. Keys are short kinds (site, room, row, rack, pdu) or
    whole label names; the fold keeps whole names (llmgw.io/rack)."""

    node: b.NodeRef
    set: b.Labels = {}
    remove: b.LabelKeys = []


class NodeAdmitted(Event, tag="node.admitted"):
    """An operator admitted a node (`llmgw ctl node admit NODE`): what it
    claimed of itself is granted, as it claimed it then. Its pool becomes
    the operator's (as `ctl label NODE pool=` sets it); its GPUs (how many,
    of which models) are what it may claim from then on under the policy
    `admission: manual`, where a node is placed on only once admitted and
    only while it claims no more than that (core/rules/admission.py)."""

    node: b.NodeRef
    gpus: b.GpuCount = 0
    gpu_models: b.many(b.GpuModel, b.MAX_GPUS_PER_NODE) = []
    pool: b.LabelValue = ""


class DomainHeld(Event, tag="domain.held"):
    """An operator held a facility domain (`llmgw ctl facility hold rack/r4-12`):
    nothing new is placed in it; with `drain`, its replicas are replaced
    elsewhere first and then stopped."""

    domain: b.Domain  # KIND/NAME, KIND one of site, room, row, rack, pdu
    drain: bool = False
    reason: b.Text = ""


class DomainReleased(Event, tag="domain.released"):
    """An operator released a held domain: placement may use it again."""

    domain: b.Domain


class FacilityApplied(Event, tag="facility.applied"):
    """The catalog's `facility:` section, whole each time: the power cap in
    watts of each domain that has one (a domain not named has none)."""

    budgets: b.Budgets = {}


class PolicyApplied(Event, tag="policy.applied"):
    """The catalog's `policy:` section, whole each time: the fleet-wide
    numbers the rules decide with (core/contract/policy.py; a field not given has
    its default)."""

    policy: Policy = msgspec.field(default_factory=Policy)


# --------------------------------------------------------------------------- agents (llmgw.agent.<node>.>)


class NodeRegistered(Event, tag="node.registered"):
    """An agent (re)connected: what the node has and what it is running now.

    The list of running shards is complete: a shard the control plane believed
    ran there and that is missing from it is not running.
    """

    node: b.NodeName
    gpus: b.many(Gpu, b.MAX_GPUS_PER_NODE) = []
    # Host memory and CPU cores for shards; 0: not said (an agent that does
    # not know), which placement takes as no limit rather than none at all.
    memory_gb: b.HostMemoryGb = 0.0
    cpu_cores: b.CpuCores = 0
    # `llmgw.io/pool` and `llmgw.io/fabric` among them steer placement.
    labels: b.Labels = {}
    running: b.many(RunningShard, b.MAX_SHARDS_PER_NODE) = []
    agent: b.AgentName = ""  # which agent instance spoke, for the history
    # The ports its engines may be given, first to last (its agent file's
    # `engine_ports`); 0 and 0: the default range (limits.py's engine_port_first..last),
    # which is what an agent written before this field meant.
    port_first: b.Port = 0
    port_last: b.Port = 0
    # The ports of that range another program holds now: kept out of
    # placement until a NodePorts says otherwise (see NodePorts).
    ports_taken: b.Ports = []
    # A simulated node (`llmgw agent --simulate`): it runs no engine, only
    # a simulated one; a real engine's profile is placed here only if it
    # says `simulate` (fit.SIMULATED). What it says of itself only narrows
    # what it is given, so it is taken as said.
    simulated: bool = False


class ShardStatus(Event, tag="shard.status"):
    """An agent reports what became of one shard it was told to run."""

    node: b.NodeRef
    replica: b.ReplicaRef
    shard: b.ShardRef
    generation: b.Seq
    state: ShardState
    reason: b.Text = ""
    endpoint: b.Endpoint = ""
    # The name the agent gave the engine at start, which it lists in its
    # GET /v1/models: a gateway serves the replica only from an engine that
    # lists it ("" : the engine carries none, and is taken on its endpoint).
    identity: b.IdentityRef = ""


class NodePorts(Event, tag="node.ports"):
    """Which ports of its engine range another program holds now, complete:
    the control plane keeps them out of placement on that node until a
    later NodePorts (or registration) no longer lists them.

    The control plane numbers engine ports itself and cannot see the node's
    sockets. Seen for real: with anything listening on the first port of a
    node, every placement there got that port, the agent refused it, and five
    refusals later the model was parked though every other port was free.

    An event of its own, not a field of ShardStatus: it is a fact about the
    node, not about a shard, and it must also be said when no shard changes
    (the other program exits and its port is free again). The whole set each
    time, not a change: one lost to a bug or a quarantine cannot keep a port
    out for ever, and the next one says it all again. A registration says the
    same for the moment it is made (NodeRegistered.ports_taken): it replaces
    everything known of the node, and a pass between it and a NodePorts
    would hand out those ports again.

    The agent says it when it refuses a start because the port is taken,
    before the shard's failure, so that the fold reads that failure as the
    node's (not counted towards parking the model), and when one of those
    ports is free again."""

    node: b.NodeRef
    taken: b.Ports = []


class NodePower(Event, tag="node.power"):
    """What a node's GPUs draw, measured (NVML's power usage; a simulated
    agent draws `--watts-per-gpu` per GPU in use), coalesced: sent when it
    changes by enough to matter, at most every few seconds, so that the draw
    placement counts is in the log and replay decides the same."""

    node: b.NodeRef
    watts: b.NodeWatts = 0.0  # the node's GPUs together
    gpus: b.GpuDraws = {}  # per GPU index, where known


# --------------------------------------------------------------------------- gateways (llmgw.gw.<gateway>.>)


# Why a gateway sent a request where it did (gateway/choose.Reason's values).
ROUTE_REASONS = ("warm", "hashed", "overflow", "session", "least_load", "round_robin")


class RouteCount(Struct):
    """Requests one gateway sent one replica for one reason (gateway/choose.py:
    warm, hashed, overflow, session, least_load, round_robin) since its
    previous report, with their prompt tokens, the part of them the engine
    had in its cache, and the answers that were prefix hits."""

    replica: b.ReplicaRef
    reason: b.Word
    requests: b.Counter = 0
    prompt_tokens: b.Counter = 0
    cached_tokens: b.Counter = 0
    hits: b.Counter = 0


class UsageRow(Struct):
    """What one key (of one owner) asked of one model at one gateway since
    its previous report: requests answered, their prompt and answer tokens,
    and requests refused past a limit."""

    model: b.ModelRef
    key: b.KeyName = ""  # "" : a gateway without API keys
    owner: b.OwnerName = ""
    requests: b.Counter = 0
    tokens_in: b.Counter = 0
    tokens_out: b.Counter = 0
    refused: b.Counter = 0


class UsageReported(Event, tag="usage.reported"):
    """One gateway's usage, coalesced per key, owner and model over an
    interval (GatewayConfig.usage_interval, gateway/usage.py): the sum over
    the log is the whole usage (`llmgw ctl get usage`). Not folded: the
    control plane decides nothing on it."""

    gateway: b.GatewayRef
    since: b.Time = 0.0  # the interval's start (`at` its end)
    rows: b.many(UsageRow, b.MAX_USAGE_ROWS) = []


class ModelLoad(Event, tag="model.load"):
    """One gateway's load on one model, coalesced: published when it changes,
    at most every second or so, and once more when it falls to nothing.

    What the reconciler scales on. A request waiting for a model with no
    ready replica counts as queued, which is how an on-demand model is woken.
    `last_used` is when this gateway last sent the model a request."""

    gateway: b.GatewayRef
    model: b.ModelRef
    in_flight: b.Counter = 0
    queued: b.Counter = 0
    last_used: b.Time = 0.0
    # Usage: the prompt and completion tokens this gateway counted for the
    # model since its previous report (so the sum over the log is the total).
    tokens_in: b.Counter = 0
    tokens_out: b.Counter = 0
    # For the console's plots (issue 34), over the same window: the requests
    # this gateway finished for the model, the prompt tokens the engines said
    # they took from their prefix cache (usage.prompt_tokens_details
    # .cached_tokens, llama.cpp's timings.cache_n), and the median and 90th
    # percentile of the time to the answer's first byte (a stream's first
    # token), 0 when no request was answered.
    requests: b.Counter = 0
    tokens_cached: b.Counter = 0
    ttft_p50: b.Duration = 0.0
    ttft_p90: b.Duration = 0.0
    # Where its requests went and why, since its previous report (issue 30).
    routes: b.many(RouteCount, b.MAX_ROUTE_ROWS) = []


# --------------------------------------------------------------------------- control plane (llmgw.control.>)


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


AnyEvent = Union[
    ModelApplied,
    ModelRemoved,
    NodeRegistered,
    ShardStatus,
    Decided,
    NodeLost,
    ReplicasRestart,
    ModelRetry,
    ApiKeyApplied,
    ApiKeyRemoved,
    ModelLoad,
    OwnerApplied,
    OwnerRemoved,
    NodePorts,
    LeaderElected,
    CredentialRevoked,
    NodeLabeled,
    DomainHeld,
    DomainReleased,
    FacilityApplied,
    NodePower,
    PolicyApplied,
    NodeMuted,
    NodeUnmuted,
    NodeAdmitted,
    UsageReported,
]

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__  # type: ignore[attr-defined]

# Which subject prefix each kind of event must arrive on.
ORIGIN: dict[type[Event], str] = {
    ModelApplied: "ctl",
    ModelRemoved: "ctl",
    NodeRegistered: "agent",
    ShardStatus: "agent",
    Decided: "control",
    NodeLost: "control",
    ReplicasRestart: "ctl",
    ModelRetry: "ctl",
    ApiKeyApplied: "ctl",
    ApiKeyRemoved: "ctl",
    ModelLoad: "gw",
    OwnerApplied: "ctl",
    OwnerRemoved: "ctl",
    NodePorts: "agent",
    LeaderElected: "control",
    CredentialRevoked: "ctl",
    NodeLabeled: "ctl",
    DomainHeld: "ctl",
    DomainReleased: "ctl",
    FacilityApplied: "ctl",
    NodePower: "agent",
    PolicyApplied: "ctl",
    NodeMuted: "control",
    NodeUnmuted: "ctl",
    NodeAdmitted: "ctl",
    UsageReported: "gw",
}


def tag_of(cls: type[Event]) -> str:
    return cls.__struct_config__.tag  # type: ignore[return-value]


TAGS: dict[str, type[Event]] = {tag_of(c): c for c in EVENT_TYPES}

_decoder = msgspec.json.Decoder(AnyEvent)
_encoder = msgspec.json.Encoder()


def decode(data: bytes) -> Event:
    """Decode one event; raises msgspec.DecodeError/ValidationError on bad input."""
    return _decoder.decode(data)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


class OriginError(ValueError):
    """An event arrived on a subject whose speaker may not say it."""


def subject_for(event: Event, *, gateway: str = "") -> str:
    """The subject an event is published on: who speaks, then what it is."""
    origin = ORIGIN[type(event)]
    tag = tag_of(type(event))
    if origin == "agent":
        return f"llmgw.agent.{event.node}.{tag}"  # type: ignore[attr-defined]
    if origin == "gw":
        return f"llmgw.gw.{gateway or event.gateway}.{tag}"  # type: ignore[attr-defined]
    return f"llmgw.{origin}.{tag}"


def check_origin(subject: str, event: Event) -> None:
    """Refuse an event whose subject does not match who may say it.

    The subject is what NATS permissions can restrict per credential, so it is
    the trustworthy part: an agent for node A must not speak for node B.
    (Written for speed: it runs once per event of every replay.)
    """
    prefix = _PREFIX[type(event)]
    if not subject.startswith(prefix):
        raise OriginError(f"{tag_of(type(event))} may only be published under {prefix}, not on {subject}")
    if prefix == "llmgw.agent.":
        node = event.node  # type: ignore[attr-defined]
        end = 12 + len(node)
        if subject[12:end] != node or subject[end : end + 1] != ".":
            speaker = subject[12:].partition(".")[0]
            raise OriginError(f"an agent on {speaker} may not speak for node {node}")
    elif prefix == "llmgw.gw.":
        gateway = event.gateway  # type: ignore[attr-defined]
        if subject[9 : 9 + len(gateway) + 1] != gateway + ".":
            speaker = subject[9:].partition(".")[0]
            raise OriginError(f"gateway {speaker} may not speak for gateway {gateway}")


# One string object per origin, so the fold can compare prefixes by identity.
_ORIGIN_PREFIX = {origin: f"llmgw.{origin}." for origin in set(ORIGIN.values())}
_PREFIX: dict[type[Event], str] = {cls: _ORIGIN_PREFIX[origin] for cls, origin in ORIGIN.items()}
