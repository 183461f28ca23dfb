"""The folded state: everything the control plane knows, built only from the log.

Plain msgspec Structs, so a snapshot is one `msgspec.msgpack.encode` and two
states compare with `==` (the property tests lean on that). The state is a
tree, never a cycle, so its structs are not tracked by Python's cycle
collector (`gc=False`): at 16,000 nodes the collector's passes over a
million live objects were a third of a cold start and most of a
snapshot's decode (issue 18), and nothing of the state needs it. Dicts keep the
order in which the log created their entries, which is deterministic; rules
that must not depend on it sort explicitly.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..contract.events import Cause, Gpu, Limit, ModelSpec, Resources
from ..contract.policy import Policy

# Shard and replica states, typed as the events' are (ShardState): msgspec
# refuses a snapshot with any other. A replica's state follows from its
# shards' (see replicas.derive_replica_state) except "stopping", which is a
# decision; "stopped" is a shard's alone (a replica whose shards all stopped
# is gone, or failed when nobody asked it to stop).
ShardState = Literal["placing", "starting", "loading", "ready", "stopping", "failed", "stopped"]
ReplicaState = Literal["placing", "starting", "loading", "ready", "stopping", "failed"]
NodeState = Literal["ready", "lost"]
# Where a replica's restart stands: none, replaced beside itself, stopped for
# its replacement, or given up (it serves on); why is Replica.restart_reason.
RestartState = Literal["", "replacing", "in place", "refused"]
LIVE_SHARD_STATES = ("placing", "starting", "loading", "ready", "stopping")
TERMINAL_SHARD_STATES = ("failed", "stopped")


class Shard(msgspec.Struct, kw_only=True, gc=False):
    id: str
    node: str
    rank: int
    gpus: list[int]
    port: int
    generation: int
    state: ShardState = "placing"
    reason: str = ""
    endpoint: str = ""
    identity: str = ""  # what its engine answers to (ShardStatus.identity)
    # Host memory and CPU cores it holds on its node, from its profile when
    # placed: kept here so that its exit frees them whatever the catalog says by then.
    memory_gb: float = 0.0
    cpu_cores: int = 0
    # Shards on its node that must exit before it starts: those of the
    # replica it replaces in place, whose GPUs and port it took over.
    after: list[str] = []
    # Facility (folding/facility_facts.py): what it is counted as drawing until its node's
    # agent measures it (its profile's power_w, else its GPUs' power limits),
    # and whether a measurement of its node has covered it since it was ready.
    power_w: float = 0.0
    measured: bool = False


class Replica(msgspec.Struct, kw_only=True, gc=False):
    id: str
    model: str
    profile: str
    fingerprint: str
    shards: list[Shard]
    state: ReplicaState = "placing"
    reason: str = ""
    placed_at: float = 0.0
    ready_at: float = 0.0
    stopping_at: float = 0.0
    drain_s: float = 0.0  # stopping: how long it may finish the requests it has
    # Where its restart stands, and why: the reason it was asked for while it
    # restarts, the reason it was given up once refused.
    restart: RestartState = ""
    restart_reason: str = ""
    restart_in_place: bool = False  # asked for in place (ctl restart --in-place)
    retiring_at: float = 0.0  # when its restart began
    replaced: str = ""  # the replica it took the place of (a restart in place)
    # Adopted, and being rebuilt from what agents report: the shards it must
    # have before it can serve (0: whole). Set only while it is short.
    want_shards: int = 0
    # Its model's owner when placed: what it holds counts for that owner
    # (and up its tree) until it exits, whatever the catalog says meanwhile.
    owner: str = ""
    preempted_for: str = ""  # the model it was stopped to make room for
    # The facility's refusals its placement met (PlaceReplica.rejections).
    rejections: list[str] = []


class Stray(msgspec.Struct, kw_only=True, gc=False):
    """A running shard no model claims. It keeps its GPUs and port until it
    exits: handing its port to a new shard would make that one fail to bind,
    fail its replica, and be placed on the same port again, without end."""

    generation: int
    gpus: list[int] = []
    port: int = 0
    reason: str = ""  # `cause` in words
    stopping: bool = False
    cause: Cause | None = None  # why it is one (reasons.py): its StopStray says it


class Node(msgspec.Struct, kw_only=True, gc=False):
    name: str
    gpus: list[Gpu]
    memory_gb: float = 0.0
    cpu_cores: int = 0
    labels: dict[str, str] = {}
    state: NodeState = "ready"
    reason: str = ""
    agent: str = ""
    registered_at: float = 0.0
    # GPU index -> shard id holding it. A GPU is in here exactly while a live
    # shard holds it: the invariant "no GPU given twice" is about this map.
    used: dict[int, str] = {}
    # port -> shard id, ports held by live shards and by strays until they exit.
    ports: dict[int, str] = {}
    # Host memory (GB) and CPU cores held by its live shards, derived like
    # `used`. A stray holds none here: agents do not say what one takes.
    memory_used: float = 0.0
    cpu_used: int = 0
    # Shards the agent runs that no model claims, until they exit.
    strays: dict[str, "Stray"] = {}
    # The ports its engines may be given, first to last (0 and 0: the
    # default range, see ports.port_range).
    port_first: int = 0
    port_last: int = 0
    simulated: bool = False  # its agent is simulated (NodeRegistered.simulated): no real engine runs here
    # Ports of that range another program holds, sorted, as its agent last
    # said (NodeRegistered.ports_taken, NodePorts): never handed out while
    # listed. Apart from `ports`, which is what shards and strays hold.
    taken: list[int] = []
    # Facility (folding/facility_facts.py). Location labels an operator set (`llmgw ctl
    # label`), whole names, over the agent's `labels` (a copy of
    # State.node_labels, which outlives registrations).
    operator_labels: dict[str, str] = {}
    # Labels the operator decides (admission.RESTRICTED: the pool) as its
    # agent claimed them: they steer nothing unless an operator set them
    # too, or the policy is `admission: open` (admission.py); `labels`
    # holds the values that count.
    claims: dict[str, str] = {}
    # Why placement passes it over though it is ready ("" : it does not):
    # under `admission: manual`, not admitted, or claiming more GPUs than
    # it was admitted with (admission.settle).
    cordon: str = ""
    # What its GPUs draw, as its agent last measured (NodePower), and when;
    # and its live shards not covered by a measurement yet, with the draw
    # each is counted at meanwhile (derived, like `used`).
    power_w: float = 0.0
    power_gpus: dict[int, float] = {}
    power_at: float = 0.0
    unmeasured: dict[str, float] = {}


class Tally(msgspec.Struct, kw_only=True, gc=False):
    """How a model's replicas stand, kept by the fold so that a pass of
    `decide` knows which models need a look without reading every replica.

    Counted over the model's replicas that are not stopping: `live` all of
    them, `failed` those failed, `unwanted` those the catalog no longer asks
    for (the model removed, or their profile changed). Derived, like a node's
    `used`: the property tests count again from the replicas and compare.
    """

    live: int = 0
    failed: int = 0
    unwanted: int = 0
    retiring: int = 0  # restarting: replaced beside themselves, not counted as serving
    assembling: int = 0  # adopted, with shards still to be reported (Replica.want_shards)


class Load(msgspec.Struct, kw_only=True, gc=False):
    """One gateway's last word on a model's load."""

    in_flight: int = 0
    queued: int = 0
    at: float = 0.0


class Peak(msgspec.Struct, kw_only=True, array_like=True):
    """How many replicas the load asked for at a time (see Model.peaks)."""

    at: float
    wants: int


class Model(msgspec.Struct, kw_only=True, gc=False):
    spec: ModelSpec
    # Fingerprint per profile name, computed once when the spec is folded.
    fingerprints: dict[str, str] = {}
    waiting: str = ""  # why it has fewer replicas than it wants; "" when it has them
    waiting_kind: str = ""  # the same as data: a waits.WaitKind's value ("" when not waiting)
    applied_at: float = 0.0
    # What follows is kept when the model is applied again (see RUNTIME).
    # How many replicas it should run, as last decided (ScaleModel); -1: as
    # the catalog says, min_replicas.
    desired: int = -1
    load: dict[str, Load] = {}  # gateway -> its last report
    last_used: float = 0.0  # the last request any gateway sent it
    # What the load asked for lately, newest last, each entry asking for more
    # than every later one: the most asked for within the scale-down delay is
    # the first entry not older than it. Bounded by max_replicas.
    peaks: list[Peak] = []
    # Replicas that failed before ever being ready, in a row; the last one's reason and time.
    start_failures: int = 0
    last_failure: str = ""
    failed_at: float = 0.0
    parked: str = ""  # why it is placed no more (until `llmgw ctl retry`); "" when not
    # Restarts asked for and not begun, in order; and how many at once.
    restart_queue: list[str] = []
    restart_surge: int = 0
    restart_unavailable: int = 0
    # It gave room to `held_for` and may not take it back before
    # `held_until` (or before that model has what it asked for).
    held_until: float = 0.0
    held_for: str = ""
    # Replicas stopped to make room for it: it waits for them to go.
    preempting: list[str] = []
    # Nodes where a replica of it was not ready by its start deadline
    # (admission.py), until one of its replicas is ready: they count as
    # holding one of its replicas more for spread, so that the next goes
    # elsewhere where it can. Without it, best fit (fewest GPUs free) gave
    # every retry to the node that never started the first.
    late_nodes: list[str] = []
    # Where the gateways sent its requests, and why (ModelLoad.routes, summed):
    # replica -> {reason: requests, "prompt_tokens", "cached_tokens", "hits"}.
    # Only replicas the state has are counted; one that left is dropped.
    routed: dict[str, dict[str, int]] = {}


# The fields of a Model that a new definition of it does not reset.
RUNTIME = (
    "desired", "load", "last_used", "peaks", "start_failures", "last_failure", "failed_at", "parked",
    "restart_queue", "restart_surge", "restart_unavailable", "held_until", "held_for", "preempting", "late_nodes",
    "routed",
)


class Owner(msgspec.Struct, kw_only=True, gc=False):
    guarantee: Resources = msgspec.field(default_factory=Resources)
    limit: Limit = msgspec.field(default_factory=Limit)
    requests_per_minute: int = 0  # of its keys together, at every gateway (0: no limit)
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    spend_per_day: float = 0.0
    spend_per_month: float = 0.0


class ApiKey(msgspec.Struct, kw_only=True, gc=False):
    owner: str
    key_sha256: str
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    spend_per_day: float = 0.0
    spend_per_month: float = 0.0


class Hold(msgspec.Struct, kw_only=True, gc=False):
    """A facility domain an operator held (`llmgw ctl facility hold`)."""

    reason: str = ""
    since: float = 0.0
    drain: bool = False


class Admitted(msgspec.Struct, kw_only=True, gc=False):
    """What an operator admitted of a node (NodeAdmitted): the most GPUs it
    may claim, of these models."""

    gpus: int = 0
    gpu_models: list[str] = []


class Quarantined(msgspec.Struct, kw_only=True, gc=False):
    seq: int
    subject: str
    error: str


class Voided(msgspec.Struct, kw_only=True, gc=False):
    seq: int
    action: str
    reason: str


class State(msgspec.Struct, kw_only=True, weakref=True):
    # (weakref: placement's node index lives beside a state, not in it; see nodeindex.py)
    seq: int = 0  # the last stream sequence folded
    control_seq: int = 0  # the last sequence folded from llmgw.control.>
    models: dict[str, Model] = {}
    nodes: dict[str, Node] = {}
    replicas: dict[str, Replica] = {}
    # Next number per model for replica ids. Never forgotten, not even when the
    # model is removed, so an id is never used twice in one log.
    replica_numbers: dict[str, int] = {}
    # Model name -> how its replicas stand (see Tally). Kept, like
    # replica_numbers, for names no longer in the catalog.
    tallies: dict[str, Tally] = {}
    api_keys: dict[str, ApiKey] = {}  # by name
    # Nodes whose agent's credential was revoked, and the sequence of the
    # revocation: lost once decided so, until the node registers again.
    revoked_nodes: dict[str, int] = {}
    # Nodes muted for speaking past their rate (NodeMuted), and why: the
    # fold quarantines what their agents say until they are unmuted.
    muted: dict[str, str] = {}
    owners: dict[str, Owner] = {}  # by path ("org/team")
    # What the live shards of each owner's replicas hold, counted for the
    # owner and every ancestor ("org/team" counts for "org" too); derived,
    # like a node's `used`, and kept as the shards come and go.
    usage: dict[str, Resources] = {}
    # Who leads, from the last LeaderElected: its term, its id and since when.
    term: int = 0
    leader: str = ""
    leader_since: float = 0.0
    # Facility (folding/facility_facts.py): location labels set by operators, per node
    # (whole names; kept for nodes not registered yet), held domains, and
    # the power cap in watts of each domain that has one.
    node_labels: dict[str, dict[str, str]] = {}
    holds: dict[str, Hold] = {}
    budgets: dict[str, float] = {}
    # Derived (facility_facts.relocate), so that a pass and the fold's checks read
    # a node's domains and a domain's nodes without a scan of the fleet:
    # node -> its domains (only nodes with a location), domain -> its nodes.
    located: dict[str, tuple[str, ...]] = {}
    domain_nodes: dict[str, list[str]] = {}
    # Derived too: each domain's counted draw in watts (facility_facts.node_draw
    # summed over its nodes), kept as the nodes' draws change, so that the
    # fold's check of a placement and a pass read it instead of summing the
    # domain's nodes (facility_facts.domain_draws, the same sum made afresh).
    domain_draw: dict[str, float] = {}
    # The last limits.LIMITS.kept_verbatim quarantined events and voided
    # actions, verbatim; the counters go on counting (the log keeps all).
    quarantine_count: int = 0
    quarantined: list[Quarantined] = []
    voided_count: int = 0
    voided: list[Voided] = []
    # The numbers the rules decide with, as the last PolicyApplied said.
    policy: Policy = msgspec.field(default_factory=Policy)
    # Nodes an operator admitted (`ctl node admit`), kept for nodes not
    # registered now too: what they may claim (admission.py).
    admitted: dict[str, Admitted] = {}
    # Replicas placed and never ready yet, by id, with when they were placed,
    # in log order: the candidates for the start deadline (admission.py).
    # Kept as placements land, replicas become ready and replicas go.
    unstarted: dict[str, float] = {}


def add_gb(a: float, b: float) -> float:
    """Sum of two amounts of memory, rounded to the megabyte.

    Host memory is accounted by adding and taking away what each shard
    holds; rounding every step keeps the sum from drifting by float error,
    and the fold and `decide` round the same way, so that they agree on
    whether a shard still fits to the last byte.

    A whole number of GB (most amounts) is its own rounding, and round(x, 3)
    costs ten times is_integer: the fold adds at every shard's start and end
    (benchmarks/replay.py --mixes decisions).
    """
    x = a + b
    return x if x.is_integer() else round(x, 3)


def gpus_in_use(state: State) -> list[tuple[str, int, str]]:
    """(node, gpu index, shard) for every GPU held, from the shards' side."""
    out = []
    for r in state.replicas.values():
        for s in r.shards:
            if s.state in LIVE_SHARD_STATES:
                for g in s.gpus:
                    out.append((s.node, g, s.id))
    return out
