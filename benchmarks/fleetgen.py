"""A recorded log for the benchmarks: a simulated fleet run through the real core.

The log is what a control plane over ~200 busy nodes would have recorded:
nodes register, the operator applies models, `decide` places replicas (each
pass one `Decided`, with `basis` the sequence it was decided on), agents
report their shards starting, loading and ready, shards fail at random and
are stopped and replaced, models are removed and applied again, changed and
scaled, nodes crash (`NodeLost`, then a bare re-registration), are cut off
and come back with shards no one claims any more (strays, stopped), agents
restart, and a handful of malformed messages arrive that the fold must
quarantine.

Everything goes through the real core: each event is encoded with
`llmgw.core.contract.events.encode`, published on `subject_for(event)` and folded into
the generator's own state with `fold.apply` (seq = its position), decisions
are `decide(state, now)` on that state, and what the agents are told to do is
`commands.outstanding(state)`, exactly what the control plane sends. Time is
simulated and the randomness seeded: the same N gives the same file.

`decide` is called once per window of simulated time in which anything
happened (a control plane decides after each burst), not after every event.

    python benchmarks/fleetgen.py --events 1000000 [--mix status|realistic|decisions] [--out FILE]

`--mix` picks other proportions of events (benchmarks/fleetmix.py): this
module's own is status-heavy.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.core.folding import commands as cmds  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.core.contract.catalog import profile_named  # noqa: E402
from llmgw.core.rules.decide import decide  # noqa: E402
from llmgw.core.folding.fold import apply, encode_state  # noqa: E402
from llmgw.core.folding.state import State  # noqa: E402
from llmgw.replay.logfile import encode_record  # noqa: E402

# Bump whenever the generator would write a different log for the same N.
# 2: nodes carry a fabric label (multi-node profiles need one), host memory and CPU accounted.
# 3: fleetmix's mixes no longer run twice each event pending at an operator's change.
GEN_VERSION = 3
SEED = 20250611
T0 = 1_760_000_000.0  # simulated start (October 2025), well before any real clock now

CACHE_DIR = Path(__file__).resolve().parent / ".cache"

# The fleet.
BIG_NODES, SMALL_NODES, GPUS_PER_NODE = 150, 50, 8
WINDOW = 15.0  # simulated seconds between control plane passes
GRACE = 10.0  # the control plane's node_grace

# Rates, per simulated second.
SHARD_FAILURES = 1.0 / 1.0  # random failures of running shards, fleet-wide
NODE_CRASHES = 1.0 / 5400  # a node dies with everything on it
PARTITIONS = 1.0 / 14400  # a node is cut off, keeps running, comes back
AGENT_RESTARTS = 1.0 / 1800  # an agent restarts; its engines go on running
OPERATOR = 1.0 / 1200  # the operator removes, changes or scales a model
LOAD_FAILURE = 0.04  # chance a shard fails while loading
MALFORMED = 9  # malformed messages spread over the log

FAILURE_REASONS = [
    "engine exited with status 137 (OOM killed)",
    "CUDA error: uncorrectable ECC error encountered",
    "health check failed 3 times in a row",
    "NCCL watchdog timeout after 600s",
    "engine exited with status 1: RuntimeError: CUDA error: an illegal memory access was encountered",
]
LOAD_FAILURE_REASONS = [
    "torch.OutOfMemoryError: CUDA out of memory while loading weights",
    "weights download failed: 503 Service Unavailable",
    "engine exited with status 1 during startup",
]


class Full(Exception):
    """The log has the number of events asked for."""


@dataclass
class Agent:
    name: str
    gpus: list[ev.Gpu]
    memory_gb: float
    labels: dict[str, str]
    up: bool = False  # the machine runs
    reachable: bool = True  # its agent can reach NATS
    instance: int = 0
    running: dict[str, ev.RunningShard] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)  # shard -> token of its pending lifecycle
    acted: set = field(default_factory=set)

    @property
    def speaks(self) -> bool:
        return self.up and self.reachable


def catalog(rng: random.Random) -> list[ev.ModelSpec]:
    """~40 models, 1-4 GPUs per shard, a few spanning two nodes."""
    families = ["llama-3.1", "qwen2.5", "mistral", "gemma-2", "phi-3", "deepseek-coder", "yi-1.5", "granite-3"]
    models = []

    def prof(name, gpus, mem, nodes=1, tp=None):
        args = ["--max-model-len", str(rng.choice([8192, 16384, 32768])), "--tensor-parallel-size", str(tp or gpus)]
        if nodes > 1:
            args += ["--pipeline-parallel-size", str(nodes)]
        return ev.ProfileSpec(name=name, engine="vllm", args=args, gpus=gpus, nodes=nodes, gpu_memory_gb=mem,
                              memory_gb=32.0 * gpus)

    for fam in families:
        for size in rng.sample([1, 3, 7, 8, 9, 13, 14, 27, 32, 34, 70, 72], 5):
            name = f"{fam}-{size}b"
            if size <= 9:
                profiles = [prof("tp1", 1, 40.0)]
                replicas = rng.randint(10, 36)
            elif size <= 34:
                profiles = [prof("tp2", 2, 80.0), prof("tp4-40g", 4, 40.0)]
                replicas = rng.randint(6, 26)
            else:
                profiles = [prof("tp4", 4, 80.0), prof("pp2-tp4-40g", 4, 40.0, nodes=2)]
                replicas = rng.randint(3, 14)
            models.append(ev.ModelSpec(name=name, profiles=profiles, min_replicas=replicas, owner=fam.split("-")[0],
                                       aliases=[name.replace("-", "_")]))
    models.append(ev.ModelSpec(name="llama-3.1-405b", profiles=[prof("pp2-tp4", 4, 80.0, nodes=2)], min_replicas=2))
    return models


class Fleet:
    def __init__(self, n_events: int, out, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self.n = n_events
        self.out = out
        self.state = State()
        self.seq = 0
        self.limit = n_events - 1  # the last event is the final ModelApplied
        self.now = T0
        self.heap: list = []
        self.counter = itertools.count()
        self.tokens = itertools.count(1)
        self.dirty = False
        self.resend: set[str] = set()
        self.leader = self._leader()
        self.kinds: Counter = Counter()
        self.passes = 0
        self.decide_s = 0.0
        self.window = WINDOW
        rng = self.rng
        self.agents: dict[str, Agent] = {}
        for i in range(BIG_NODES + SMALL_NODES):
            big = i < BIG_NODES
            name = f"gpu-{'h' if big else 'a'}{i:03d}"
            model, mem = ("H100-80GB", 80.0) if big else ("A100-40GB", 40.0)
            self.agents[name] = Agent(
                name=name,
                gpus=[ev.Gpu(index=g, model=model, memory_gb=mem) for g in range(GPUS_PER_NODE)],
                memory_gb=2048.0 if big else 1024.0,
                # One fabric per zone: the multi-node profiles place within one.
                labels={"zone": f"zone-{i % 4}", "gpu": model, "llmgw.io/fabric": f"ib-{i % 4}"},
            )
        self.names = sorted(self.agents)
        self.models = {m.name: m for m in catalog(rng)}
        self.removed: set[str] = set()
        # Malformed messages at random places in the log.
        span = max(n_events - 3000, 10)
        self.malformed_at = sorted(rng.sample(range(min(2000, span // 2), span), min(MALFORMED, span // 4)))
        self.malformed_kinds = itertools.cycle(range(MALFORMED))

    # ------------------------------------------------------------------ the log

    def _leader(self) -> str:
        return "%012x" % self.rng.getrandbits(48)

    def emit(self, event: ev.Event) -> None:
        self.publish(ev.subject_for(event), ev.encode(event), ev.tag_of(type(event)))

    def publish(self, subject: str, data: bytes, kind: str) -> None:
        if self.seq >= self.limit:
            raise Full
        self.seq += 1
        apply(self.state, self.seq, subject, data)
        self.out.write(encode_record(self.seq, subject, data))
        self.kinds[kind] += 1
        self.dirty = True
        if self.malformed_at and self.seq >= self.malformed_at[0]:
            self.malformed_at.pop(0)
            self.malformed()

    def at(self, delay: float, kind: str, *args) -> None:
        heapq.heappush(self.heap, (self.now + delay, next(self.counter), kind, args))

    def every(self, rate: float, kind: str) -> None:
        self.at(self.rng.expovariate(rate), kind)

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        rng = self.rng
        for i, name in enumerate(self.names):
            self.at(i * 0.05 + rng.random(), "boot", name)
        for i, name in enumerate(self.models):
            self.at(5.0 + i * 0.3, "apply", name)
        self.at(120.0, "fail")
        self.every(NODE_CRASHES, "crash")
        self.every(PARTITIONS, "partition")
        self.every(AGENT_RESTARTS, "restart")
        self.at(900.0, "operator")
        self.at(12 * 3600.0, "failover")
        next_pass = self.now + 1.0
        try:
            while True:
                self.run_until(next_pass)
                if self.dirty:
                    self.control_pass()
                next_pass += self.window
        except Full:
            pass
        # The end of the log leaves something to decide: a new model that wants a replica.
        self.limit = self.n
        self.now += 1.0
        self.emit(ev.ModelApplied(at=self.now, model=final_model("bench-final-0")))

    def run_until(self, until: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= until:
            t, _, kind, args = heapq.heappop(heap)
            self.now = t
            getattr(self, "on_" + kind)(*args)
        self.now = until

    def control_pass(self) -> None:
        """What the control plane does after a burst: decide, publish, send commands."""
        self.dirty = False
        t = time.perf_counter()
        basis = self.state.seq
        actions = decide(self.state, self.now)
        self.decide_s += time.perf_counter() - t
        self.passes += 1
        if actions:
            # Agents go on publishing while the decision is on its way: whatever
            # lands meanwhile is folded first, and may void part of it.
            decided_at = self.now
            self.run_until(self.now + self.rng.uniform(0.001, 0.02))
            self.emit(ev.Decided(at=decided_at, basis=basis, actions=actions, leader=self.leader))
            self.send_for(actions)
        if self.resend:
            # A registration follows a fresh connection: everything outstanding
            # for that node is sent again, as the control plane does.
            nodes, self.resend = self.resend, set()
            for node, cmd in cmds.outstanding(self.state):
                if node in nodes:
                    self.deliver(node, cmd)

    def send_for(self, actions: list[ev.Action]) -> None:
        """The commands that follow from a folded decision: what
        `commands.outstanding` yields for the replicas and strays it names
        (scanning every replica on every pass would cost more than decide)."""
        state = self.state
        for a in actions:
            if isinstance(a, ev.PlaceReplica):
                rep = state.replicas.get(a.replica)
                if rep is None or rep.state == "stopping":
                    continue  # voided, or stopped already
                model = state.models.get(rep.model)
                profile = profile_named(model.spec, rep.profile) if model else None
                if profile is None:
                    continue
                nodes = [s.node for s in sorted(rep.shards, key=lambda s: s.rank)]
                for sh in rep.shards:
                    if sh.state == "placing":
                        self.deliver(sh.node, cmds.StartShard(
                            shard=sh.id, replica=rep.id, generation=sh.generation, model=rep.model,
                            profile=profile, fingerprint=rep.fingerprint, rank=sh.rank, gpus=sh.gpus,
                            port=sh.port, nodes=nodes))
            elif isinstance(a, ev.StopReplica):
                rep = state.replicas.get(a.replica)
                for sh in rep.shards if rep is not None else ():
                    if sh.state == "stopping":
                        self.deliver(sh.node, cmds.StopShard(shard=sh.id, generation=sh.generation, reason=rep.reason))
            elif isinstance(a, ev.StopStray):
                node = state.nodes.get(a.node)
                stray = node.strays.get(a.shard) if node is not None else None
                if stray is not None and stray.stopping:
                    self.deliver(a.node, cmds.StopShard(shard=a.shard, generation=stray.generation, reason=stray.reason))

    def deliver(self, node: str, cmd: cmds.Command) -> None:
        n = self.state.nodes.get(node)
        agent = self.agents[node]
        if n is None or n.state != "ready" or not agent.speaks:
            return  # lost on the way; sent again when the node registers
        key = (cmd.shard, cmd.generation, type(cmd).__name__)
        if key in agent.acted:
            return
        agent.acted.add(key)
        if isinstance(cmd, cmds.StartShard):
            self.start(agent, cmd)
        else:
            self.stop(agent, cmd)

    # ------------------------------------------------------------------ agents

    def register(self, agent: Agent) -> None:
        agent.instance += 1
        self.resend.add(agent.name)
        self.emit(
            ev.NodeRegistered(
                at=self.now,
                node=agent.name,
                gpus=agent.gpus,
                memory_gb=agent.memory_gb,
                cpu_cores=128,
                labels=agent.labels,
                running=list(agent.running.values()),
                agent=f"llmgw-agent/{agent.name}-{agent.instance}",
            )
        )

    def status(self, agent: Agent, replica: str, shard: str, generation: int, state: str,
               reason: str = "", endpoint: str = "") -> None:
        if agent.speaks:
            self.emit(ev.ShardStatus(at=self.now, node=agent.name, replica=replica, shard=shard,
                                     generation=generation, state=state, reason=reason, endpoint=endpoint))

    def start(self, agent: Agent, cmd: cmds.StartShard) -> None:
        if (cmd.shard, cmd.generation, "StopShard") in agent.acted:
            return
        have = agent.running.get(cmd.shard)
        if have is not None and have.generation == cmd.generation:
            return  # a restarted agent told again about an engine it runs
        agent.running[cmd.shard] = ev.RunningShard(
            shard=cmd.shard, replica=cmd.replica, model=cmd.model, profile=cmd.profile.name,
            generation=cmd.generation, rank=cmd.rank, gpus=list(cmd.gpus), port=cmd.port, state="starting",
        )
        token = agent.tasks[cmd.shard] = next(self.tokens)
        self.at(self.rng.uniform(0.05, 1.5), "lifecycle", agent.name, cmd.shard, token, 0)

    def stop(self, agent: Agent, cmd: cmds.StopShard) -> None:
        agent.tasks.pop(cmd.shard, None)
        sh = agent.running.pop(cmd.shard, None)
        replica = sh.replica if sh else cmd.shard.rpartition(".")[0]
        self.at(self.rng.uniform(0.5, 8.0), "stopped", agent.name, replica, cmd.shard, cmd.generation,
                cmd.reason, agent.instance)

    def on_lifecycle(self, node: str, shard: str, token: int, step: int) -> None:
        agent = self.agents[node]
        if agent.tasks.get(shard) != token:
            return  # stopped, failed or the machine went down meanwhile
        sh = agent.running[shard]
        if step == 0:
            self.status(agent, sh.replica, shard, sh.generation, "starting")
            self.at(self.rng.uniform(1.0, 6.0), "lifecycle", node, shard, token, 1)
        elif step == 1:
            sh.state = "loading"
            self.status(agent, sh.replica, shard, sh.generation, "loading")
            self.at(self.rng.uniform(20.0, 180.0), "lifecycle", node, shard, token, 2)
        else:
            del agent.tasks[shard]
            if self.rng.random() < LOAD_FAILURE:
                del agent.running[shard]
                self.status(agent, sh.replica, shard, sh.generation, "failed",
                            reason=self.rng.choice(LOAD_FAILURE_REASONS))
            else:
                sh.state, sh.endpoint = "ready", f"http://{node}:{sh.port}"
                self.status(agent, sh.replica, shard, sh.generation, "ready", endpoint=sh.endpoint)

    def on_stopped(self, node: str, replica: str, shard: str, generation: int, reason: str, instance: int) -> None:
        agent = self.agents[node]
        if agent.instance == instance:
            self.status(agent, replica, shard, generation, "stopped", reason=reason)

    def on_fail(self) -> None:
        self.every(SHARD_FAILURES, "fail")
        agent = self.agents[self.rng.choice(self.names)]
        if not agent.speaks or not agent.running:
            return
        shard = self.rng.choice(list(agent.running))
        sh = agent.running.pop(shard)
        agent.tasks.pop(shard, None)
        self.status(agent, sh.replica, shard, sh.generation, "failed", reason=self.rng.choice(FAILURE_REASONS))

    def on_boot(self, node: str) -> None:
        agent = self.agents[node]
        agent.up, agent.reachable = True, True
        agent.running.clear()
        agent.tasks.clear()
        agent.acted.clear()
        self.register(agent)

    def on_crash(self) -> None:
        self.every(NODE_CRASHES, "crash")
        agent = self.agents[self.rng.choice(self.names)]
        if not agent.speaks:
            return
        agent.up = False
        agent.running.clear()
        agent.tasks.clear()
        self.at(GRACE + self.rng.uniform(0.5, 3.0), "lost", agent.name, self.now)
        self.at(self.rng.uniform(180.0, 1800.0), "boot", agent.name)

    def on_partition(self) -> None:
        self.every(PARTITIONS, "partition")
        agent = self.agents[self.rng.choice(self.names)]
        if not agent.speaks:
            return
        agent.reachable = False
        self.at(GRACE + self.rng.uniform(0.5, 3.0), "lost", agent.name, self.now)
        self.at(self.rng.uniform(30.0, 600.0), "heal", agent.name)

    def on_heal(self, node: str) -> None:
        agent = self.agents[node]
        if agent.up:
            agent.reachable = True
            self.register(agent)

    def on_restart(self) -> None:
        self.every(AGENT_RESTARTS, "restart")
        agent = self.agents[self.rng.choice(self.names)]
        if agent.speaks:
            agent.acted.clear()  # a new agent instance
            self.register(agent)

    def on_lost(self, node: str, since: float) -> None:
        """The control plane's liveness check: no heartbeat within the grace."""
        agent = self.agents[node]
        n = self.state.nodes.get(node)
        if not agent.speaks and n is not None and n.state == "ready":
            quiet = self.now - since
            self.emit(ev.NodeLost(at=self.now, node=node, reason=f"no heartbeat for {quiet:.0f}s (grace {GRACE:g}s)",
                                  basis=self.state.seq))

    def on_failover(self) -> None:
        self.at(self.rng.uniform(8, 16) * 3600.0, "failover")
        self.leader = self._leader()

    # ------------------------------------------------------------------ the operator

    def on_apply(self, name: str) -> None:
        self.removed.discard(name)
        self.emit(ev.ModelApplied(at=self.now, model=self.models[name]))

    def on_operator(self) -> None:
        self.every(OPERATOR, "operator")
        rng = self.rng
        live = sorted(set(self.models) - self.removed)
        name = rng.choice(live)
        spec = self.models[name]
        what = rng.random()
        if what < 0.35 and len(live) > 10:
            self.removed.add(name)
            self.emit(ev.ModelRemoved(at=self.now, name=name))
            self.at(rng.uniform(600.0, 3600.0), "apply", name)
        elif what < 0.65:
            # A changed engine setting: every replica of the model is replaced.
            p = spec.profiles[0]
            args = list(p.args)
            i = args.index("--max-model-len") + 1
            args[i] = str(rng.choice([8192, 16384, 32768, 65536]))
            profiles = [msgspec_replace(p, args=args)] + list(spec.profiles[1:])
            self.models[name] = msgspec_replace(spec, profiles=profiles)
            self.on_apply(name)
        else:
            n = max(1, min(40, spec.min_replicas + rng.choice([-3, -1, 1, 3])))
            self.models[name] = msgspec_replace(spec, min_replicas=n)
            self.on_apply(name)

    # ------------------------------------------------------------------ malformed messages

    def malformed(self) -> None:
        kind = next(self.malformed_kinds)
        node = self.rng.choice(self.names)
        other = self.rng.choice([n for n in self.names if n != node])
        at = self.now
        bad: list[tuple[str, bytes]] = [
            (f"llmgw.agent.{node}.shard.status", b"\x00\xffnot json at all \xfe"),
            (f"llmgw.agent.{node}.node.rebooted", b'{"type":"node.rebooted","v":1,"at":%f,"node":"%s"}' % (at, node.encode())),
            (f"llmgw.agent.{other}.shard.status", ev.encode(ev.ShardStatus(
                at=at, node=node, replica="qwen2.5-7b-1", shard="qwen2.5-7b-1.0", generation=1, state="ready"))),
            (f"llmgw.agent.{node}.model.applied", ev.encode(ev.ModelApplied(at=at, model=final_model("sneaky")))),
            ("llmgw.ctl.model.applied", ev.encode(ev.ModelApplied(at=at, model=final_model("bad name!")))),
            (f"llmgw.agent.{node}.node.registered", ev.encode(ev.NodeRegistered(
                at=at, node=node, gpus=[ev.Gpu(index=0), ev.Gpu(index=0)]))),
            (f"llmgw.agent.{node}.shard.status", b'{"type":"shard.status","v":1,"at":%f,"node":"%s"}' % (at, node.encode())),
            ("llmgw.ctl.model.removed", b'{"type":"model.removed","v":1,"at":%f,"name":"llama-3.1-8b"' % at),
            ("llmgw.ctl.control.decided", ev.encode(ev.Decided(at=at, basis=self.seq, actions=[]))),
        ]
        subject, data = bad[kind % len(bad)]
        self.publish(subject, data, "malformed")


def msgspec_replace(obj, **changes):
    return msgspec.structs.replace(obj, **changes)


def final_model(name: str) -> ev.ModelSpec:
    return ev.ModelSpec(name=name, profiles=[ev.ProfileSpec(name="tp1", engine="vllm", gpus=1)], min_replicas=1)


# ---------------------------------------------------------------------- the file and its cache


# The mixes of events a log may have: this module's, and fleetmix.py's.
MIXES = ("status", "realistic", "decisions")


def cache_path(n_events: int, seed: int = SEED, mix: str = "status") -> Path:
    kind = "" if mix == "status" else f"-{mix}"
    return CACHE_DIR / f"fleet-v{GEN_VERSION}{kind}-s{seed}-n{n_events}.jsonl"


def generate(path: Path, n_events: int, seed: int = SEED, mix: str = "status") -> dict:
    """Write the log to `path`; returns what it holds, for the benchmark to print."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    t = time.perf_counter()
    with open(tmp, "wb", buffering=1 << 20) as out:
        if mix == "status":
            fleet = Fleet(n_events, out, seed)
        else:
            import fleetmix  # (it builds on this module)

            fleet = fleetmix.MixedFleet(n_events, out, seed, fleetmix.MIXES[mix])
        fleet.run()
    os.replace(tmp, path)
    state = fleet.state
    gpus = sum(len(n.gpus) for n in state.nodes.values())
    used = sum(len(n.used) for n in state.nodes.values())
    info = {
        "version": GEN_VERSION,
        "mix": mix,
        "seed": seed,
        "events": fleet.seq,
        "generate_s": round(time.perf_counter() - t, 2),
        "decide_passes": fleet.passes,
        "decide_s": round(fleet.decide_s, 2),
        "simulated_hours": round((fleet.now - T0) / 3600, 1),
        "kinds": dict(sorted(fleet.kinds.items())),
        "quarantined": state.quarantine_count,
        "voided": state.voided_count,
        "nodes": len(state.nodes),
        "nodes_lost": sum(1 for n in state.nodes.values() if n.state == "lost"),
        "models": len(state.models),
        "replicas": len(state.replicas),
        "replicas_by_state": dict(sorted(Counter(r.state for r in state.replicas.values()).items())),
        "gpus_used": used,
        "gpus": gpus,
        "strays": sum(len(n.strays) for n in state.nodes.values()),
        "bytes": path.stat().st_size,
        "state_sha256": hashlib.sha256(encode_state(state)).hexdigest(),
    }
    path.with_suffix(".json").write_text(json.dumps(info, indent=1))
    return info


def cached(n_events: int, seed: int = SEED, mix: str = "status") -> tuple[Path, dict, bool]:
    """The log for N events, generated unless the cache has it: (path, info, generated now).

    Keyed by N, seed and GEN_VERSION only: a log recorded by an older core stays
    a valid log (the log is forever). Delete benchmarks/.cache/ to record anew."""
    path = cache_path(n_events, seed, mix)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        try:
            return path, json.loads(meta.read_text()), False
        except ValueError:
            pass
    return path, generate(path, n_events, seed, mix), True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events in the log (default 1,000,000)")
    p.add_argument("--seed", type=int, default=SEED, help="the randomness: the same seed and N give the same file")
    p.add_argument("--mix", choices=MIXES, default="status",
                   help="status: this module's status-heavy log; realistic: a day of a real fleet; decisions: a "
                        "decision-heavy one (fleetmix.py says how their proportions were chosen)")
    p.add_argument("--out", type=Path, help="write here instead of the cache")
    a = p.parse_args(argv)
    if a.out:
        info = generate(a.out, a.events, a.seed, a.mix)
        path = a.out
    else:
        path, info, _ = cached(a.events, a.seed, a.mix)
    print(path)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
