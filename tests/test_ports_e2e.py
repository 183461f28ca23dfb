"""Engine ports another program holds, over real processes (issue 11, part 3):
a real nats-server, the control plane and the agent as processes of their
own, a real llama.cpp engine (xllamacpp, SmolLM2 on the CPU) asked through
the official `openai` SDK, and listeners the test opened on the first ports
of the agent's range. The model becomes ready on another port and is not
parked; a port freed is said free."""

from __future__ import annotations

import socket

import pytest

from llmgw.core.contract import events as ev

from .conftest import demo_gguf, engine_ports, run_llmgw
from .test_agent_e2e import ask, events_after, key_for, state_dirs  # noqa: F401 (a fixture)
from .test_e2e_nats import live, wait_for

GGUF = demo_gguf()

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]

CATALOG = f"""\
models:
  - name: smol
    profiles:
      - name: cpu
        engine: llama.cpp
        gpus: 0
        cpu_cores: 1
        model: {GGUF}
        args: ["--ctx-size", "512", "--parallel", "1"]
"""


def listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_ports_another_program_holds_are_skipped_and_the_model_serves_on_another(
    nats_server, processes, tmp_path, state_dirs  # noqa: F811
):
    url = nats_server.url
    agent_dir = tmp_path / "agent"
    state_dirs.append(agent_dir)
    ports = engine_ports()
    first = int(ports.split("-")[0])
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(f"address: 127.0.0.1\ncpu_cores: 2\nengine_ports: {ports}\n")
    # Another program on the first port before the agent starts: said at registration.
    before = listen(first)
    later = None
    try:
        processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
        processes.start(
            "agent", "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(agent_dir),
            "--nats", url, "--stop-engines-on-exit",
        )  # fmt: skip
        state = wait_for(url, lambda s: "n1" in s.nodes, timeout=30)
        node = state.nodes["n1"]
        assert (node.port_first, node.port_last, node.taken) == (first, first + 15, [first])
        # And one on the second, once it has registered: the control plane
        # cannot know; its first placement there is refused for it.
        later = listen(first + 1)
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(CATALOG)
        out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
        assert out.returncode == 0, out.stderr

        def ready(s) -> bool:
            return any(r.model == "smol" and r.state == "ready" and r.shards[0].endpoint for r in s.replicas.values())

        state = wait_for(url, ready, timeout=180)
        (rep,) = [r for r in state.replicas.values() if r.state == "ready"]
        assert rep.shards[0].port == first + 2 and rep.shards[0].endpoint == f"http://127.0.0.1:{first + 2}"
        assert ask(rep.shards[0].endpoint, "smol", key_for(url, state, rep.id))
        model = state.models["smol"]
        assert not model.parked and model.start_failures == 0
        _, records = live(url)
        refused = [e for e in events_after(records, 0, ev.ShardStatus) if e.state == "failed"]
        assert [e.reason for e in refused] == [f"port {first + 1} on 127.0.0.1 is taken by another process"]
        assert [e.taken for e in events_after(records, 0, ev.NodePorts)] == [[first, first + 1]]
        assert state.nodes["n1"].taken == [first, first + 1]
        decided = events_after(records, 0, ev.Decided)
        assert not any(isinstance(a, ev.ParkModel) for d in decided for a in d.actions)
    finally:
        before.close()
        if later is not None:
            later.close()
    # Both programs gone: the agent says their ports are free again (it
    # looks again once a heartbeat at those it said).
    state = wait_for(url, lambda s: s.nodes["n1"].taken == [], timeout=30)
    assert [r.state for r in state.replicas.values()] == ["ready"]
