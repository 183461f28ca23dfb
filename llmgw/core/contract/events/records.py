"""The records events carry, not events themselves: the catalog's (a
model, its profiles, an owner's resources and limits) and the fleet's (a
GPU, a shard an agent says it runs)."""

from __future__ import annotations

from typing import Literal

from .. import bounds as b
from .base import Struct


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
