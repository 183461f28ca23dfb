"""What a node's agent says (on `llmgw.agent.<node>.>`, for its own node
only): it registered, a shard's state, ports another program holds, what
its GPUs draw."""

from __future__ import annotations

from .. import bounds as b
from .base import Event
from .records import Gpu, RunningShard, ShardState


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
