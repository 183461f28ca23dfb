"""Issue 35, findings 4 and 6, tried over real processes: a real nats-server
with JWT auth, `llmgw control`, the projector and simulated agents, each a
process; the attacks published with a real node credential.

4: a registration with `cpu_cores: 10**30` is quarantined by the bounds;
   the control plane and the projector keep going (a later model is placed,
   `ctl get` answers, `projections rebuild` works).
6: a node flooding the log is muted by the control plane (NodeMuted), its
   replica moves to another node, an operator's change is placed promptly,
   and `llmgw ctl node unmute` hears it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import msgspec
import pytest

from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev
from llmgw.control.rates import NODE_BURST, NODE_RATE, NODE_RATE_WINDOW_S

from .conftest import run_llmgw
from .test_auth import _fold, _until

pytestmark = pytest.mark.timeout(150)

# More than a node may send in one window (control/rates.py), sent at once
# (LLMGW_FLOOD sets another size, to measure: the test prints its figures).
# Much more is held up by nats-server's own ingest, which muting cannot
# help: 100,000 at once took the server ~45 s to store here (2 shared
# cores), and no consumer was delivered anything meanwhile; the mute came
# 1 s after delivery resumed. Bounding that is the bus's limits' part.
FLOOD = int(os.environ.get("LLMGW_FLOOD", 0)) or int(NODE_RATE * NODE_RATE_WINDOW_S + NODE_BURST) * 3


class Fleet:
    """The processes of one test, over `auth_nats`, each with its own credential."""

    def __init__(self, auth_nats, processes, tmp_path) -> None:
        self.server, self.processes, self.tmp = auth_nats, processes, tmp_path
        self.url = auth_nats.url
        self.db = tmp_path / "read-models.sqlite"
        self.tools = ("--nats", self.url, "--creds", auth_nats.creds("operator"), "--db", str(self.db))

    def ctl(self, *args: str, timeout: float = 60):
        return run_llmgw("ctl", *args, *self.tools, cwd=self.tmp, timeout=timeout)

    def apply(self, name: str, *, wait: float = 30.0):
        catalog = self.tmp / f"{name}.yaml"
        catalog.write_text(f"models:\n  - name: {name}\n    profiles: [{{name: p, gpus: 1}}]\n")
        return self.ctl("apply", "-f", str(catalog), "--wait", "--timeout", str(wait), timeout=wait + 30)

    def ready_on(self, model: str) -> set[str]:
        state = _fold(self.server)
        return {s.node for r in state.replicas.values() if r.model == model and r.state == "ready" for s in r.shards}

    def publish_as(self, node: str, messages: list[tuple[str, bytes]]) -> None:
        """Publish as the agent credential of `node`, every message at once (a flood)."""

        async def send():
            bus = await NatsBus.connect(self.url, creds=self.server.creds("agent", node))
            try:
                (subject, data), rest = messages[0], messages[1:]
                await bus.publish(subject, data, msg_id=f"test-{time.time_ns()}")
                for subject, data in rest:  # core publishes: the stream keeps them, unacked
                    await bus.nc.publish(subject, data)
                await bus.nc.flush(30)
            finally:
                await bus.close()

        asyncio.run(send())

    def log(self, name: str) -> str:
        return self.processes.log(name)


@pytest.fixture
def fleet(auth_nats, processes, tmp_path):
    f = Fleet(auth_nats, processes, tmp_path)
    processes.start("control", "control", "--nats", f.url, "--creds", auth_nats.creds("control"),
                    "--state-dir", str(tmp_path / "control"), "--metrics-listen", "off")
    # The projector is a module of its own (`processes` runs `python -m llmgw`): started alike, stopped with the rest.
    with open(tmp_path / "projector.log", "ab") as log:
        projector = subprocess.Popen(
            [sys.executable, "-m", "llmgw.projections", "--nats", f.url, "--db", str(f.db),
             "--creds", auth_nats.creds("projector")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
    processes.procs.append(projector)
    return f


def _decoded(fleet: Fleet) -> list:
    """Every event of the log that decodes."""
    from llmgw.bus import read_log

    async def fetch():
        bus = await NatsBus.connect(fleet.url, creds=fleet.server.creds("operator"))
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    out = []
    for _, _, data in asyncio.run(fetch()):
        try:
            out.append(ev.decode(data))
        except msgspec.MsgspecError:
            pass
    return out


def _agent(fleet: Fleet, name: str, gpus: int = 1) -> None:
    fleet.processes.start(name, "agent", "--simulate", "--name", name, "--gpus", str(gpus), "--ready-after", "0.2",
                          "--nats", fleet.url, "--creds", fleet.server.creds("agent", name))


def test_a_registration_out_of_bounds_is_quarantined_and_nothing_stops(fleet, tmp_path):
    _agent(fleet, "a")
    evil = {"type": "node.registered", "v": 1, "at": time.time(), "node": "evil", "cpu_cores": 10**30,
            "gpus": [{"index": 0, "memory_gb": 80.0}]}  # finding 4, as it was seen
    fleet.publish_as("evil", [("llmgw.agent.evil.node.registered", msgspec.json.encode(evil))])
    out = fleet.apply("m")
    assert out.returncode == 0, out.stdout + out.stderr + fleet.log("control")[-3000:]
    assert fleet.ready_on("m") == {"a"}
    state = _fold(fleet.server)
    assert "evil" not in state.nodes
    assert any("$.cpu_cores" in q.error for q in state.quarantined)
    got = fleet.ctl("get", "nodes", "-o", "json")
    assert got.returncode == 0, got.stderr
    assert [n["name"] for n in json.loads(got.stdout)] == ["a"]
    rebuilt = run_llmgw("projections", "rebuild", "--nats", fleet.url, "--creds", fleet.server.creds("projector"),
                        "--db", str(tmp_path / "rebuilt.sqlite"), cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    for name in ("control", "projector"):
        assert "OverflowError" not in fleet.log(name) and "Traceback" not in fleet.log(name), fleet.log(name)[-3000:]
        assert fleet.processes.procs[0 if name == "control" else 1].poll() is None


def test_a_flooding_node_is_muted_its_replica_moves_and_an_operators_change_is_placed_promptly(fleet):
    _agent(fleet, "a", gpus=2)
    _agent(fleet, "b", gpus=2)
    out = fleet.apply("m")
    assert out.returncode == 0, out.stdout + out.stderr
    _until(lambda: len(fleet.ready_on("m")) == 1, 30, lambda: fleet.log("control")[-3000:])
    (victim,) = fleet.ready_on("m")
    flooder = victim  # the flood comes from the node that runs the replica
    power = {"type": "node.power", "v": 1, "at": time.time(), "node": flooder, "watts": 100.0}
    began = time.monotonic()
    fleet.publish_as(flooder, [(f"llmgw.agent.{flooder}.node.power", msgspec.json.encode(power))] * FLOOD)
    sent_s = time.monotonic() - began
    _until(lambda: flooder in _fold(fleet.server).muted, 30, lambda: fleet.log("control")[-3000:])
    assert f"node {flooder} muted" in fleet.log("control")
    # Its replica is replaced elsewhere, and an operator's change is placed promptly.
    others = {"a", "b"} - {flooder}
    _until(lambda: fleet.ready_on("m") <= others and fleet.ready_on("m"), 30, lambda: fleet.log("control")[-3000:])
    began = time.monotonic()
    out = fleet.apply("m2", wait=30)
    placed_s = time.monotonic() - began
    assert out.returncode == 0, out.stdout + out.stderr
    assert fleet.ready_on("m2") <= others
    assert placed_s < 20, f"the operator's change took {placed_s:.1f} s after a flood of {FLOOD} events ({sent_s:.1f} s)"
    print(f"flood of {FLOOD} events sent in {sent_s:.2f} s; an operator's change placed {placed_s:.2f} s later")
    state = _fold(fleet.server)
    assert state.nodes[flooder].state == "lost" and state.nodes[flooder].reason.startswith("muted")
    (muted,) = [d for d in _decoded(fleet) if isinstance(d, ev.NodeMuted)]
    assert muted.node == flooder and muted.limit == NODE_RATE and muted.rate > NODE_RATE and muted.events > NODE_BURST
    decisions = fleet.ctl("get", "decisions", "-o", "json")
    assert decisions.returncode == 0, decisions.stderr
    assert any(d["kind"] == "node-muted" and d["node"] == flooder and "past its limit" in d["reason"]
               for d in json.loads(decisions.stdout)), decisions.stdout
    # What it says from now on is quarantined unread.
    fleet.publish_as(flooder, [(f"llmgw.agent.{flooder}.node.power", msgspec.json.encode(power))] * 5)
    _until(lambda: sum(q.error.startswith(f"muted: node {flooder}") for q in _fold(fleet.server).quarantined) >= 5, 10,
           lambda: str(_fold(fleet.server).quarantined[-3:]))
    # An operator unmutes it: heard again, it registers anew and is ready.
    out = fleet.ctl("node", "unmute", flooder, "--reason", "looked at it")
    assert out.returncode == 0, out.stdout + out.stderr
    _until(lambda: _fold(fleet.server).nodes[flooder].state == "ready", 30, lambda: fleet.log("control")[-3000:])
    assert flooder not in _fold(fleet.server).muted
