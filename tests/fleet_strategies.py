"""A random world for the property tests of the pure core.

`World` holds a small random fleet and catalog and, one step at a time, grows
a log exactly as the shell would write it: (seq, subject, data bytes), each
message folded into the "live" state with `fold.apply` as it is appended. The
steps are what the real system sees: models applied (sometimes with a changed
spec) and removed, agents registering (reporting some of what the fold
believes runs there, sometimes with a stale generation or a stray nobody
placed), nodes lost, shard status reports (sometimes stale), malformed
messages, and control-plane passes, some of them deliberately decided on an
older state, as a deposed leader would publish them. With `rogue=True` some
decisions are made up outright (GPUs and ports someone holds, ids used
before, nodes lost or unknown), to press the fold's voiding rules harder than
any honest `decide` would.

The fleet is mixed on purpose: GPUs of several models and sizes, nodes that
say their host memory and cores or do not (0), some in a pool, some on one of
two fabrics and some on none; profiles ask for GPU models, GPU memory, host
memory, cores and pools, and span one to three nodes, so that placement meets
every rule and multi-node replicas are common.

Every choice is drawn from a hypothesis `data` object, so a failing run
shrinks to a short sequence of steps. No NATS, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import strategies as st

from llmgw.core import events as ev
from llmgw.core.decide import decide
from llmgw.core.fold import apply, decode_state, encode_state
from llmgw.core.state import LIVE_SHARD_STATES, State

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

Record = tuple[int, str, bytes]


# --------------------------------------------------------------------------- fleet and catalog


@st.composite
def node_gpus(draw) -> list[ev.Gpu]:
    count = draw(st.integers(1, 8))
    if draw(st.booleans()):  # most nodes have one kind of GPU
        mem = draw(st.sampled_from(GPU_MEMORY_GB))
        model = draw(st.sampled_from(GPU_MODELS))
        return [ev.Gpu(index=i, model=model, memory_gb=mem) for i in range(count)]
    return [
        ev.Gpu(index=i, model=draw(st.sampled_from(GPU_MODELS)), memory_gb=draw(st.sampled_from(GPU_MEMORY_GB)))
        for i in range(count)
    ]


@dataclass(frozen=True)
class NodeFacts:
    """What an agent says of its node besides its GPUs; the same at every registration."""

    memory_gb: float
    cpu_cores: int
    labels: dict[str, str]


@st.composite
def node_facts(draw) -> NodeFacts:
    labels = {"zone": "a"}
    pool, fabric = draw(st.sampled_from(POOLS)), draw(st.sampled_from(FABRICS))
    if pool:
        labels["llmgw.io/pool"] = pool
    if fabric:
        labels["llmgw.io/fabric"] = fabric
    return NodeFacts(
        memory_gb=draw(st.sampled_from(HOST_MEMORY_GB)), cpu_cores=draw(st.sampled_from(CPU_CORES)), labels=labels
    )


@st.composite
def fleets(draw) -> dict[str, list[ev.Gpu]]:
    """1-6 nodes, 1-8 GPUs each: node name -> its GPUs (as its agent reports them)."""
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True))
    return {name: draw(node_gpus()) for name in names}


@st.composite
def profile_specs(draw, name: str) -> ev.ProfileSpec:
    return ev.ProfileSpec(
        name=name,
        engine="sim",
        args=draw(st.sampled_from([[], ["--fast"], ["--tp", "2"]])),
        gpus=draw(st.integers(0, 4)),
        nodes=draw(st.sampled_from([1, 1, 2, 3])),
        gpu_memory_gb=draw(st.sampled_from(PROFILE_MEMORY_GB)),
        gpu_model=draw(st.sampled_from(PROFILE_GPU_MODELS)),
        memory_gb=draw(st.sampled_from(PROFILE_HOST_MEMORY_GB)),
        cpu_cores=draw(st.sampled_from(PROFILE_CPU_CORES)),
        pool=draw(st.sampled_from(PROFILE_POOLS)),
    )


@st.composite
def model_specs(draw, name: str) -> ev.ModelSpec:
    count = draw(st.integers(1, 3))
    names = draw(st.permutations(["p0", "p1", "p2"]))[:count]
    min_replicas = draw(st.integers(0, 4))
    return ev.ModelSpec(
        name=name,
        profiles=[draw(profile_specs(p)) for p in names],
        min_replicas=min_replicas,
        max_replicas=draw(st.sampled_from([0, 0, min_replicas + 1])),
    )


@st.composite
def catalogs(draw) -> dict[str, ev.ModelSpec]:
    """1-5 models, each with 1-3 profiles."""
    names = draw(st.lists(st.sampled_from(MODEL_NAMES), min_size=1, max_size=5, unique=True))
    return {name: draw(model_specs(name)) for name in names}


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
    # Every replica id the live state ever had, with its model.
    replicas_seen: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fleet = self.fleet or self.draw(fleets(), "fleet")
        self.facts = self.facts or {name: self.draw(node_facts(), f"facts of {name}") for name in sorted(self.fleet)}
        self.catalog = self.catalog or self.draw(catalogs(), "catalog")
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
        kinds += ["status", "decide", "remove", "lose"]
        if self.stale:
            kinds += ["stale", "stale"]
        if self.rogue:
            kinds.append("rogue")
        if self.malformed:
            kinds.append("malformed")
        return kinds

    def step(self) -> Step:
        kind = self.draw(st.sampled_from(self.kinds()), "step")
        step = Step(kind=kind, before=self.states[-1])
        getattr(self, f"_step_{kind}")(step)
        return step

    def run(self, max_steps: int = 40):
        """Yield each step as it is taken (the state after it is `self.live`).

        Half the worlds start warm: every node registered and every model
        applied first, so that the random steps find something to act on."""
        if self.draw(st.booleans(), "warm start"):
            for name in sorted(self.fleet):
                step = Step(kind="register", before=self.states[-1])
                self._step_register(step, name)
                yield step
            for name in sorted(self.catalog):
                step = Step(kind="apply", before=self.states[-1])
                self._emit(step, ev.ModelApplied(at=self.tick(), model=self.catalog[name]))
                yield step
        for _ in range(self.draw(st.integers(1, max_steps), "steps")):
            yield self.step()

    def _emit(self, step: Step, event: ev.Event, subject: str | None = None) -> None:
        step.event = event
        step.record = self.publish(event, subject)

    def _step_apply(self, step: Step) -> None:
        name = self.draw(st.sampled_from(sorted(self.catalog)))
        spec = self.catalog[name]
        if self.draw(st.booleans()):
            spec = self.draw(model_specs(name))  # a changed spec
        self._emit(step, ev.ModelApplied(at=self.tick(), model=spec))

    def _step_remove(self, step: Step) -> None:
        name = self.draw(st.sampled_from(sorted(self.catalog)))
        self._emit(step, ev.ModelRemoved(at=self.tick(), name=name))

    def _step_lose(self, step: Step) -> None:
        name = self.draw(st.sampled_from(sorted(self.fleet)))
        self._emit(step, ev.NodeLost(at=self.tick(), node=name, reason="no heartbeat", basis=self.live.seq))

    def _step_register(self, step: Step, name: str = "") -> None:
        name = name or self.draw(st.sampled_from(sorted(self.fleet)))
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
        for rep, sh in ours:
            live = sh.state in LIVE_SHARD_STATES
            gone_with_the_node = sh.state == "failed" and node is not None and node.state == "lost"
            if not (live or gone_with_the_node) or not fits(sh.gpus, sh.port):
                continue
            if not self.draw(st.booleans(), f"report {sh.id}"):
                continue
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
                    state=self.draw(st.sampled_from(RUNNING_STATES)),
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
        if self.draw(st.integers(0, 3)) == 0:  # a stray nobody placed
            self.ghosts += 1
            model = self.draw(st.sampled_from(["ghost", *sorted(self.catalog)]))
            replica = f"{model}-{900 + self.ghosts}"
            free = [g.index for g in gpus if g.index not in taken_gpus]
            stray_gpus = self.draw(st.lists(st.sampled_from(free), max_size=2, unique=True)) if free else []
            port = self.draw(st.sampled_from([p for p in PORTS if p not in taken_ports]))
            add(
                ev.RunningShard(
                    shard=f"{replica}.0",
                    replica=replica,
                    model=model,
                    profile=self.draw(st.sampled_from(["p0", "gone"])),
                    generation=self.draw(st.integers(1, 50)),
                    gpus=sorted(stray_gpus),
                    port=port,
                )
            )
        facts = self.facts[name]
        return ev.NodeRegistered(
            at=self.tick(),
            node=name,
            gpus=list(gpus),
            memory_gb=facts.memory_gb,
            cpu_cores=facts.cpu_cores,
            labels=dict(facts.labels),
            running=running,
            agent=f"agent-{name}",
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
        if self.draw(st.sampled_from(choices)) == "shard":
            live = [(rep, sh) for rep, sh in shards if sh.state in LIVE_SHARD_STATES]
            if live and self.draw(st.integers(0, 3)):  # mostly about shards still running
                shards = live
            rep, sh = self.draw(st.sampled_from(shards))
            generation = sh.generation - self.draw(st.integers(1, 3)) if stale else sh.generation
            event = ev.ShardStatus(
                at=self.tick(),
                node=sh.node,
                replica=rep.id,
                shard=sh.id,
                generation=generation,
                state=self.draw(st.sampled_from(REPORTED_STATES)),
                reason=self.draw(st.sampled_from(["", "CUDA error", "exited 0"])),
                endpoint=self.draw(st.sampled_from(["", f"http://{sh.node}:{sh.port}"])),
            )
        else:
            name, shard, stray = self.draw(st.sampled_from(strays))
            generation = stray.generation - self.draw(st.integers(1, 3)) if stale else stray.generation
            event = ev.ShardStatus(
                at=self.tick(),
                node=name,
                replica=self.stray_replicas.get((name, shard), shard.rpartition(".")[0]),
                shard=shard,
                generation=generation,
                state=self.draw(st.sampled_from(SHARD_STATES)),
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
            what = self.draw(st.sampled_from(["place", "place", "stop", "stop-stray", "wait"]))
            applied = sorted(self.live.models)
            if applied and self.draw(st.integers(0, 3)):  # mostly models in the catalog
                name = self.draw(st.sampled_from(applied))
            else:
                name = self.draw(st.sampled_from(sorted(self.catalog)))
            # Ids the log used before for models still in the catalog, now forgotten.
            forgotten = sorted(
                r for r, m in self.replicas_seen.items() if m in self.live.models and r not in self.live.replicas
            )
            replica = ""
            if what == "place" and forgotten and self.draw(st.booleans()):
                replica = self.draw(st.sampled_from(forgotten), "id used before")
                name = self.replicas_seen[replica]
            model = self.live.models.get(name)
            spec = model.spec if model is not None else self.catalog[name]
            if what == "place":
                profile = self.draw(st.sampled_from(spec.profiles))
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
                where = self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=distinct))
                shards = []
                for rank, n in enumerate(where):
                    node = self.live.nodes.get(n)
                    indices = sorted({g.index for g in self.fleet.get(n, [])} | {8})  # 8: no such GPU
                    least = 0
                    if node is not None and node.used and self.draw(st.booleans()):
                        indices, least = sorted(node.used), 1  # GPUs someone holds
                    gpus = self.draw(st.lists(st.sampled_from(indices), min_size=least, max_size=3, unique=True))
                    taken = set(node.ports) if node is not None else set()
                    if self.draw(st.booleans()):  # a port nobody holds, so that the GPUs decide
                        port = self.draw(st.sampled_from([p for p in (*PORTS, 20004, 20005) if p not in taken]))
                    else:
                        port = self.draw(st.sampled_from(sorted({*PORTS, *taken})))
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
                replica = self.draw(st.sampled_from([*sorted(self.live.replicas), f"{name}-77"]))
                actions.append(ev.StopReplica(replica=replica, reason="rogue"))
            elif what == "stop-stray":
                strays = [(n, s, x.generation) for n, node in self.live.nodes.items() for s, x in node.strays.items()]
                n, s, g = self.draw(st.sampled_from([*strays, ("unknown-node", "ghost-1.0", 1)]))
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
        name = self.draw(st.sampled_from(ready))
        node = self.live.nodes[name]
        free = [g.index for g in node.gpus if g.index not in node.used]
        gpus = self.draw(st.lists(st.sampled_from(free), max_size=2, unique=True)) if free else []
        port = self.draw(st.sampled_from([p for p in PORTS if p not in node.ports]))
        return ev.ShardPlacement(shard=f"{replica}.0", node=name, rank=0, gpus=sorted(gpus), port=port)

    # ------------------------------------------------------------------ malformed messages

    def _step_malformed(self, step: Step) -> None:
        """A message the fold must quarantine: counted, kept, and nothing else."""
        step.malformed = True
        how = self.draw(
            st.sampled_from(
                ["garbage", "not-an-event", "unknown-tag", "bad-fields", "other-node", "wrong-origin", "refused"]
            ),
            "malformed",
        )
        step.detail = how
        subject, data = getattr(self, f"_malformed_{how.replace('-', '_')}")()
        step.record = self.append(subject, data)

    def _any_subject(self) -> str:
        node = self.draw(st.sampled_from(sorted(self.fleet)))
        return self.draw(
            st.sampled_from(
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
        data = self.draw(st.sampled_from([b"", b"null", b"[]", b"{}", b'{"type": 3}', b'"model.applied"', b"{"]))
        return self._any_subject(), data

    def _malformed_unknown_tag(self) -> tuple[str, bytes]:
        data = msgspec.json.encode({"type": "model.exploded", "v": 1, "at": self.tick(), "name": "m"})
        return "llmgw.ctl.model.exploded", data

    def _malformed_bad_fields(self) -> tuple[str, bytes]:
        node = self.draw(st.sampled_from(sorted(self.fleet)))
        at = self.tick()
        return self.draw(
            st.sampled_from(
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
        speaker = self.draw(st.sampled_from([*sorted(self.fleet), "intruder"]))
        victim = self.draw(st.sampled_from([n for n in [*sorted(self.fleet), "intruder"] if n != speaker]))
        at = self.tick()
        shards = [(rep, sh) for rep in self.live.replicas.values() for sh in rep.shards]
        if shards and self.draw(st.booleans()):
            rep, sh = self.draw(st.sampled_from(shards))
            event: ev.Event = ev.ShardStatus(
                at=at, node=sh.node, replica=rep.id, shard=sh.id, generation=sh.generation, state="failed"
            )
            speaker = self.draw(st.sampled_from([n for n in [*sorted(self.fleet), "intruder"] if n != sh.node]))
        else:
            gpus = self.fleet.get(victim, [ev.Gpu(index=0, memory_gb=80.0)])
            event = ev.NodeRegistered(at=at, node=victim, gpus=list(gpus))
        return f"llmgw.agent.{speaker}.{ev.tag_of(type(event))}", ev.encode(event)

    def _malformed_wrong_origin(self) -> tuple[str, bytes]:
        """An event on a subject whose speaker may not say it."""
        node = self.draw(st.sampled_from(sorted(self.fleet)))
        at = self.tick()
        name = self.draw(st.sampled_from(sorted(self.catalog)))
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
        subject, event = self.draw(st.sampled_from(options))
        return subject, ev.encode(event)

    def _malformed_refused(self) -> tuple[str, bytes]:
        """Well-formed, from the right speaker, but against a rule of the fold."""
        at = self.tick()
        name = self.draw(st.sampled_from(sorted(self.catalog)))
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
        node = self.draw(st.sampled_from(sorted(self.fleet)))
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
            rep, sh, n = self.draw(st.sampled_from(others))
            options.append(
                ev.ShardStatus(at=at, node=n, replica=rep.id, shard=sh.id, generation=sh.generation, state="ready")
            )
        event = self.draw(st.sampled_from(options))
        return ev.subject_for(event), ev.encode(event)
