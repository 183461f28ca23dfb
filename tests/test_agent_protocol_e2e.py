"""One protocol scenario, run against the real agent (its engines the
stand-in engine, tests/fake_engine.py) and the simulated one, over a real
nats-server: the same commands must give the same story in the log, so the
two cannot drift apart again (issue 33; the rules: llmgw/agent/protocol.py).

The scenario: commands signed for the node, redelivered, forged, of a
deposed leader, meant for another node, of an older generation, a stop
before its start, a newer generation replacing the one running, a
re-register asked for, and NATS itself restarted (the agent registers
again once reconnected)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from llmgw.agent import agentfile
from llmgw.agent.agentfile import AgentFile
from llmgw.agent.inventory import Inventory
from llmgw.agent.node import NodeAgent
from llmgw.agent.simulated import SimulatedAgent
from llmgw.bus import keystore, read_log, signing
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import engine_ports
from .scenario import until
from .test_agent import reaper  # noqa: F401 (a fixture)
from .test_agent_protocol import start, stop

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

FAKE = Path(__file__).resolve().parent / "fake_engine.py"
NODE = "n1"
TERM = 2

# What the log must say of the node, for either agent: (shard, generation,
# state, reason) of each ShardStatus ("loading" left out: a stand-in engine
# may be ready before it is seen loading), and the registrations.
STORY = [
    ("m-1.0", 5, "starting", ""),
    ("m-1.0", 5, "ready", ""),
    ("m-1.0", 4, "stopped", "r"),  # an older generation's stop: acknowledged, the running one untouched
    ("c-1.0", 1, "stopped", "r"),  # a stop before its start: the start never acted on
    ("m-1.0", 5, "stopped", "generation 7 replaces it"),
    ("m-1.0", 7, "starting", ""),
    ("m-1.0", 7, "ready", ""),
    ("m-1.0", 7, "stopped", "r"),
]
# (the older generation's start is admitted, and starts nothing: start_plan's "runs already")
OUTCOMES = {"start": 3, "stop": 3, "duplicate": 3, "refused": 2, "another node": 1, "stopped before": 1, "register": 1}
REFUSED = {"unsigned": 1, "stale term": 1}


async def story(bus) -> tuple[list[tuple], list[list[tuple]]]:
    statuses, registrations = [], []
    for _, _, data in await read_log(bus):
        e = ev.decode(data)
        if isinstance(e, ev.ShardStatus) and e.node == NODE and e.state != "loading":
            statuses.append((e.shard, e.generation, e.state, e.reason))
        elif isinstance(e, ev.NodeRegistered) and e.node == NODE:
            registrations.append([(r.shard, r.generation, r.state) for r in e.running])
    return statuses, registrations


def make_agent(kind: str, bus, verifier, tmp_path: Path):
    if kind == "simulated":
        return SimulatedAgent(bus, NODE, 1, loading_after=0.01, ready_after=0.05, heartbeat=0.2, command_key=verifier)
    ports = agentfile.PortRange.parse(engine_ports())
    file = AgentFile(engine_ports=ports, stop_timeout_s=5, start_timeout_s=30,
                     templates={"fake": f"{sys.executable} {FAKE} --port {{port}}"})  # fmt: skip
    return NodeAgent(
        bus, NODE, state_dir=tmp_path / "agent", agent_file=file, inventory=Inventory(gpus=[], cpu_cores=2, memory_gb=4),
        heartbeat=0.2, check_interval=0.05, ready_interval=0.2, stop_engines_on_exit=True, command_key=verifier,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["real", "simulated"])
async def test_the_real_and_the_simulated_agent_tell_the_same_story(kind, nats_server, tmp_path, reaper):
    keys = keystore.Keystore(tmp_path / "commands").init()
    signer = signing.Signer.from_file(keys.keys_dir / signing.SEED_FILE)
    verifier = signing.Verifier.load(str(keys.folder / signing.PUBLIC_FILE))
    bus = await NatsBus.connect(nats_server.url, forever=True)
    watcher = await NatsBus.connect(nats_server.url, forever=True)
    agent = make_agent(kind, bus, verifier, tmp_path)
    halt = asyncio.Event()
    running = asyncio.create_task(agent.run(halt))
    port = free_port()

    async def send(cmd, *, signed: bool = True) -> None:
        data = cmds.encode(cmd)
        await watcher.send_command(NODE, signer.seal(NODE, data) if signed else data)

    async def told(n: int) -> list[tuple]:
        async def enough() -> bool:
            return len((await story(watcher))[0]) >= n

        for _ in range(600):
            if await enough():
                break
            await asyncio.sleep(0.1)
        return (await story(watcher))[0]

    def started(shard: str, generation: int, **kw):
        cmd = start(shard, generation, nodes=(NODE,), term=TERM, **kw)
        cmd.profile = ev.ProfileSpec(name="p", engine="fake", gpus=0)
        cmd.gpus, cmd.port = [], port
        return cmd

    try:
        await until(agent.registered.is_set, 30)
        for _ in range(3):  # redelivered, re-sent: started once
            await send(started("m-1.0", 5))
        await told(2)
        await send(stop("m-1.0", 5), signed=False)  # forged
        await send(stop("m-1.0", 5, term=TERM - 1))  # a deposed leader's
        await send(start("x-1.0", 1, nodes=("n9",), term=TERM))  # another node's
        await send(started("m-1.0", 3))  # older than what runs: nothing
        await send(stop("m-1.0", 4, term=TERM))
        await told(3)
        await send(stop("c-1.0", 1, term=TERM))
        await told(4)
        await send(started("c-1.0", 1))
        await send(cmds.Reregister(reason="asked", term=TERM, log="L"))
        await until_async(lambda: registrations_at_least(watcher, 2))
        await send(started("m-1.0", 7))
        await told(7)
        for _ in range(2):
            await send(stop("m-1.0", 7, term=TERM))
        statuses = await told(8)
        assert statuses == STORY, statuses
        # NATS restarted: once reconnected, the agent registers again, with what runs (nothing).
        nats_server.stop()
        nats_server.start()
        await until_async(lambda: registrations_at_least(watcher, 3), 60)
        _, registrations = await story(watcher)
        assert registrations[0] == [] and registrations[1] == [("m-1.0", 5, "ready")] and registrations[-1] == []
        outcomes = {k: agent.protocol.outcomes[k] for k in OUTCOMES}
        assert outcomes == OUTCOMES and dict(agent.gate.refused) == REFUSED
        assert (agent.protocol.memory.term, agent.protocol.memory.log) == (TERM, "L")
    finally:
        halt.set()
        await asyncio.wait_for(running, 30)
        for proc in getattr(agent, "procs", {}).values():
            reaper.append(proc.pid)
        await bus.close()
        await watcher.close()


async def registrations_at_least(bus, n: int) -> bool:
    try:
        return len((await story(bus))[1]) >= n
    except Exception:  # NATS restarting
        return False


async def until_async(check, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("never happened")
