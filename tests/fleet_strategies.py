"""A random world for the property tests of the pure core.

`World` holds a small random fleet and catalog and, one step at a time, grows
a log exactly as the shell would write it: (seq, subject, data bytes), each
message folded into the "live" state with `fold.apply` as it is appended. The
steps are what the real system sees: models applied (sometimes with a changed
spec) and removed, agents registering (reporting some of what the fold
believes runs there, sometimes with a stale generation, and sometimes shards
this log never placed: strays, or replicas to adopt, the shards of a
multi-node one reported by their agents one by one), nodes lost, shard status
reports (sometimes stale), agents saying which ports of their range other
programs hold (often one a shard was just placed on), gateways' load,
operators' restarts (beside, in place, paced) and retries, malformed
messages, and control-plane passes, some
of them deliberately decided on an older state, as a deposed leader would
publish them. With `rogue=True` some
decisions are made up outright (GPUs and ports someone holds, ids used
before, nodes lost or unknown), to press the fold's voiding rules harder than
any honest `decide` would.

Models are of every class and owner, and owners with guarantees and limits
are applied at a warm start and now and then after: preemption and quotas
read them (PRIORITIES, OWNERS).

The fleet is mixed on purpose: GPUs of several models and sizes, nodes that
say their host memory and cores or do not (0), some in a pool, some on one of
two fabrics and some on none; profiles ask for GPU models, GPU memory, host
memory, cores and pools, and span one to three nodes, so that placement meets
every rule and multi-node replicas are common. Models scale on load or on
demand now and then (SCALINGS). With `plain=True` profiles ask for GPUs only
and with `warm`, `min_steps` and `forgetful=False` worlds run longer and
calmer, so that replicas come up and restarts get to finish.

Every choice is drawn from a hypothesis `data` object, so a failing run
shrinks to a short sequence of steps. No NATS, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import profile_named
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply, decode_state, encode_state
from llmgw.core.scheduling.ports import port_range
from llmgw.core.contract.policy import Policy
from llmgw.core.folding.state import LIVE_SHARD_STATES, State

GPU_MEMORY_GB = (16.0, 24.0, 40.0, 80.0)
PROFILE_MEMORY_GB = (0.0, 16.0, 40.0, 80.0)
# What agents report, and what profiles ask for ("" asks nothing); "H100"
# matches the first two by whole words, "A100" the third.
GPU_MODELS = ("NVIDIA H100 80GB HBM3", "H100-SXM", "NVIDIA A100-SXM4-40GB", "sim", "")
PROFILE_GPU_MODELS = ("", "", "", "H100", "A100", "L4")
HOST_MEMORY_GB = (0.0, 64.0, 256.0)  # 0: not said, no limit
PROFILE_HOST_MEMORY_GB = (0.0, 0.0, 0.0, 16.0, 48.0, 128.0)
CPU_CORES = (0, 8, 32)
PROFILE_CPU_CORES = (0, 0, 0, 2, 6, 16)
POOLS = ("", "serve", "batch")
PROFILE_POOLS = ("", "", "", "serve", "batch")
FABRICS = ("ib-0", "ib-0", "ib-0", "ib-1", "")
NODE_NAMES = ("n0", "n1", "gpu-2", "node_3", "N4", "n-5")
# Names that stress replica ids ("<model>-<n>") and shard ids ("<replica>.<rank>").
MODEL_NAMES = ("m", "m-1", "org/llama-3.1:8b", "m.0", "qwen")
SHARD_STATES = ("starting", "loading", "ready", "failed", "stopped")
# What agents report, weighted towards shards coming up, so that replicas get ready.
REPORTED_STATES = ("ready", "loading", "starting", "ready", "failed", "stopped", "ready")
RUNNING_STATES = ("starting", "loading", "ready")
PORTS = (0, 20000, 20001, 20002, 20003)
# Ports other programs hold on a node, as its agent says (NodeRegistered.ports_taken,
# NodePorts): among those placement hands out first, and one past PORTS.
OTHERS_PORTS = (20000, 20001, 20002, 20004)
# A node's engine port range: mostly the default; sometimes four ports, so
# that other programs' ports can fill it.
PORT_RANGES = ((0, 0), (0, 0), (0, 0), (20001, 20004))
# How a model scales: (target_load, on_demand, scale_down_delay_s, idle_s,
# drain_grace_s), with times of the order of a few steps (0-30 s each).
# Mostly the catalog's minimum only, as most models are.
SCALINGS = (
    (0.0, False, 300.0, 600.0, 30.0),
    (0.0, False, 300.0, 600.0, 30.0),
    (0.0, False, 300.0, 600.0, 0.0),
    (2.0, False, 30.0, 600.0, 20.0),
    (1.0, False, 0.0, 600.0, 60.0),
    (0.0, True, 300.0, 60.0, 20.0),
    (3.0, True, 60.0, 30.0, 0.0),
)
GATEWAYS = ("gw-1", "gw-2")
# Classes and owners: what preemption and quotas read. Without them every
# model was "standard" with no owner, so only tier-3 preemption ever happened
# and a restart that stopped its model's only replica while another model's
# was preempted for it went unseen (issue 11).
PRIORITIES = ("critical", "standard", "opportunistic")
# Owners as paths: an organisation, two of its teams, another one, and none.
OWNERS = ("lab", "lab/vision", "lab/nlp", "shop", "")
OWNER_NAMES = ("lab", "lab/vision", "lab/nlp", "shop")
# The facility (World(facility=True)): where nodes are (agents' labels and
# operators' ctl label), power limits of GPUs, profiles' declared draw and
# keep_within, caps, holds (some draining) and measured draw: every
# dimension core/scheduling/facility.py reads. Few names, so that domains are shared.
RACKS = ("r1", "r1", "r2", "r3", "")
PDUS = ("pa", "pa", "pb", "")
ROWS = ("", "", "row-1")
GPU_POWER_W = (0.0, 300.0, 700.0)
PROFILE_POWER_W = (0.0, 0.0, 250.0, 900.0)
KEEP_WITHIN = ("", "", "rack", "pdu", "row")
DOMAINS = ("rack/r1", "rack/r2", "rack/r3", "pdu/pa", "pdu/pb", "row/row-1", "rack/r9")
CAPS_W = (400.0, 1000.0, 1500.0, 3000.0, 8000.0)

Record = tuple[int, str, bytes]

_SAMPLED: dict[tuple, st.SearchStrategy] = {}


def sampled_from(options) -> st.SearchStrategy:
    """`st.sampled_from`, one strategy per tuple of options: hypothesis
    validates each new strategy object on its first draw, which made up
    most of the time these worlds took."""
    key = tuple(options)
    try:
        strategy = _SAMPLED.get(key)
    except TypeError:  # unhashable options (lists, structs): not cached
        return st.sampled_from(key)
    if strategy is None:
        if len(_SAMPLED) > 50_000:
            _SAMPLED.clear()
        strategy = _SAMPLED[key] = st.sampled_from(key)
    return strategy


# --------------------------------------------------------------------------- fleet and catalog


@st.composite
def node_gpus(draw) -> list[ev.Gpu]:
    count = draw(st.integers(1, 8))
    if draw(st.booleans()):  # most nodes have one kind of GPU
        mem = draw(sampled_from(GPU_MEMORY_GB))
        model = draw(sampled_from(GPU_MODELS))
        return [ev.Gpu(index=i, model=model, memory_gb=mem) for i in range(count)]
    return [
        ev.Gpu(index=i, model=draw(sampled_from(GPU_MODELS)), memory_gb=draw(sampled_from(GPU_MEMORY_GB)))
        for i in range(count)
    ]


@dataclass(frozen=True)
class NodeFacts:
    """What an agent says of its node besides its GPUs; the same at every registration."""

    memory_gb: float
    cpu_cores: int
    labels: dict[str, str]
    ports: tuple[int, int] = (0, 0)  # first and last engine port (0, 0: the default)
    simulated: bool = False  # a simulated agent's node: no real engine's profile goes there (fit.SIMULATED)


@st.composite
def node_facts(draw, facility: bool = False) -> NodeFacts:
    labels = {"zone": "a"}
    pool, fabric = draw(sampled_from(POOLS)), draw(sampled_from(FABRICS))
    if pool:
        labels["llmgw.io/pool"] = pool
    if fabric:
        labels["llmgw.io/fabric"] = fabric
    if facility:
        for kind, names in (("rack", RACKS), ("pdu", PDUS), ("row", ROWS)):
            name = draw(sampled_from(names))
            if name:
                labels[f"llmgw.io/{kind}"] = name
    return NodeFacts(
        memory_gb=draw(sampled_from(HOST_MEMORY_GB)), cpu_cores=draw(sampled_from(CPU_CORES)), labels=labels,
        ports=draw(sampled_from(PORT_RANGES)), simulated=draw(sampled_from([False, False, True])),
    )


@st.composite
def fleets(draw, facility: bool = False) -> dict[str, list[ev.Gpu]]:
    """1-6 nodes, 1-8 GPUs each: node name -> its GPUs (as its agent reports them);
    with `facility`, GPUs that say their power limit."""
    names = draw(st.lists(sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True))
    out = {name: draw(node_gpus()) for name in names}
    if facility:
        for name, gpus in out.items():
            w = draw(sampled_from(GPU_POWER_W))
            out[name] = [msgspec.structs.replace(g, power_w=w) for g in gpus]
    return out


@st.composite
def profile_specs(draw, name: str, plain: bool = False, facility: bool = False) -> ev.ProfileSpec:
    p = draw(_profile_specs(name, plain))
    if facility:
        p = msgspec.structs.replace(
            p, power_w=draw(sampled_from(PROFILE_POWER_W)),
            keep_within=draw(sampled_from(KEEP_WITHIN)) if p.nodes > 1 else "",
        )
    return p


@st.composite
def _profile_specs(draw, name: str, plain: bool = False) -> ev.ProfileSpec:
    if plain:  # GPUs only, as most profiles are: replicas that fit and come up, to restart
        return ev.ProfileSpec(
            name=name,
            args=draw(sampled_from([[], ["--fast"]])),
            gpus=draw(sampled_from([0, 1, 1, 2])),
            nodes=draw(sampled_from([1, 1, 1, 2])),
            memory_gb=draw(sampled_from([0.0, 0.0, 16.0])),
        )
    return ev.ProfileSpec(
        name=name,
        # A real engine's profile goes on no simulated node unless it says `simulate`.
        engine=draw(sampled_from(["sim", "sim", "llama.cpp"])),
        simulate=draw(sampled_from([False, False, True])),
        args=draw(sampled_from([[], ["--fast"], ["--tp", "2"]])),
        gpus=draw(st.integers(0, 4)),
        nodes=draw(sampled_from([1, 1, 2, 3])),
        gpu_memory_gb=draw(sampled_from(PROFILE_MEMORY_GB)),
        gpu_model=draw(sampled_from(PROFILE_GPU_MODELS)),
        memory_gb=draw(sampled_from(PROFILE_HOST_MEMORY_GB)),
        cpu_cores=draw(sampled_from(PROFILE_CPU_CORES)),
        pool=draw(sampled_from(PROFILE_POOLS)),
    )


@st.composite
def model_specs(draw, name: str, plain: bool = False, facility: bool = False) -> ev.ModelSpec:
    count = draw(st.integers(1, 3))
    names = draw(st.permutations(["p0", "p1", "p2"]))[:count]
    min_replicas = draw(st.integers(0, 4))
    target_load, on_demand, delay, idle, drain = draw(sampled_from(SCALINGS))
    return ev.ModelSpec(
        name=name,
        profiles=[draw(profile_specs(p, plain, facility)) for p in names],
        min_replicas=min_replicas,
        max_replicas=draw(sampled_from([0, 0, min_replicas + 1, min_replicas + 3])),
        target_load=target_load,
        on_demand=on_demand,
        scale_down_delay_s=delay,
        idle_s=idle,
        drain_grace_s=drain,
        owner=draw(sampled_from(OWNERS)),
        priority=draw(sampled_from(PRIORITIES)),
    )


@st.composite
def owner_events(draw, name: str, at: float) -> ev.OwnerApplied:
    """An owner with a guarantee (sometimes none) and a limit (sometimes none)."""
    limit_gpus = draw(sampled_from([None, None, 2, 3, 5, 8]))
    return ev.OwnerApplied(
        at=at,
        name=name,
        guarantee=ev.Resources(gpus=draw(sampled_from([0, 1, 2, 3]))),
        limit=ev.Limit(gpus=limit_gpus, cpu_cores=draw(sampled_from([None, None, None, 8]))),
    )


@st.composite
def catalogs(draw, plain: bool = False, facility: bool = False) -> dict[str, ev.ModelSpec]:
    """1-5 models, each with 1-3 profiles (with `plain`, asking for GPUs only)."""
    names = draw(st.lists(sampled_from(MODEL_NAMES), min_size=1, max_size=5, unique=True))
    return {name: draw(model_specs(name, plain, facility)) for name in names}


@st.composite
def budgets(draw) -> dict[str, float]:
    """Power caps for some domains (some that no node is in)."""
    domains = draw(st.lists(sampled_from(DOMAINS), max_size=3, unique=True))
    return {d: draw(sampled_from(CAPS_W)) for d in domains}


# --------------------------------------------------------------------------- the world


@dataclass
class Step:
    """What one step did: at most one message appended to the log."""

    kind: str
    before: bytes  # the live state, encoded, before the step
    record: Record | None = None
    event: ev.Event | None = None
    malformed: bool = False
    fresh: bool = False  # a decision taken on the live state at the time
    detail: str = ""

    def state_before(self) -> State:
        return decode_state(self.before)


@dataclass
class World:
    data: st.DataObject
    stale: bool = True  # some decisions are taken on an older state
    rogue: bool = False  # some decisions are made up, as by a leader with a diverged view
    malformed: bool = True  # some messages are malformed
    warm: bool = False  # every world starts warm, not half of them
    plain: bool = False  # profiles ask for GPUs only (see profile_specs)
    min_steps: int = 1  # after the warm start, if any
    forgetful: bool = True  # registrations leave out half of what runs (else one in eight)
    facility: bool = False  # locations, power, caps, holds and drains (see RACKS)
    fleet: dict[str, list[ev.Gpu]] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    catalog: dict[str, ev.ModelSpec] = field(default_factory=dict)
    live: State = field(default_factory=State)
    log: list[Record] = field(default_factory=list)
    states: list[bytes] = field(default_factory=list)  # states[seq]: the state once seq is folded
    now: float = 1000.0
    # (node, shard) -> the replica an agent named when it reported the stray.
    stray_replicas: dict[tuple[str, str], str] = field(default_factory=dict)
    ghosts: int = 0
    # Shards of multi-node replicas no log placed (a fleet outliving its log),
    # still to be reported by the agent of their node: node -> shards.
    halves: dict[str, list[ev.RunningShard]] = field(default_factory=dict)
    # Every replica id the live state ever had, with its model.
    replicas_seen: dict[str, str] = field(default_factory=dict)
    # The owners applied at a warm start (models name others too: no quota).
    owner_names: list[str] | None = None

    def __post_init__(self) -> None:
        if self.owner_names is None:
            self.owner_names = self.draw(
                st.lists(sampled_from(OWNER_NAMES), max_size=len(OWNER_NAMES), unique=True), "owners"
            )
        self.fleet = self.fleet or self.draw(fleets(self.facility), "fleet")
        self.facts = self.facts or {
            name: self.draw(node_facts(self.facility), f"facts of {name}") for name in sorted(self.fleet)
        }
        self.catalog = self.catalog or self.draw(catalogs(self.plain, self.facility), "catalog")
        self.states = [encode_state(self.live)]

    def draw(self, strategy, label: str | None = None):
        return self.data.draw(strategy, label=label)

    # ------------------------------------------------------------------ the log

    def append(self, subject: str, data: bytes) -> Record:
        seq = len(self.log) + 1
        record = (seq, subject, data)
        self.log.append(record)
        apply(self.live, seq, subject, data)
        self.states.append(encode_state(self.live))
        for rid, rep in self.live.replicas.items():
            self.replicas_seen.setdefault(rid, rep.model)
        return record

    def publish(self, event: ev.Event, subject: str | None = None) -> Record:
        return self.append(subject or ev.subject_for(event), ev.encode(event))

    def tick(self) -> float:
        self.now += self.draw(st.integers(0, 30))
        return self.now

    # ------------------------------------------------------------------ steps

    def kinds(self) -> list[str]:
        kinds = ["decide", "status", "apply", "register", "decide", "status", "apply", "status", "register"]
        kinds += ["status", "decide", "remove", "lose", "load", "restart", "retry", "owner", "ports", "ports"]
        kinds += ["admit", "admit", "policy", "policy"]
        if self.stale:
            kinds += ["stale", "stale"]
        if self.rogue:
            kinds.append("rogue")
        if self.malformed:
            kinds.append("malformed")
        if self.facility:
            kinds += ["label", "hold", "hold", "release", "budget", "power", "power", "up", "up", "up", "decide"]
        return kinds

    def step(self) -> Step:
        kind = self.draw(sampled_from(self.kinds()), "step")
        step = Step(kind=kind, before=self.states[-1])
        getattr(self, f"_step_{kind}")(step)
        return step

    def run(self, max_steps: int = 40):
        """Yield each step as it is taken (the state after it is `self.live`).

        Half the worlds start warm (all of them with `warm`): every node
        registered and every model applied first, so that the random steps
        find something to act on."""
        if self.warm or self.draw(st.booleans(), "warm start"):
            for name in sorted(self.owner_names or ()):
                step = Step(kind="owner", before=self.states[-1])
                self._emit(step, self.draw(owner_events(name, self.tick()), f"owner {name}"))
                yield step
            for name in sorted(self.fleet):
                step = Step(kind="register", before=self.states[-1])
                self._step_register(step, name)
                yield step
            if self.draw(st.booleans(), "pools admitted at the start"):
                # An operator admits what the nodes claim (`ctl node admit`):
                # without it no pool counts, and pool rules meet nothing.
                for name in sorted(self.fleet):
                    claimed = self.facts[name].labels.get("llmgw.io/pool", "")
                    if claimed:
                        step = Step(kind="admit", before=self.states[-1])
                        self._emit(step, ev.NodeLabeled(at=self.tick(), node=name, set={"pool": claimed}))
                        yield step
            if self.facility:
                step = Step(kind="budget", before=self.states[-1])
                self._step_budget(step)
                yield step
            for name in sorted(self.catalog):
                step = Step(kind="apply", before=self.states[-1])
                self._emit(step, ev.ModelApplied(at=self.tick(), model=self.catalog[name]))
                yield step
        for _ in range(self.draw(st.integers(min(self.min_steps, max_steps), max_steps), "steps")):
            yield self.step()

    def _emit(self, step: Step, event: ev.Event, subject: str | None = None) -> None:
        step.event = event
        step.record = self.publish(event, subject)

    def _step_apply(self, step: Step) -> None:
        name = self.draw(sampled_from(sorted(self.catalog)))
        spec = self.catalog[name]
        if self.draw(st.booleans()):
            spec = self.draw(model_specs(name, self.plain, self.facility))  # a changed spec
        self._emit(step, ev.ModelApplied(at=self.tick(), model=spec))

    # ------------------------------------------------------------------ admission (core/rules/admission.py)

    def _step_admit(self, step: Step) -> None:
        """An operator sets a node's pool (`llmgw ctl label NODE pool=`, or `ctl
        node admit`, often what the node claims) or removes it: a node's own
        claim counts only so (or under `admission: open`)."""
        name = self.draw(sampled_from(sorted(self.fleet)))
        claimed = self.facts[name].labels.get("llmgw.io/pool", "")
        if self.draw(st.booleans()):  # `ctl node admit`: its GPUs as claimed, or fewer (it claims more since)
            gpus = self.fleet[name]
            count = self.draw(st.integers(max(len(gpus) - 2, 0), len(gpus)))
            models = sorted({g.model for g in gpus[:count]})
            self._emit(step, ev.NodeAdmitted(at=self.tick(), node=name, gpus=count, gpu_models=models, pool=claimed))
            return
        if self.draw(st.integers(0, 3)):
            pool = claimed if claimed and self.draw(st.booleans()) else self.draw(sampled_from([p for p in POOLS if p]))
            event = ev.NodeLabeled(at=self.tick(), node=name, set={"pool": pool})
        else:
            event = ev.NodeLabeled(at=self.tick(), node=name, remove=["pool"])
        self._emit(step, event)

    def _step_policy(self, step: Step) -> None:
        """An operator applies a policy: whose word counts for a node's pool,
        and a start deadline short enough to pass within a world's steps."""
        policy = Policy(
            admission=self.draw(sampled_from(("operator", "open", "manual"))),
            start_timeout_s=self.draw(sampled_from((45.0, 200.0, 1800.0))),
        )
        self._emit(step, ev.PolicyApplied(at=self.tick(), policy=policy))

    # ------------------------------------------------------------------ the facility

    def _step_label(self, step: Step) -> None:
        """An operator sets or removes a node's rack or PDU (`llmgw ctl label`)."""
        name = self.draw(sampled_from(sorted(self.fleet)))
        kind = self.draw(sampled_from(("rack", "pdu")))
        if self.draw(st.booleans()):
            names = RACKS if kind == "rack" else PDUS
            event = ev.NodeLabeled(at=self.tick(), node=name, set={kind: self.draw(sampled_from([n for n in names if n]))})
        else:
            event = ev.NodeLabeled(at=self.tick(), node=name, remove=[kind])
        self._emit(step, event)

    def _step_hold(self, step: Step) -> None:
        """An operator holds a domain, draining it or not (`llmgw ctl facility hold`):
        often one where ready replicas run, so that drains have something to move."""
        from llmgw.core.folding.facility_facts import domains_of

        busy = sorted({
            d for r in self.live.replicas.values() if r.state == "ready" for sh in r.shards
            if sh.node in self.live.nodes for d in domains_of(self.live.nodes[sh.node])
        })
        domains = busy if busy and self.draw(st.integers(0, 3)) else DOMAINS
        self._emit(step, ev.DomainHeld(
            at=self.tick(), domain=self.draw(sampled_from(domains)), drain=self.draw(st.integers(0, 2)) > 0,
            reason=self.draw(sampled_from(("maintenance", ""))),
        ))

    def _step_release(self, step: Step) -> None:
        held = sorted(self.live.holds)
        domain = self.draw(sampled_from(held)) if held and self.draw(st.integers(0, 3)) else self.draw(sampled_from(DOMAINS))
        self._emit(step, ev.DomainReleased(at=self.tick(), domain=domain))

    def _step_budget(self, step: Step) -> None:
        """The catalog's facility section applied (whole): caps for some domains."""
        self._emit(step, ev.FacilityApplied(at=self.tick(), budgets=self.draw(budgets(), "budgets")))

    def _step_power(self, step: Step) -> None:
        """An agent's measurement: its GPUs in use draw something, the others a little."""
        name = self.draw(sampled_from(sorted(self.fleet)))
        node = self.live.nodes.get(name)
        used = set(node.used) if node is not None else set()
        busy = self.draw(sampled_from((0.0, 150.0, 400.0, 800.0)), "watts per busy GPU")
        gpus = {g.index: busy if g.index in used else self.draw(sampled_from((0.0, 50.0))) for g in self.fleet[name]}
        self._emit(step, ev.NodePower(at=self.tick(), node=name, watts=sum(gpus.values()), gpus=gpus))

    def _step_owner(self, step: Step) -> None:
        """An owner applied (again), with another guarantee or limit."""
        name = self.draw(sampled_from(OWNER_NAMES))
        self._emit(step, self.draw(owner_events(name, self.tick())))

    def _step_remove(self, step: Step) -> None:
        name = self.draw(sampled_from(sorted(self.catalog)))
        self._emit(step, ev.ModelRemoved(at=self.tick(), name=name))

    def _step_lose(self, step: Step) -> None:
        name = self.draw(sampled_from(sorted(self.fleet)))
        self._emit(step, ev.NodeLost(at=self.tick(), node=name, reason="no heartbeat", basis=self.live.seq))

    def _step_register(self, step: Step, name: str = "") -> None:
        name = name or self.draw(sampled_from(sorted(self.fleet)))
        self._emit(step, self.registration(name))
        # Remember which replica each reported stray named, for its exit report.
        node = self.live.nodes.get(name)
        for r in step.event.running:  # type: ignore[union-attr]
            if node is not None and r.shard in node.strays:
                self.stray_replicas[(name, r.shard)] = r.replica

    def registration(self, name: str) -> ev.NodeRegistered:
        """What the agent on `name` says when it (re)connects.

        It reports a random part of what it really runs: the shards the fold
        believes run there (live first, then ones the fold gave up on when
        the node was lost, as after a network partition), the strays the fold
        knows of, sometimes with a stale generation, and sometimes a stray
        nobody placed. What it reports is physically consistent: no GPU and
        no port is reported twice.
        """
        gpus = self.fleet[name]
        state = self.live
        running: list[ev.RunningShard] = []
        taken_gpus: set[int] = set()
        taken_ports: set[int] = set()

        def fits(gs: list[int], port: int) -> bool:
            return not (set(gs) & taken_gpus) and not (port and port in taken_ports)

        def add(r: ev.RunningShard) -> None:
            running.append(r)
            taken_gpus.update(r.gpus)
            if r.port:
                taken_ports.add(r.port)

        ours = [(rep, sh) for rep in state.replicas.values() for sh in rep.shards if sh.node == name]
        ours.sort(key=lambda p: p[1].state not in LIVE_SHARD_STATES)  # live ones first
        node = state.nodes.get(name)
        predecessors: set[str] = set()
        for _, sh in ours:
            if sh.state == "placing" and sh.after:
                # Placed in place of shards that may still run here: what it
                # took over, they hold until they exit, and nothing else runs there.
                taken_gpus.update(sh.gpus)
                if sh.port:
                    taken_ports.add(sh.port)
                predecessors.update(sh.after)
        for rep, sh in ours:
            live = sh.state in LIVE_SHARD_STATES
            gone_with_the_node = sh.state == "failed" and node is not None and node.state == "lost"
            if not (live or gone_with_the_node) or (sh.id not in predecessors and not fits(sh.gpus, sh.port)):
                continue
            if not self.draw(st.booleans() if self.forgetful else st.integers(0, 7), f"report {sh.id}"):
                continue  # the agent lost it (an engine died while the agent lived)
            generation = sh.generation
            if self.draw(st.integers(0, 5)) == 0:
                generation -= self.draw(st.integers(1, 3))  # a stale incarnation
            add(
                ev.RunningShard(
                    shard=sh.id,
                    replica=rep.id,
                    model=rep.model,
                    profile=rep.profile,
                    generation=generation,
                    rank=sh.rank,
                    gpus=list(sh.gpus),
                    port=sh.port,
                    state=self.draw(sampled_from(RUNNING_STATES)),
                    endpoint=f"http://{name}:{sh.port}",
                )
            )
        if node is not None:
            for shard, stray in node.strays.items():
                if any(r.shard == shard for r in running) or not fits(stray.gpus, stray.port):
                    continue
                if self.draw(st.booleans(), f"report stray {shard}"):
                    replica = self.stray_replicas.get((name, shard), shard.rpartition(".")[0])
                    add(
                        ev.RunningShard(
                            shard=shard,
                            replica=replica,
                            model=replica.rpartition("-")[0],
                            profile="p0",
                            generation=stray.generation,
                            gpus=list(stray.gpus),
                            port=stray.port,
                        )
                    )
        # Halves of multi-node replicas no log placed, reported by the other agents one by one.
        for half in self.halves.pop(name, []):
            free = [g.index for g in gpus if g.index not in taken_gpus]
            ports = [p for p in PORTS if p and p not in taken_ports]
            if (
                len(free) < len(half.gpus) or not ports or any(r.shard == half.shard for r in running)
                or not self.draw(st.integers(0, 3), f"report {half.shard}")
            ):
                self.halves.setdefault(name, []).append(half)  # later, or never: it stays short
                continue
            add(msgspec.structs.replace(half, gpus=free[: len(half.gpus)], port=self.draw(sampled_from(ports))))
        if self.draw(st.integers(0, 2)) == 0:  # something running that this log did not place
            self._ghost(name, gpus, running, taken_gpus, taken_ports, add)
        facts = self.facts[name]
        # Ports other programs hold: never one of the agent's own engines'.
        others = [p for p in OTHERS_PORTS if p not in taken_ports]
        return ev.NodeRegistered(
            at=self.tick(),
            node=name,
            gpus=list(gpus),
            memory_gb=facts.memory_gb,
            cpu_cores=facts.cpu_cores,
            labels=dict(facts.labels),
            running=running,
            agent=f"agent-{name}",
            port_first=facts.ports[0],
            port_last=facts.ports[1],
            ports_taken=self.draw(st.lists(sampled_from(others), max_size=2, unique=True)) if others else [],
            simulated=facts.simulated,
        )

    def _step_ports(self, step: Step) -> None:
        """An agent says which ports other programs hold on its node now: some
        of OTHERS_PORTS, and often the port of a shard it was told to start
        there and refused for that reason (whose failure is a later status
        step); never the port of an engine it runs."""
        placing = sorted({sh.node for r in self.live.replicas.values() for sh in r.shards if sh.state == "placing"})
        if placing and self.draw(st.booleans(), "about a node with a start pending"):
            name = self.draw(sampled_from(placing))
        else:
            name = self.draw(sampled_from(sorted(self.fleet)))
        node = self.live.nodes.get(name)
        running: set[int] = set()
        refusable: list[int] = []
        for rep in self.live.replicas.values():
            for sh in rep.shards:
                if sh.node == name and sh.port:
                    if sh.state == "placing":
                        refusable.append(sh.port)
                    elif sh.state in LIVE_SHARD_STATES:
                        running.add(sh.port)
        if node is not None:
            running.update(s.port for s in node.strays.values() if s.port)
        candidates = sorted({*OTHERS_PORTS, *refusable} - running)
        taken = self.draw(st.lists(sampled_from(candidates), max_size=3, unique=True)) if candidates else []
        if refusable and self.draw(st.integers(0, 3), "a start refused"):
            port = self.draw(sampled_from(sorted(set(refusable) - running) or [0]))
            taken = sorted({*(node.taken if node is not None else ()), *taken, port} - {0})
        self._emit(step, ev.NodePorts(at=self.tick(), node=name, taken=taken))

    def _ghost(self, name, gpus, running, taken_gpus, taken_ports, add) -> None:
        """A shard the agent on `name` runs that this log did not place there,
        as after the stream was made anew while the engines ran on: of a
        model in the catalog or not, of one of its profiles or a retired one,
        started with its definition or another; under an id never used, or
        one this log uses or used (a replica merely placed, one that came up,
        one forgotten). Of a multi-node profile, one shard of the replica
        here and the others on other nodes, reported when their agents
        register (or never)."""
        self.ghosts += 1
        model = self.draw(sampled_from(["ghost", *sorted(self.catalog)]))
        applied = self.live.models.get(model)
        ids = [f"{model}-{900 + self.ghosts}"]
        if applied is not None and self.draw(st.integers(0, 3)) == 0:
            ids = sorted(rid for rid, m in self.replicas_seen.items() if m == model) or ids
        replica = self.draw(sampled_from(ids))
        profile = self.draw(sampled_from([*(p.name for p in applied.spec.profiles), "gone"])) if applied else "p0"
        spec = profile_named(applied.spec, profile) if applied else None
        # Started with the definition the catalog has, an older one, or by an agent that does not say.
        fingerprint = self.draw(sampled_from(["", "0" * 12, *(applied.fingerprints.values() if applied else [])]))
        free = [g.index for g in gpus if g.index not in taken_gpus]
        port = self.draw(sampled_from([p for p in PORTS if p not in taken_ports]))
        others = [n for n in sorted(self.fleet) if n != name]
        if spec is not None and 1 < spec.nodes <= len(others) + 1 and len(free) >= spec.gpus:
            rank = self.draw(st.integers(0, spec.nodes - 1), "rank here")
            elsewhere = self.draw(st.permutations(others))[: spec.nodes - 1]
            for r, node_name in zip([r for r in range(spec.nodes) if r != rank], elsewhere):
                half = ev.RunningShard(
                    shard=f"{replica}.{r}", replica=replica, model=model, profile=profile, generation=1,
                    rank=r, gpus=list(range(spec.gpus)), state="ready", fingerprint=fingerprint,
                )
                self.halves.setdefault(node_name, []).append(half)
            shard, shard_gpus = f"{replica}.{rank}", free[: spec.gpus]
        else:
            rank, shard = 0, f"{replica}.0"
            shard_gpus = self.draw(st.lists(sampled_from(free), max_size=2, unique=True)) if free else []
        if any(r.shard == shard for r in running):
            return  # one process per shard id on a node
        add(
            ev.RunningShard(
                shard=shard,
                replica=replica,
                model=model,
                profile=profile,
                generation=self.draw(st.integers(1, 50)),
                rank=rank,
                gpus=sorted(shard_gpus),
                port=port,
                state=self.draw(sampled_from(RUNNING_STATES)),
                fingerprint=fingerprint,
            )
        )

    def _step_load(self, step: Step) -> None:
        """A gateway's load on a model (sometimes one not in the catalog)."""
        at = self.tick()
        busy = self.draw(sampled_from(((0, 0), (0, 1), (1, 0), (3, 0), (2, 2), (9, 3))), "in flight, queued")
        self._emit(
            step,
            ev.ModelLoad(
                at=at,
                gateway=self.draw(sampled_from(GATEWAYS)),
                model=self.draw(sampled_from(sorted(self.catalog))),
                in_flight=busy[0],
                queued=busy[1],
                last_used=at if any(busy) else self.draw(sampled_from((0.0, at - 5))),
            ),
        )

    def _step_restart(self, step: Step) -> None:
        """An operator asks for replicas to be restarted (`llmgw ctl restart`):
        mostly ready ones of one model, sometimes any, sometimes none that exists."""
        ready = sorted(rid for rid, r in self.live.replicas.items() if r.state == "ready")
        pool = ready if ready and self.draw(st.integers(0, 3)) else [*sorted(self.live.replicas), "m-404"]
        replicas = self.draw(st.lists(sampled_from(pool), min_size=1, max_size=3, unique=True), "replicas")
        self._emit(
            step,
            ev.ReplicasRestart(
                at=self.tick(),
                replicas=replicas,
                in_place=self.draw(st.integers(0, 3)) == 0,
                max_surge=self.draw(sampled_from((0, 0, 1, 2))),
                max_unavailable=self.draw(sampled_from((0, 0, 0, 1, 2))),
            ),
        )

    def _step_retry(self, step: Step) -> None:
        """An operator unparks a model (`llmgw ctl retry`), parked or not."""
        applied = sorted(self.live.models)
        if not applied:
            step.detail = "no model to retry"  # ctl refuses a model not in the catalog
            return
        parked = [m for m in applied if self.live.models[m].parked]
        name = self.draw(sampled_from(parked if parked and self.draw(st.booleans()) else applied))
        self._emit(step, ev.ModelRetry(at=self.tick(), name=name))

    def _step_up(self, step: Step) -> None:
        """An agent does what it was told: a shard placed or on its way comes
        up (ready), one asked to stop exits, a stray asked to stop exits."""
        todo = []
        for rep in self.live.replicas.values():
            for sh in rep.shards:
                if sh.state in ("placing", "starting", "loading"):
                    todo.append((rep.id, sh.id, sh.node, sh.generation, "ready"))
                elif sh.state == "stopping":
                    todo.append((rep.id, sh.id, sh.node, sh.generation, "stopped"))
        for name, node in self.live.nodes.items():
            for shard, stray in node.strays.items():
                if stray.stopping:
                    replica = self.stray_replicas.get((name, shard), shard.rpartition(".")[0])
                    todo.append((replica, shard, name, stray.generation, "stopped"))
        if not todo:
            step.detail = "nothing to do"
            return
        replica, shard, node, generation, state = self.draw(sampled_from(todo), "comes up or exits")
        self._emit(
            step,
            ev.ShardStatus(at=self.tick(), node=node, replica=replica, shard=shard, generation=generation, state=state),
        )

    def _step_status(self, step: Step) -> None:
        """An agent reports on a shard the state knows of, or a stray exits."""
        shards = [(rep, sh) for rep in self.live.replicas.values() for sh in rep.shards]
        strays = [(name, shard, s) for name, node in self.live.nodes.items() for shard, s in node.strays.items()]
        choices = (["shard"] if shards else []) + (["stray"] if strays else [])
        if not choices:
            step.detail = "nothing to report on"
            return
        stale = self.draw(st.integers(0, 5)) == 0
        refused = [
            (rep, sh) for rep, sh in shards
            if sh.state == "placing" and sh.port and sh.port in self.live.nodes[sh.node].taken
        ]
        if refused and self.draw(st.integers(0, 3), "a refused start fails"):
            # The agent refused it, its port held by another program (see _step_ports).
            rep, sh = self.draw(sampled_from(refused))
            reason = f"port {sh.port} on {sh.node} is taken by another process"
            self._emit(step, ev.ShardStatus(at=self.tick(), node=sh.node, replica=rep.id, shard=sh.id,
                                            generation=sh.generation, state="failed", reason=reason))
            return
        if self.draw(sampled_from(choices)) == "shard":
            live = [(rep, sh) for rep, sh in shards if sh.state in LIVE_SHARD_STATES]
            if live and self.draw(st.integers(0, 3)):  # mostly about shards still running
                shards = live
            rep, sh = self.draw(sampled_from(shards))
            generation = max(0, sh.generation - self.draw(st.integers(1, 3))) if stale else sh.generation  # the contract's bound: >= 0
            event = ev.ShardStatus(
                at=self.tick(),
                node=sh.node,
                replica=rep.id,
                shard=sh.id,
                generation=generation,
                state=self.draw(sampled_from(REPORTED_STATES)),
                reason=self.draw(sampled_from(["", "CUDA error", "exited 0"])),
                endpoint=self.draw(sampled_from(["", f"http://{sh.node}:{sh.port}"])),
            )
        else:
            name, shard, stray = self.draw(sampled_from(strays))
            generation = max(0, stray.generation - self.draw(st.integers(1, 3))) if stale else stray.generation
            event = ev.ShardStatus(
                at=self.tick(),
                node=name,
                replica=self.stray_replicas.get((name, shard), shard.rpartition(".")[0]),
                shard=shard,
                generation=generation,
                state=self.draw(sampled_from(SHARD_STATES)),
            )
        self._emit(step, event)

    def _step_decide(self, step: Step) -> None:
        """One control-plane pass on the live state."""
        now = self.tick()
        actions = decide(self.live, now)
        step.fresh = True
        if actions:
            self._emit(step, ev.Decided(at=now, basis=self.live.seq, actions=actions, leader="cp-1"))

    def _step_stale(self, step: Step) -> None:
        """A pass decided on an older state and published late, as by a deposed leader."""
        if self.draw(st.booleans()):
            basis = self.draw(st.integers(0, len(self.states) - 1), "stale basis")
        else:  # a recent one, as when two leaders overlap briefly
            basis = max(0, len(self.states) - 1 - self.draw(st.integers(0, 4), "stale by"))
        old = decode_state(self.states[basis])
        now = self.tick()
        actions = decide(old, now)
        step.fresh = basis == self.live.seq
        if actions:
            self._emit(step, ev.Decided(at=now, basis=old.seq, actions=actions, leader="cp-old"))

    def _step_rogue(self, step: Step) -> None:
        """A decision nobody would take on any state the log had: made-up
        placements (GPUs held or missing, ports taken, ids used before, nodes
        lost or unknown), stops and stray stops. The fold must still never
        give a GPU twice; it voids what does not hold."""
        now = self.tick()
        actions: list[ev.Action] = []
        nodes = [*sorted(self.fleet), "unknown-node"]
        for _ in range(self.draw(st.integers(1, 3))):
            what = self.draw(sampled_from(["place", "place", "stop", "stop-stray", "wait"]))
            applied = sorted(self.live.models)
            if applied and self.draw(st.integers(0, 3)):  # mostly models in the catalog
                name = self.draw(sampled_from(applied))
            else:
                name = self.draw(sampled_from(sorted(self.catalog)))
            # Ids the log used before for models still in the catalog, now forgotten.
            forgotten = sorted(
                r for r, m in self.replicas_seen.items() if m in self.live.models and r not in self.live.replicas
            )
            replica = ""
            if what == "place" and forgotten and self.draw(st.booleans()):
                replica = self.draw(sampled_from(forgotten), "id used before")
                name = self.replicas_seen[replica]
            model = self.live.models.get(name)
            spec = model.spec if model is not None else self.catalog[name]
            if what == "place":
                profile = self.draw(sampled_from(spec.profiles))
                fingerprint = model.fingerprints.get(profile.name, "") if model is not None else ""
                if self.draw(st.integers(0, 5)) == 0:
                    fingerprint = "0" * 12
                if replica:  # an id used before, on a placement that otherwise holds
                    fingerprint = model.fingerprints[profile.name]  # type: ignore[union-attr]
                    placement = self.plausible_placement(replica)
                    if placement is not None:
                        actions.append(
                            ev.PlaceReplica(
                                replica=replica,
                                model=name,
                                profile=profile.name,
                                fingerprint=fingerprint,
                                shards=[placement],
                                reason="rogue",
                            )
                        )
                        continue
                else:
                    next_number = self.live.replica_numbers.get(name, 1)
                    if self.draw(st.integers(0, 3)):  # mostly an id never used
                        number = next_number + self.draw(st.integers(0, 2))
                    else:
                        number = self.draw(st.integers(1, next_number))
                    replica = f"{name}-{number}"
                ready = sorted(n for n, x in self.live.nodes.items() if x.state == "ready")
                pool = ready if ready and self.draw(st.integers(0, 3)) else nodes  # mostly ready nodes
                distinct = self.draw(st.booleans())
                where = self.draw(st.lists(sampled_from(pool), min_size=1, max_size=2, unique=distinct))
                shards = []
                for rank, n in enumerate(where):
                    node = self.live.nodes.get(n)
                    indices = sorted({g.index for g in self.fleet.get(n, [])} | {8})  # 8: no such GPU
                    least = 0
                    if node is not None and node.used and self.draw(st.booleans()):
                        indices, least = sorted(node.used), 1  # GPUs someone holds
                    gpus = self.draw(st.lists(sampled_from(indices), min_size=least, max_size=3, unique=True))
                    taken = {*node.ports, *node.taken} if node is not None else set()
                    if self.draw(st.booleans()):  # a port nobody holds, so that the GPUs decide
                        port = self.draw(sampled_from([p for p in (*PORTS, 20004, 20005) if p not in taken]))
                    else:  # sometimes one a shard, a stray or another program holds
                        port = self.draw(sampled_from(sorted({*PORTS, *taken})))
                    shards.append(ev.ShardPlacement(shard=f"{replica}.{rank}", node=n, rank=rank, gpus=gpus, port=port))
                actions.append(
                    ev.PlaceReplica(
                        replica=replica,
                        model=name,
                        profile=profile.name,
                        fingerprint=fingerprint,
                        shards=shards,
                        reason="rogue",
                    )
                )
            elif what == "stop":
                replica = self.draw(sampled_from([*sorted(self.live.replicas), f"{name}-77"]))
                actions.append(ev.StopReplica(replica=replica, reason="rogue"))
            elif what == "stop-stray":
                strays = [(n, s, x.generation) for n, node in self.live.nodes.items() for s, x in node.strays.items()]
                n, s, g = self.draw(sampled_from([*strays, ("unknown-node", "ghost-1.0", 1)]))
                g += self.draw(st.integers(0, 1))
                actions.append(ev.StopStray(node=n, shard=s, generation=g, reason="rogue"))
            else:
                actions.append(ev.ModelWaiting(model=name, reason="rogue"))
        self._emit(step, ev.Decided(at=now, basis=self.live.seq, actions=actions, leader="cp-rogue"))

    def plausible_placement(self, replica: str) -> ev.ShardPlacement | None:
        """One shard on a ready node, on GPUs and a port nobody holds."""
        ready = sorted(n for n, x in self.live.nodes.items() if x.state == "ready")
        if not ready:
            return None
        name = self.draw(sampled_from(ready))
        node = self.live.nodes[name]
        free = [g.index for g in node.gpus if g.index not in node.used]
        gpus = self.draw(st.lists(sampled_from(free), max_size=2, unique=True)) if free else []
        first, last = port_range(node)
        ports = [p for p in PORTS if p not in node.ports and p not in node.taken and (not p or first <= p <= last)]
        port = self.draw(sampled_from(ports))
        return ev.ShardPlacement(shard=f"{replica}.0", node=name, rank=0, gpus=sorted(gpus), port=port)

    # ------------------------------------------------------------------ malformed messages

    def _step_malformed(self, step: Step) -> None:
        """A message the fold must quarantine: counted, kept, and nothing else."""
        step.malformed = True
        how = self.draw(
            sampled_from(
                ["garbage", "not-an-event", "unknown-tag", "bad-fields", "other-node", "wrong-origin", "refused"]
            ),
            "malformed",
        )
        step.detail = how
        subject, data = getattr(self, f"_malformed_{how.replace('-', '_')}")()
        step.record = self.append(subject, data)

    def _any_subject(self) -> str:
        node = self.draw(sampled_from(sorted(self.fleet)))
        return self.draw(
            sampled_from(
                [
                    "llmgw.ctl.model.applied",
                    f"llmgw.agent.{node}.shard.status",
                    "llmgw.control.control.decided",
                    "llmgw.control.node.lost",
                ]
            )
        )

    def _malformed_garbage(self) -> tuple[str, bytes]:
        data = b"\xff" + self.draw(st.binary(max_size=24))  # never valid JSON
        return self._any_subject(), data

    def _malformed_not_an_event(self) -> tuple[str, bytes]:
        data = self.draw(sampled_from([b"", b"null", b"[]", b"{}", b'{"type": 3}', b'"model.applied"', b"{"]))
        return self._any_subject(), data

    def _malformed_unknown_tag(self) -> tuple[str, bytes]:
        data = msgspec.json.encode({"type": "model.exploded", "v": 1, "at": self.tick(), "name": "m"})
        return "llmgw.ctl.model.exploded", data

    def _malformed_bad_fields(self) -> tuple[str, bytes]:
        node = self.draw(sampled_from(sorted(self.fleet)))
        at = self.tick()
        return self.draw(
            sampled_from(
                [
                    ("llmgw.control.node.lost", msgspec.json.encode({"type": "node.lost", "v": 1, "at": at})),
                    (
                        "llmgw.ctl.model.removed",
                        msgspec.json.encode({"type": "model.removed", "v": 1, "at": "noon", "name": "m"}),
                    ),
                    (
                        f"llmgw.agent.{node}.shard.status",
                        msgspec.json.encode(
                            {"type": "shard.status", "at": at, "node": node, "replica": "m-1", "shard": "m-1.0",
                             "generation": 1, "state": "exploded"}
                        ),
                    ),
                    (
                        "llmgw.control.control.decided",
                        msgspec.json.encode(
                            {"type": "control.decided", "at": at, "basis": 0, "actions": [{"action": "reboot"}]}
                        ),
                    ),
                ]
            )
        )

    def _malformed_other_node(self) -> tuple[str, bytes]:
        """An agent speaking for another node than its own."""
        speaker = self.draw(sampled_from([*sorted(self.fleet), "intruder"]))
        victim = self.draw(sampled_from([n for n in [*sorted(self.fleet), "intruder"] if n != speaker]))
        at = self.tick()
        shards = [(rep, sh) for rep in self.live.replicas.values() for sh in rep.shards]
        if shards and self.draw(st.booleans()):
            rep, sh = self.draw(sampled_from(shards))
            event: ev.Event = ev.ShardStatus(
                at=at, node=sh.node, replica=rep.id, shard=sh.id, generation=sh.generation, state="failed"
            )
            speaker = self.draw(sampled_from([n for n in [*sorted(self.fleet), "intruder"] if n != sh.node]))
        else:
            gpus = self.fleet.get(victim, [ev.Gpu(index=0, memory_gb=80.0)])
            event = ev.NodeRegistered(at=at, node=victim, gpus=list(gpus))
        return f"llmgw.agent.{speaker}.{ev.tag_of(type(event))}", ev.encode(event)

    def _malformed_wrong_origin(self) -> tuple[str, bytes]:
        """An event on a subject whose speaker may not say it."""
        node = self.draw(sampled_from(sorted(self.fleet)))
        at = self.tick()
        name = self.draw(sampled_from(sorted(self.catalog)))
        options: list[tuple[str, ev.Event]] = [
            (f"llmgw.agent.{node}.model.applied", ev.ModelApplied(at=at, model=self.catalog[name])),
            (f"llmgw.agent.{node}.model.removed", ev.ModelRemoved(at=at, name=name)),
            (f"llmgw.agent.{node}.node.lost", ev.NodeLost(at=at, node=node, reason="says who")),
            ("llmgw.ctl.node.registered", ev.NodeRegistered(at=at, node=node, gpus=list(self.fleet[node]))),
            (
                "llmgw.control.shard.status",
                ev.ShardStatus(at=at, node=node, replica="m-1", shard="m-1.0", generation=1, state="ready"),
            ),
            ("llmgw", ev.ModelRemoved(at=at, name=name)),
        ]
        actions = decide(self.live, at)
        if actions:
            decided = ev.Decided(at=at, basis=self.live.seq, actions=actions)
            options.append(("llmgw.ctl.control.decided", decided))
            options.append((f"llmgw.agent.{node}.control.decided", decided))
        subject, event = self.draw(sampled_from(options))
        return subject, ev.encode(event)

    def _malformed_refused(self) -> tuple[str, bytes]:
        """Well-formed, from the right speaker, but against a rule of the fold."""
        at = self.tick()
        name = self.draw(sampled_from(sorted(self.catalog)))
        good = self.catalog[name]
        p = good.profiles[0]
        bad_specs = [
            ev.ModelSpec(name=name, profiles=[]),
            ev.ModelSpec(name=name, profiles=[p, p]),
            ev.ModelSpec(name=name, profiles=[msgspec.structs.replace(p, nodes=0)]),
            ev.ModelSpec(name=name, profiles=[msgspec.structs.replace(p, gpus=-1)]),
            ev.ModelSpec(name=name, profiles=[msgspec.structs.replace(p, memory_gb=-8.0)]),
            ev.ModelSpec(name=name, profiles=[msgspec.structs.replace(p, cpu_cores=-1)]),
            ev.ModelSpec(name=name, profiles=[p], min_replicas=-1),
            ev.ModelSpec(name="bad name!", profiles=[p]),
            ev.ModelSpec(name="", profiles=[p]),
        ]
        options: list[ev.Event] = [ev.ModelApplied(at=at, model=s) for s in bad_specs]
        node = self.draw(sampled_from(sorted(self.fleet)))
        options.append(ev.NodeRegistered(at=at, node=node, gpus=[ev.Gpu(index=0), ev.Gpu(index=0)]))
        options.append(ev.NodeRegistered(at=at, node="bad node", gpus=[ev.Gpu(index=0)]))
        # A shard reported by the right agent, but the fold placed it on another node.
        others = [
            (rep, sh, n)
            for rep in self.live.replicas.values()
            for sh in rep.shards
            for n in sorted(self.fleet)
            if n != sh.node
        ]
        if others:
            rep, sh, n = self.draw(sampled_from(others))
            options.append(
                ev.ShardStatus(at=at, node=n, replica=rep.id, shard=sh.id, generation=sh.generation, state="ready")
            )
        event = self.draw(sampled_from(options))
        return ev.subject_for(event), ev.encode(event)
