"""`llmgw agent --simulate --fleet N`: many simulated nodes in one process over
one connection, on a `fleet` credential that speaks for nodes and nothing
else; an agent credential still speaks for its own node alone."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from llmgw.agent import fleet
from llmgw.bus import read_log
from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State
from llmgw.ctl.locate import DB_FILE
from llmgw.yamlfile import YamlFileError

from .conftest import run_llmgw
from .test_auth import Speaker, _control, _registered, _subjects
from .test_up import start_up, stop_up, tools_creds, whole_log


def test_a_pattern_names_nodes_and_puts_them_in_racks_and_pdus():
    shapes = fleet.shapes_from_pattern(10, "sim-{i:04d}", gpus=4, per_rack=4, per_pdu=2)
    assert [s.name for s in shapes[:3]] == ["sim-0001", "sim-0002", "sim-0003"]
    assert shapes[0].labels == {"llmgw.io/rack": "rack-0001", "llmgw.io/pdu": "pdu-0001"}
    assert shapes[4].labels == {"llmgw.io/rack": "rack-0002", "llmgw.io/pdu": "pdu-0003"}
    assert all(s.gpus == 4 for s in shapes)
    custom = fleet.shapes_from_pattern(3, "n{i}", labels={"llmgw.io/rack": "r{rack}", "llmgw.io/pool": "prod"}, per_rack=2)
    assert [s.labels for s in custom] == [
        {"llmgw.io/rack": "r1", "llmgw.io/pdu": "pdu-0001", "llmgw.io/pool": "prod"},
        {"llmgw.io/rack": "r1", "llmgw.io/pdu": "pdu-0001", "llmgw.io/pool": "prod"},
        {"llmgw.io/rack": "r2", "llmgw.io/pdu": "pdu-0002", "llmgw.io/pool": "prod"},
    ]  # fmt: skip
    with pytest.raises(fleet.FleetError, match="comes twice"):
        fleet.shapes_from_pattern(2, "same")
    with pytest.raises(fleet.FleetError, match=r"\{i\}, \{rack\} and \{pdu\}"):
        fleet.shapes_from_pattern(2, "n-{row}")
    with pytest.raises(fleet.FleetError, match="not 'a.b-1'"):
        fleet.shapes_from_pattern(1, "a.b-{i}")


def test_a_fleet_file_gives_shapes_and_its_errors_name_file_line_and_field(tmp_path):
    good = tmp_path / "fleet.yaml"
    good.write_text(
        "nodes_per_rack: 2\n"
        "nodes:\n"
        "  - name: a-{i}\n    count: 3\n    gpus: 4\n    gpu_memory_gb: 40\n    labels: {llmgw.io/rack: 'r{rack}'}\n"
        "  - name: solo\n    gpus: 8\n"
    )
    shapes = fleet.load_fleet_file(good)
    assert [(s.name, s.gpus, s.gpu_memory_gb, s.labels.get("llmgw.io/rack")) for s in shapes] == [
        ("a-1", 4, 40.0, "r1"), ("a-2", 4, 40.0, "r1"), ("a-3", 4, 40.0, "r2"), ("solo", 8, 80.0, None),
    ]  # fmt: skip
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: a-{i}\n    count: 2\n    gpuz: 4\n")
    with pytest.raises(YamlFileError, match=r"bad.yaml:4.*gpuz.*did you mean gpus"):
        fleet.load_fleet_file(bad)
    twice = tmp_path / "twice.yaml"
    twice.write_text("nodes:\n  - name: x\n  - name: x\n")
    with pytest.raises(YamlFileError, match="twice.yaml.*'x' comes twice"):
        fleet.load_fleet_file(twice)


async def test_a_fleet_credential_speaks_for_nodes_and_nothing_else(auth_nats):
    control = await _control(auth_nats)
    sim = await Speaker.connect(auth_nats, "fleet", "sim")
    try:
        for node in ("n1", "n2"):  # one connection, two nodes
            await sim.nc.publish(f"llmgw.agent.{node}.node.registered", _registered(node))
        decided = ev.Decided(at=1.0, basis=0, actions=[], leader="x")
        forgeries = [
            "llmgw.control.decided", "llmgw.ctl.apikey.applied", "llmgw.cmd.n1", "llmgw.gw.g1.model.load",
            "$JS.API.STREAM.DELETE.LLMGW", "$JS.API.CONSUMER.CREATE.LLMGW",
        ]  # fmt: skip
        for subject in forgeries:
            await sim.nc.publish(subject, ev.encode(decided))
            assert await sim.refused("publish", subject), (subject, sim.errors)
        for subject in ("llmgw.>", "llmgw.ctl.>", "_INBOX.>"):
            await sim.nc.subscribe(subject)
            assert await sim.refused("subscription", subject), subject
        await sim.nc.subscribe("llmgw.cmd.*")  # every node's commands: its job
        await sim.nc.flush()
        deadline = time.monotonic() + 10
        while len(await _subjects(control)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await _subjects(control) == ["llmgw.agent.n1.node.registered", "llmgw.agent.n2.node.registered"]
    finally:
        await sim.close()
        await control.close()


async def test_an_agent_still_speaks_only_for_its_own_node(auth_nats):
    """The server refuses agent a on node b's subjects; on its own subject, a
    fact that names node b is refused by the fold (quarantined), as a
    fleet's would be: who speaks is the subject, whatever the body says."""
    control = await _control(auth_nats)
    a = await Speaker.connect(auth_nats, "agent", "a")
    try:
        await a.nc.publish("llmgw.agent.b.node.registered", _registered("b"))
        assert await a.refused("publish", "llmgw.agent.b.node.registered")
        await a.nc.publish("llmgw.agent.a.node.registered", _registered("b"))  # the forgery in the body
        await a.nc.publish("llmgw.agent.a.node.registered", _registered("a"))
        await a.nc.flush()
        deadline = time.monotonic() + 10
        while len(await _subjects(control)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        state = State()
        for seq, subject, data in await read_log(control):
            apply(state, seq, subject, data)
        assert set(state.nodes) == {"a"}
        assert state.quarantine_count == 1 and "may not speak for node b" in state.quarantined[0].error
    finally:
        await a.close()
        await control.close()


def _fold(nats_url: str, creds: str) -> State:
    state = State()
    for seq, subject, data in whole_log(nats_url, creds):
        apply(state, seq, subject, data)
    return state


CATALOG = """\
models:
  - name: small
    min_replicas: 6
    profiles:
      - name: one
        gpus: 1
        gpu_memory_gb: 24
"""


@pytest.mark.nats
@pytest.mark.timeout(300)
def test_a_fleet_of_simulated_nodes_registers_serves_fails_and_falls_silent(tmp_path, processes):
    proc, lines = start_up(tmp_path, free_port(), extra=("--no-agent", "--no-demo", "--no-gateway"))
    try:
        nats_url = re.search(r"NATS \(JetStream\) at (\S+)", "".join(lines)).group(1)
        ops = tools_creds(tmp_path)
        issued = run_llmgw("creds", "issue", "fleet", "sim", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
        assert issued.returncode == 0, issued.stderr
        creds = issued.stdout.split("\t")[0]
        agents = processes.start(
            "fleet", "agent", "--simulate", "--fleet", "12", "--name", "f-{i:02d}", "--gpus", "2", "--nats", nats_url,
            "--creds", creds, "--ready-after", "0.1", "--heartbeat", "0.5", "--nodes-per-rack", "4",
            "--watts-per-gpu", "300", "--power-interval", "0.5", "--label", "llmgw.io/pool=pool-{rack}",
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "simulated nodes registered" not in processes.log("fleet") and time.monotonic() < deadline:
            time.sleep(0.2)
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        db = str(tmp_path / "state" / DB_FILE)
        applied = run_llmgw(
            "ctl", "apply", "-f", str(catalog), "--wait", "--timeout", "120", "--nats", nats_url, "--creds", ops, "--db", db, cwd=tmp_path
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        log = processes.log("fleet")
        assert "fleet of 12 simulated nodes registered" in log and "over 1 connection(s)" in log
        state = _fold(nats_url, ops)
        assert sorted(state.nodes) == [f"f-{i:02d}" for i in range(1, 13)]
        assert state.nodes["f-05"].labels["llmgw.io/rack"] == "rack-0002"
        assert state.nodes["f-05"].labels["llmgw.io/pdu"] == "pdu-0003"
        assert state.nodes["f-05"].claims["llmgw.io/pool"] == "pool-2"  # --label: a pattern too (a claim: admission.py)
        ready_now = [r for r in state.replicas.values() if r.state == "ready"]
        deadline = time.monotonic() + 30
        while not all(state.nodes[r.shards[0].node].power_w == 300 for r in ready_now) and time.monotonic() < deadline:
            time.sleep(0.5)  # each node measures its draw as a single simulated agent does (node.power)
            state = _fold(nats_url, ops)
        assert all(state.nodes[r.shards[0].node].power_w == 300 for r in ready_now)
        ready = [r for r in state.replicas.values() if r.state == "ready"]
        assert len(ready) == 6 and len({r.shards[0].node for r in ready}) == 6  # spread: one a node
        assert all(r.shards[0].endpoint for r in ready)  # each serves its own engine

        victim = ready[0]
        said = asyncio.run(fleet.ask(nats_url, ops, victim.shards[0].node, "fail", victim.shards[0].id.encode()))
        assert said == b"failed"
        lost_node = ready[1].shards[0].node
        said = asyncio.run(fleet.ask(nats_url, ops, lost_node, "silence", b"on"))
        assert said == b"silent"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = _fold(nats_url, ops)
            serving = [r for r in state.replicas.values() if r.state == "ready"]
            if state.nodes[lost_node].state == "lost" and len(serving) == 6 and victim.id not in {r.id for r in serving}:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not replaced: {[(r.id, r.state) for r in state.replicas.values()]}")
        assert lost_node not in {r.shards[0].node for r in serving}
        assert agents.poll() is None
    finally:
        assert stop_up(proc) == 0
