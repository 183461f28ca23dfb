"""Node admission over real processes (issue 35, finding 5): `llmgw up`
(a real nats-server with JWT auth, the control plane, the projector),
simulated agents as processes, every operator step through `llmgw ctl`,
and the attacker speaking with a node credential of its own. Each attack
of the finding is tried and seen refused:

- a node claiming `llmgw.io/pool=secure` and 8 H100s gets nothing of the
  pool-restricted model, which goes where the operator set the pool;
- a node that registers a replica placed on another node (and not started
  there) as running on itself does not take it over;
- a node that never starts what it is given has it failed at the start
  deadline and placed elsewhere.

The rules are core/rules/admission.py's (unit tests: tests/test_admission.py).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from llmgw.bus.nats import NatsBus
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State
from llmgw.gateway import routing

from .conftest import run_llmgw
from .scenario import publish
from .test_ctl_e2e import Up, ctl
from .test_up import whole_log

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

CATALOG = """\
policy:
  start_timeout_s: 4
  backoff_first_s: 1
models:
  - name: secure
    profiles: [{name: p, gpus: 1, pool: secure}]
  - name: plain
    profiles: [{name: p, gpus: 1, gpu_model: X100}]
"""


def until(check, what: str, timeout: float = 40.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.3)


def replicas(up: Up) -> dict[str, dict]:
    out = ctl(up, "get", "replicas", "-o", "json")
    assert out.returncode == 0, out.stderr
    return {r["id"]: r for r in json.loads(out.stdout or "[]")}


def folded(up: Up) -> State:
    state = State()
    for seq, subject, data in whole_log(up.url, str(up.folder / ".llmgw" / "creds" / "operator.creds")):
        apply(state, seq, subject, data)
    return state


def decided(up: Up) -> list[ev.Action]:
    """Every action the control plane decided, in log order."""
    out = []
    for _, subject, data in whole_log(up.url, str(up.folder / ".llmgw" / "creds" / "operator.creds")):
        if subject.startswith("llmgw.control."):
            e = ev.decode(data)
            if isinstance(e, ev.Decided):
                out += e.actions
    return out


def test_a_node_s_own_word_decides_no_placement_and_no_routing(tmp_path, processes):
    up = Up(tmp_path)
    try:
        def agent(name: str, *flags: str) -> None:
            processes.start(name, "agent", "--simulate", "--name", name, "--nats", up.url, "--heartbeat", "0.5",
                            *flags, env=up.env)

        agent("attacker", "--gpus", "8", "--gpu-model", "H100", "--label", "llmgw.io/pool=secure")
        agent("trusted", "--gpus", "4", "--gpu-model", "X100")
        agent("idle", "--gpus", "1", "--gpu-model", "X100", "--never-start")
        # A node with a credential of its own and no agent: the test speaks for it.
        issued = run_llmgw("creds", "issue", "agent", "mallory", "--state-dir", str(up.folder / ".llmgw"), cwd=up.folder)
        assert issued.returncode == 0, issued.stderr
        mallory = issued.stdout.split("\t")[0]
        until(lambda: len(json.loads(ctl(up, "get", "nodes", "-o", "json").stdout or "[]")) == 3, "three nodes")
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        out = ctl(up, "apply", "-f", str(catalog))
        assert out.returncode == 0, out.stderr

        # The start deadline: plain went to idle (best fit: one GPU free),
        # which never starts it; failed after 4 s and placed elsewhere.
        moved = until(lambda: [r for r in replicas(up).values() if r["model"] == "plain" and r["state"] == "ready"],
                      "plain ready elsewhere after its start deadline")
        assert moved[0]["nodes"] == ["trusted"] and moved[0]["id"] != "plain-1"
        actions = decided(up)
        first = next(a for a in actions if isinstance(a, ev.PlaceReplica) and a.replica == "plain-1")
        assert [s.node for s in first.shards] == ["idle"]
        stop = next(a for a in actions if isinstance(a, ev.StopReplica) and a.replica == "plain-1")
        assert stop.failed_to_start and stop.reason.startswith(
            "not ready within 4s (start_timeout_s) of its placement: placing on idle"), stop
        out = ctl(up, "describe", "model", "plain")
        assert "not ready within 4s" in out.stdout, out.stdout

        # The claimed pool steers nothing: the model waits, the claim is shown.
        assert not [r for r in replicas(up).values() if r["model"] == "secure"]
        assert "pool: needs secure" in ctl(up, "describe", "model", "secure").stdout
        out = ctl(up, "describe", "node", "attacker")
        assert "Claimed:" in out.stdout and "llmgw.io/pool=secure (not admitted" in out.stdout, out.stdout
        out = ctl(up, "label", "trusted", "pool=secure")  # the operator's word
        assert out.returncode == 0 and "node trusted labeled pool=secure" in out.stdout, out.stdout + out.stderr
        secure = until(lambda: [r for r in replicas(up).values() if r["model"] == "secure" and r["state"] == "ready"],
                       "secure ready where the operator set the pool")
        assert [r["nodes"] for r in secure] == [["trusted"]]

        # A replica placed on another node (idle, the only node of the pool
        # now, which never starts it) is claimed by mallory's registration.
        for args in (("idle", "pool=secure"), ("trusted", "pool-")):
            out = ctl(up, "label", *args)
            assert out.returncode == 0, out.stderr
        catalog.write_text(CATALOG.replace("start_timeout_s: 4", "start_timeout_s: 120").replace(
            "  - name: secure\n", "  - name: secure\n    min_replicas: 2\n"))
        out = ctl(up, "apply", "-f", str(catalog))
        assert out.returncode == 0, out.stderr
        placed = until(lambda: [r for r in folded(up).replicas.values()
                                if r.model == "secure" and r.shards[0].node == "idle"], "secure placed on idle")
        asyncio.run(_claim(up, mallory, placed[0]))
        until(lambda: "mallory" in folded(up).nodes, "mallory registered")
        time.sleep(1.5)  # a pass or two decided on it
        state = folded(up)
        rep = state.replicas[placed[0].id]
        assert [(s.node, s.state, s.endpoint) for s in rep.shards] == [("idle", "placing", "")]  # not taken, not routed
        stray = state.nodes["mallory"].strays[rep.shards[0].id]
        assert stray.reason == f"replica {rep.id} was placed on idle: node mallory may claim only shards placed on it"
        assert any(isinstance(a, ev.StopStray) and a.node == "mallory" for a in decided(up))
        # The gateway's table, built from the same log: secure's prompts go
        # to the replica on trusted only, never to mallory's endpoint.
        targets = routing.build(state).resolve("secure").targets
        assert [t.replica for t in targets] == [secure[0]["id"]]  # the one ready on trusted
        assert state.replicas[secure[0]["id"]].shards[0].node == "trusted"
        out = ctl(up, "describe", "node", "mallory")
        assert "may claim only shards placed on it" in out.stdout, out.stdout
    finally:
        up.stop()


async def _claim(up: Up, creds: str, rep) -> None:
    """What mallory's node says, with its own credential: it runs the
    replica placed on idle, ready, at an endpoint of its own."""
    bus = await NatsBus.connect(up.url, name="mallory", creds=creds)
    try:
        sh = rep.shards[0]
        claimed = ev.RunningShard(shard=sh.id, replica=rep.id, model=rep.model, profile=rep.profile,
                                  generation=sh.generation, gpus=[0], port=sh.port, state="ready",
                                  endpoint="http://127.0.0.1:9/mallory", fingerprint=rep.fingerprint)
        gpus = [ev.Gpu(index=i, model="H100", memory_gb=80.0) for i in range(8)]
        await publish(bus, ev.NodeRegistered(at=time.time(), node="mallory", gpus=gpus, running=[claimed],
                                             labels={"llmgw.io/pool": "secure"}))
    finally:
        await bus.close()


MANUAL = """\
policy:
  admission: manual
models:
  - name: secure
    profiles: [{name: p, gpus: 1, pool: secure}]
"""


def test_under_manual_admission_a_node_is_placed_on_once_admitted_and_not_while_it_claims_more(tmp_path, processes):
    up = Up(tmp_path)
    try:
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(MANUAL)
        out = ctl(up, "apply", "-f", str(catalog))
        assert out.returncode == 0, out.stderr
        first = processes.start("gpu-1", "agent", "--simulate", "--name", "gpu-1", "--nats", up.url, "--gpus", "2",
                                "--label", "llmgw.io/pool=secure", env=up.env)
        until(lambda: "waits for admission" in ctl(up, "describe", "node", "gpu-1").stdout, "gpu-1 cordoned")
        out = ctl(up, "describe", "node", "gpu-1")
        assert "`llmgw ctl node admit gpu-1`" in out.stdout and "llmgw.io/pool=secure (not admitted" in out.stdout
        until(lambda: "1 cordoned (first: gpu-1 waits for admission" in ctl(up, "describe", "model", "secure").stdout,
              "secure says why it waits")
        assert not replicas(up)

        out = ctl(up, "node", "admit", "gpu-1")
        assert out.returncode == 0, out.stderr
        assert "node gpu-1 admitted: 2 GPU(s) (SIM-80GB), llmgw.io/pool=secure" in out.stdout, out.stdout
        until(lambda: [r for r in replicas(up).values() if r["state"] == "ready" and r["nodes"] == ["gpu-1"]],
              "secure ready on gpu-1")

        # The same node comes back claiming more GPUs: cordoned again, what runs stays.
        processes.kill9(first)
        processes.start("gpu-1b", "agent", "--simulate", "--name", "gpu-1", "--nats", up.url, "--gpus", "8",
                        "--label", "llmgw.io/pool=secure", env=up.env)
        until(lambda: "claims 8 GPU(s) (SIM-80GB), admitted with 2" in ctl(up, "describe", "node", "gpu-1").stdout,
              "gpu-1 cordoned for claiming more")
    finally:
        up.stop()
