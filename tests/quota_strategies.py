"""Random worlds with classes, owners and a full fleet, for the property
tests of preemption and quotas (tests/test_preemption_properties.py).

`QuotaWorld` is tests/fleet_strategies.py's `World` (the same log, the same
steps, folded the same way) with another fleet and catalog, drawn so that
preemption happens often:

- a small fleet, few GPUs, mostly of one kind, so that the catalog asks for
  more than there is;
- models of every class, with owners (organisations, their teams, and none),
  minimums, growth under load (target_load, max_replicas), some on demand;
- owners with guarantees and limits (GPUs, sometimes cores), applied before
  anything else and sometimes changed;
- steps that let a fleet live: shards coming up (`ready`), stopping shards
  exiting (`exit`), gateways reporting load (`load`), and time passing in
  larger steps (`wait`), so that replicas outlive MIN_LIFETIME_S, on-demand
  ones go idle past the eviction grace, and holds end.

`calm=True` leaves out what changes the rules under the models' feet (the
catalog and owners applied again, models removed, nodes lost, agents
registering again, shards failing, load changing after the start), for the
property that two models never take turns stopping each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import strategies as st

from llmgw.core.contract import events as ev
from .fleet_strategies import OWNER_NAMES, OWNERS, PRIORITIES, NodeFacts, Step, World, owner_events
QUOTA_MODEL_NAMES = ("m", "chat", "batch", "org/llama-3.1:8b", "embed", "judge")
QUOTA_NODE_NAMES = ("n0", "n1", "gpu-2", "node_3")
GPU_KINDS = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")


@st.composite
def quota_fleets(draw, tiny: bool = False) -> tuple[dict[str, list[ev.Gpu]], dict]:
    """2-4 nodes of 1-4 GPUs (mostly 2 or 4): node name -> its GPUs, and what
    else it says (host memory, cores, labels: most nodes on one fabric).
    `tiny`: 1-2 nodes of 2 GPUs, for two models to fight over."""
    if tiny:
        names = draw(st.lists(st.sampled_from(QUOTA_NODE_NAMES), min_size=1, max_size=2, unique=True))
    else:
        names = draw(st.lists(st.sampled_from(QUOTA_NODE_NAMES), min_size=2, max_size=4, unique=True))
    fleet, facts = {}, {}
    for name in sorted(names):
        kind = draw(st.sampled_from(GPU_KINDS))
        count = 2 if tiny else draw(st.sampled_from([1, 2, 2, 3, 4, 4]))
        fleet[name] = [ev.Gpu(index=i, model=kind, memory_gb=80.0) for i in range(count)]
        labels = {"llmgw.io/fabric": "ib-0"} if draw(st.integers(0, 3)) else {}
        facts[name] = (draw(st.sampled_from([0.0, 256.0])), draw(st.sampled_from([0, 32])), labels,
                       draw(st.sampled_from([False, False, False, True])))  # simulated: no real engine runs there
    return fleet, facts


@st.composite
def quota_profiles(draw, name: str) -> ev.ProfileSpec:
    return ev.ProfileSpec(
        name=name,
        gpus=draw(st.sampled_from([1, 1, 1, 2, 2, 3])),
        nodes=draw(st.sampled_from([1, 1, 1, 1, 1, 2])),
        # "L4": a GPU no node has, so that a first profile fits nowhere and the second is placed.
        gpu_model=draw(st.sampled_from(["", "", "", "", "H100", "A100", "L4"])),
        memory_gb=draw(st.sampled_from([0.0, 0.0, 32.0])),
        cpu_cores=draw(st.sampled_from([0, 0, 4])),
        # A real engine's: on no simulated node, unless it may run simulated there.
        engine=draw(st.sampled_from(["sim", "sim", "sim", "llama.cpp"])),
        simulate=draw(st.booleans()),
    )


@st.composite
def quota_model_specs(draw, name: str, tiny: bool = False) -> ev.ModelSpec:
    """A model of any class and owner; `tiny`: at least one replica, of at
    most two GPUs (two of them share a tiny fleet)."""
    names = draw(st.permutations(["p0", "p1"]))[: draw(st.integers(1, 2))]
    least = draw(st.sampled_from([1, 1, 2] if tiny else [0, 1, 1, 2, 2, 3]))
    on_demand = draw(st.integers(0, 4)) == 0
    grows = draw(st.booleans())
    profiles = [draw(quota_profiles(p)) for p in names]
    if tiny:
        profiles = [msgspec.structs.replace(p, gpus=min(p.gpus, 2), nodes=1) for p in profiles]
    return ev.ModelSpec(
        name=name,
        profiles=profiles,
        owner=draw(st.sampled_from(OWNERS)),
        priority=draw(st.sampled_from(PRIORITIES)),
        min_replicas=least,
        max_replicas=least + draw(st.integers(1, 3)) if grows else 0,
        target_load=1.0 if grows else 0.0,
        scale_down_delay_s=draw(st.sampled_from([0.0, 120.0, 600.0])),
        on_demand=on_demand,
        idle_s=draw(st.sampled_from([300.0, 900.0])),
        drain_grace_s=draw(st.sampled_from([0.0, 30.0])),
    )


@st.composite
def quota_catalogs(draw, tiny: bool = False) -> dict[str, ev.ModelSpec]:
    names = draw(st.lists(st.sampled_from(QUOTA_MODEL_NAMES), min_size=2, max_size=2 if tiny else 5, unique=True))
    return {name: draw(quota_model_specs(name, tiny)) for name in names}


@dataclass
class QuotaWorld(World):
    """A full fleet of models of every class and owner (see the module's doc)."""

    calm: bool = False
    models_at_most: int = 5  # 2 or fewer: on a tiny fleet (quota_fleets)

    def __post_init__(self) -> None:
        if not self.fleet:
            fleet, facts = self.draw(quota_fleets(tiny=self.models_at_most <= 2), "fleet")
            self.fleet = fleet
            self.facts = {
                n: NodeFacts(memory_gb=m, cpu_cores=c, labels=labels, simulated=sim) for n, (m, c, labels, sim) in facts.items()
            }
        if not self.catalog:
            catalog = self.draw(quota_catalogs(tiny=self.models_at_most <= 2), "catalog")
            self.catalog = dict(list(catalog.items())[: self.models_at_most])
        self.owner_names = self.draw(
            st.lists(st.sampled_from(OWNER_NAMES), min_size=2 if self.calm else 0, max_size=len(OWNER_NAMES),
                     unique=True),
            "owners",
        )
        super().__post_init__()

    def tick(self) -> float:
        self.now += self.draw(st.integers(0, 40))
        return self.now

    def kinds(self) -> list[str]:
        kinds = ["decide", "decide", "decide", "ready", "ready", "ready", "ready", "exit", "exit", "wait", "wait"]
        if self.calm:
            return kinds
        kinds += ["load", "load", "status", "register", "apply", "lose", "remove", "owner"]
        if self.stale:
            kinds.append("stale")
        if self.rogue:
            kinds.append("rogue")
        if self.malformed:
            kinds.append("malformed")
        return kinds

    def run(self, max_steps: int = 40):
        """Owners first, then the fleet and the catalog (always warm: the
        point is a full fleet), one load report per model that scales on
        load, then random steps."""
        yield from self.setup()
        for _ in range(self.draw(st.integers(max(1, max_steps // 2), max_steps), "steps")):
            yield self.step()

    def setup(self):
        """Owners, nodes, models, and one load report per model that scales."""
        for name in sorted(self.owner_names):
            step = Step(kind="owner", before=self.states[-1])
            self._emit(step, self.draw(owner_events(name, self.tick()), f"owner {name}"))
            yield step
        for name in sorted(self.fleet):
            step = Step(kind="register", before=self.states[-1])
            self._step_register(step, name)
            yield step
        for name in sorted(self.catalog):
            step = Step(kind="apply", before=self.states[-1])
            self._emit(step, ev.ModelApplied(at=self.tick(), model=self.catalog[name]))
            yield step
        for name in sorted(self.catalog):
            spec = self.catalog[name]
            if spec.target_load > 0 or spec.on_demand:
                step = Step(kind="load", before=self.states[-1])
                self._step_load(step, name)
                yield step

    def run_rounds(self, rounds: int = 20):
        """The fleet obeying every decision at once, round after round: a
        pass of decide, every shard coming up reporting ready, every shard
        told to stop exiting, then some time passing. Long runs of a life
        that changes nothing else, for properties about what decisions do
        to each other over time."""
        yield from self.setup()
        for _ in range(rounds):
            step = Step(kind="decide", before=self.states[-1])
            self._step_decide(step)
            yield step
            for rep in list(self.live.replicas.values()):
                for sh in rep.shards:
                    if sh.state in ("placing", "starting", "loading", "stopping"):
                        state = "stopped" if sh.state == "stopping" else "ready"
                        step = Step(kind="ready", before=self.states[-1])
                        self._emit(step, ev.ShardStatus(at=self.now, node=sh.node, replica=rep.id, shard=sh.id,
                                                        generation=sh.generation, state=state))
                        yield step
            self.now += self.draw(st.sampled_from([20, 60, 130, 310]), "wait")

    # ------------------------------------------------------------------ steps

    def registration(self, name: str) -> ev.NodeRegistered:
        """World's, but a shard nobody placed (a ghost) runs as generation 1:
        World draws it 1-50, and a ghost adopted with the sequence number of
        a later decision reads, to test_properties.assert_voided_not_applied,
        as a replica that decision placed."""
        reg = super().registration(name)
        known = {sh.id for rep in self.live.replicas.values() for sh in rep.shards}
        node = self.live.nodes.get(name)
        known |= set(node.strays) if node is not None else set()
        for r in reg.running:
            if r.shard not in known:
                r.generation = 1
        return reg

    def _step_apply(self, step: Step) -> None:
        """A model applied again, as it was or changed (class, owner, scaling, profiles)."""
        name = self.draw(st.sampled_from(sorted(self.catalog)))
        spec = self.catalog[name]
        if self.draw(st.booleans()):
            spec = self.draw(quota_model_specs(name))
        self._emit(step, ev.ModelApplied(at=self.tick(), model=spec))

    def _step_wait(self, step: Step) -> None:
        """Time passes with nothing said: replicas age past MIN_LIFETIME_S,
        on-demand ones go idle, holds end."""
        self.now += self.draw(st.sampled_from([60, 130, 310, 700]), "wait")
        step.detail = "time passes"

    def _step_ready(self, step: Step) -> None:
        """A shard placed or coming up reports its next state (mostly ready)."""
        shards = [
            (rep, sh) for rep in self.live.replicas.values() for sh in rep.shards
            if sh.state in ("placing", "starting", "loading") and rep.state != "stopping"
        ]
        if not shards:
            step.detail = "nothing coming up"
            return
        rep, sh = self.draw(st.sampled_from(shards), "coming up")
        state = self.draw(st.sampled_from(["ready", "ready", "ready", "loading"]))
        self._emit(step, ev.ShardStatus(at=self.tick(), node=sh.node, replica=rep.id, shard=sh.id,
                                        generation=sh.generation, state=state, endpoint=f"http://{sh.node}:{sh.port}"))

    def _step_exit(self, step: Step) -> None:
        """A shard told to stop exits."""
        shards = [(rep, sh) for rep in self.live.replicas.values() for sh in rep.shards if sh.state == "stopping"]
        if not shards:
            step.detail = "nothing stopping"
            return
        rep, sh = self.draw(st.sampled_from(shards), "exits")
        self._emit(step, ev.ShardStatus(at=self.tick(), node=sh.node, replica=rep.id, shard=sh.id,
                                        generation=sh.generation, state="stopped"))

    def _step_load(self, step: Step, name: str = "") -> None:
        """A gateway's load on a model; busy means just used."""
        name = name or self.draw(st.sampled_from(sorted(self.catalog)))
        at = self.tick()
        in_flight = self.draw(st.integers(0, 4), "in flight")
        queued = self.draw(st.integers(0, 2), "queued")
        busy = in_flight + queued
        self._emit(step, ev.ModelLoad(at=at, gateway=self.draw(st.sampled_from(["gw-1", "gw-2"])), model=name,
                                      in_flight=in_flight, queued=queued, last_used=at if busy else 0.0))
