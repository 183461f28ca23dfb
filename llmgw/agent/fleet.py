"""A fleet of simulated nodes in one process: `llmgw agent --simulate --fleet N`.

Issue 18: 200 agent processes starved a 2-core machine, so a fleet of
thousands runs as N `SimulatedAgent`s in one event loop, over one NATS
connection (or a few: `connections`), each node speaking exactly as a
single simulated agent does: its own registration, heartbeat, commands,
shard states and engine keys, on its own subjects.

One connection is one NATS user, so the fleet connects with a `fleet`
credential (llmgw/bus/auth.py), which may speak on `llmgw.agent.*` and
nothing else; that each fact names the node of its subject is checked by
the fold for every agent (check_origin, core/contract/events/). A real node's agent
credential still speaks for its node alone.

Nodes come from a pattern (`shapes_from_pattern`: names such as
`sim-{i:04d}`, GPUs, racks and PDUs by number) or a YAML file
(`load_fleet_file`), whose errors name the file, line and field:

    nodes:
      - name: a100-{i:03d}       # {i}: 1..count; {rack} and {pdu} as below
        count: 500
        gpus: 8
        gpu_memory_gb: 40
        gpu_model: A100-40GB
        labels: {llmgw.io/rack: "r{rack}", llmgw.io/pdu: "p{pdu}", llmgw.io/pool: prod}
      - name: h100-solo
        gpus: 8

Test hooks, as a single simulated agent has (a core NATS request, answered):
`llmgw.sim.<node>.fail` with a shard id fails that shard;
`llmgw.sim.<node>.silence` with "on" makes the node fall silent (no
heartbeat, no command heard: lost after the control plane's grace), "off"
makes it speak again (it registers anew).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..core.contract.catalog import NAME_RE
from ..yamlfile import YamlFileError, load
from .simulated import SimulatedAgent

log = logging.getLogger("llmgw.agent")

NAME_PATTERN = "sim-{i:04d}"
# Four 8-GPU nodes to a rack (about 40 kW of H100s), two to a PDU.
NODES_PER_RACK = 4
NODES_PER_PDU = 2
LABEL_PATTERNS = {"llmgw.io/rack": "rack-{rack:04d}", "llmgw.io/pdu": "pdu-{pdu:04d}"}
# Registrations spread over this many seconds (and so the heartbeats over
# their interval): 2,000 at the same instant is a storm no fleet makes at
# boot, and a reconnect's re-registration is what measures the storm.
START_SPREAD_S = 1.0
# At most this many registrations in flight at once after a reconnect.
REREGISTER_AT_ONCE = 256
BEAT_SLICES = 10  # a fleet's heartbeats go in this many slices of the interval


class FleetError(ValueError):
    """A fleet that cannot be made: the field and what is wrong with it."""


@dataclass(frozen=True)
class NodeShape:
    name: str
    gpus: int = 8
    gpu_memory_gb: float = 80.0
    gpu_model: str = "SIM-80GB"
    memory_gb: float = 0.0
    cpu_cores: int = 0
    labels: dict[str, str] = field(default_factory=dict)


def _fill(pattern: str, what: str, i: int, per_rack: int, per_pdu: int) -> str:
    try:
        return pattern.format(i=i, rack=(i - 1) // per_rack + 1, pdu=(i - 1) // per_pdu + 1)
    except (KeyError, IndexError, ValueError) as e:
        raise FleetError(f"{what} {pattern!r}: {type(e).__name__}: {e} (it may use {{i}}, {{rack}} and {{pdu}})") from None


def shapes_from_pattern(
    count: int,
    name: str = NAME_PATTERN,
    *,
    gpus: int = 8,
    gpu_memory_gb: float = 80.0,
    gpu_model: str = "SIM-80GB",
    labels: dict[str, str] | None = None,
    per_rack: int = NODES_PER_RACK,
    per_pdu: int = NODES_PER_PDU,
    first: int = 1,
) -> list[NodeShape]:
    """`count` nodes named by `name` ({i} from `first`), labels as patterns too:
    a rack and a PDU each (LABEL_PATTERNS) and `labels` (which win for the same key)."""
    if count < 1:
        raise FleetError(f"--fleet: at least one node, not {count}")
    if per_rack < 1 or per_pdu < 1:
        raise FleetError("nodes per rack and per PDU: at least 1")
    labels = {**LABEL_PATTERNS, **(labels or {})}
    out = []
    for i in range(first, first + count):
        node = _fill(name, "the name", i, per_rack, per_pdu)
        values = {k: _fill(v, f"the label {k}", i, per_rack, per_pdu) for k, v in labels.items()}
        out.append(NodeShape(name=node, gpus=gpus, gpu_memory_gb=gpu_memory_gb, gpu_model=gpu_model, labels=values))
    return check_names(out, "--name")


def check_names(shapes: list[NodeShape], where: str) -> list[NodeShape]:
    seen: set[str] = set()
    for s in shapes:
        if not NAME_RE.match(s.name):
            raise FleetError(f"{where}: a node name is letters, digits, _ and - (at most 64), not {s.name!r}")
        if s.name in seen:
            raise FleetError(f"{where}: the node name {s.name!r} comes twice (put {{i}} in the pattern)")
        seen.add(s.name)
    return shapes


class _FileNodes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    count: int = Field(default=1, ge=1)
    gpus: int = Field(default=8, ge=0)
    gpu_memory_gb: float = Field(default=80.0, ge=0)
    gpu_model: str = "SIM-80GB"
    memory_gb: float = Field(default=0.0, ge=0)
    cpu_cores: int = Field(default=0, ge=0)
    labels: dict[str, str] = {}


class _FleetFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[_FileNodes] = Field(min_length=1)
    nodes_per_rack: int = Field(default=NODES_PER_RACK, ge=1)
    nodes_per_pdu: int = Field(default=NODES_PER_PDU, ge=1)


def load_fleet_file(path: str | Path) -> list[NodeShape]:
    """The nodes of a fleet file; YamlFileError naming file, line and field."""
    spec, _ = load(path, _FleetFile)
    out: list[NodeShape] = []
    for k, group in enumerate(spec.nodes):
        where = f"{path}: nodes[{k}]"
        try:
            names = [_fill(group.name, "the name", i, spec.nodes_per_rack, spec.nodes_per_pdu) for i in range(1, group.count + 1)]
            for i, node in enumerate(names, 1):
                labels = {
                    lk: _fill(v, f"the label {lk}", i, spec.nodes_per_rack, spec.nodes_per_pdu) for lk, v in group.labels.items()
                }
                out.append(NodeShape(
                    name=node, gpus=group.gpus, gpu_memory_gb=group.gpu_memory_gb, gpu_model=group.gpu_model,
                    memory_gb=group.memory_gb, cpu_cores=group.cpu_cores, labels=labels,
                ))  # fmt: skip
        except FleetError as e:
            raise YamlFileError(f"{where}: {e}") from None
    try:
        return check_names(out, str(path))
    except FleetError as e:
        raise YamlFileError(str(e)) from None


async def ask(url: str, creds: str | None, node: str, hook: str, body: bytes, timeout: float = 30.0) -> bytes:
    """Ask a simulated node's test hook (`fail` SHARD, `silence` on|off) as
    `creds` (the operator's may); its answer."""
    import nats

    from ..bus import credentials

    opts: dict = {}
    if creds:
        opts.update(user_credentials=str(creds), inbox_prefix=credentials.identity(creds).inbox_prefix)
    nc = await nats.connect(url, **opts)
    try:
        return (await nc.request(f"llmgw.sim.{node}.{hook}", body, timeout=timeout)).data
    finally:
        await nc.close()


class Fleet:
    """N simulated nodes over a few shared connections (node i on bus i mod K)."""

    def __init__(self, buses: list, shapes: list[NodeShape], *, spread: float = START_SPREAD_S, **agent_settings) -> None:
        if not buses:
            raise FleetError("a fleet needs a connection")
        self.buses = buses
        self.spread = spread
        self.agents: dict[str, SimulatedAgent] = {}
        self._bus_of: dict[str, object] = {}
        for i, s in enumerate(shapes):
            bus = buses[i % len(buses)]
            self.agents[s.name] = SimulatedAgent(
                bus, s.name, s.gpus, gpu_memory_gb=s.gpu_memory_gb, gpu_model=s.gpu_model, memory_gb=s.memory_gb,
                cpu_cores=s.cpu_cores, labels=s.labels, register_on_reconnect=False, beats=False, **agent_settings,
            )  # fmt: skip
            self._bus_of[s.name] = bus
        self.registered = asyncio.Event()
        self.reregistrations = 0
        self.heartbeat = agent_settings.get("heartbeat", 1.0)

    async def run(self, stop: asyncio.Event) -> None:
        subs = []
        for bus in self.buses:
            hooks = getattr(bus, "on_reconnect", None)
            if hooks is not None:
                hooks.append(lambda b=bus: self.register_again(b))
            nc = getattr(bus, "nc", None)
            if nc is not None:  # the test hooks, one subscription per connection for all its nodes
                mine = [n for n, b in self._bus_of.items() if b is bus]
                # (a node's own agent credential may hear only its own hooks)
                subject = f"llmgw.sim.{mine[0]}.*" if len(mine) == 1 else "llmgw.sim.*.*"
                subs.append(await nc.subscribe(subject, cb=self._on_hook))
        agents = list(self.agents.values())
        began = time.monotonic()
        tasks = []
        for i, agent in enumerate(agents):
            due = began + self.spread * i / len(agents)
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            if stop.is_set():
                break
            tasks.append(asyncio.create_task(agent.run(stop)))
        started = len(tasks)
        tasks.append(asyncio.create_task(self._beats(stop)))
        await asyncio.gather(*(a.registered.wait() for a in agents[:started]))
        self.registered.set()
        log.info(
            "fleet of %d simulated nodes registered in %.1fs over %d connection(s)",
            started, time.monotonic() - began, len(self.buses),
        )  # fmt: skip
        try:
            await asyncio.gather(*tasks)
        finally:
            for sub in subs:
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass

    async def _beats(self, stop: asyncio.Event) -> None:
        """Every node's heartbeat, each `heartbeat` seconds, in BEAT_SLICES
        slices over the interval (no burst of thousands at one instant), not
        awaiting each ack (bus.beat_unacked): one loop for the fleet instead of
        a timer and an acked request per node, which at 2,000 nodes on one
        connection delivered 0.3 beats a node a second and timed out."""
        agents = list(self.agents.values())
        slices = [agents[k::BEAT_SLICES] for k in range(BEAT_SLICES)]
        while not stop.is_set():
            for part in slices:
                began = time.monotonic()
                for agent in part:
                    if agent.silent or not agent.registered.is_set():
                        continue
                    bus = self._bus_of[agent.name]
                    send = getattr(bus, "beat_unacked", None) or bus.beat
                    try:
                        await send(agent.name, agent.beat_body())
                    except Exception as e:
                        log.warning("heartbeat of %s failed: %s", agent.name, e)
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, self.heartbeat / BEAT_SLICES - (time.monotonic() - began)))
                    return
                except asyncio.TimeoutError:
                    pass

    async def register_again(self, bus) -> None:
        """After a reconnect of `bus`: every node on it registers again (what
        it runs, for adoption), a bounded number at a time."""
        gate = asyncio.Semaphore(REREGISTER_AT_ONCE)

        async def one(agent: SimulatedAgent) -> None:
            async with gate:
                if not agent.silent:
                    await agent._register()
                    self.reregistrations += 1

        await asyncio.gather(*(one(a) for n, a in self.agents.items() if self._bus_of[n] is bus))

    async def _on_hook(self, msg) -> None:
        _, _, node, verb = msg.subject.split(".", 3)
        agent = self.agents.get(node)
        if agent is None:
            answer = b"no such node in this fleet"
        elif verb == "fail":
            answer = b"failed" if await agent.fail(msg.data.decode(), "failed on request") else b"no such shard running"
        elif verb == "silence":
            await agent.silence(msg.data.strip() != b"off")
            answer = b"silent" if agent.silent else b"speaking"
        else:
            answer = b"no such hook"
        if msg.reply:
            await msg.respond(answer)
