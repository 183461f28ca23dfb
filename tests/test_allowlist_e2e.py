"""A node runs only what its agent file declares (issue 12, part 3), over
real processes: a real nats-server, the control plane and a real agent as
processes of their own.

A profile whose engine is a shell line, or a kind the node did not declare,
fails its shard with the reason; so does a start command published straight
onto the node's command subject, as a wrong control plane (or anyone who
could reach the bus) would send it. The shell line never runs: the file it
would have written is never there."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmgw.bus import signing
from llmgw.bus.nats import NatsBus
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import engine_ports, run_llmgw
from .test_e2e_nats import wait_for

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

REFUSED = "is not declared in this node's agent file"


def test_an_undeclared_engine_is_refused_and_never_runs(nats_server, processes, tmp_path):
    url = nats_server.url
    marker = tmp_path / "pwned"
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(f"address: 127.0.0.1\ncpu_cores: 2\nengine_ports: {engine_ports()}\n")
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
    processes.start(
        "agent", "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(tmp_path / "agent"),
        "--nats", url, "--stop-engines-on-exit",
    )  # fmt: skip
    wait_for(url, lambda s: "n1" in s.nodes, timeout=30)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "models:\n"
        "  - name: shell\n    profiles:\n      - name: p\n        gpus: 0\n"
        f"        engine: \"sh -c 'touch {marker}'\"\n"
        "  - name: big\n    profiles:\n      - name: p\n        gpus: 0\n        engine: vllm\n"
    )
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
    assert out.returncode == 0, out.stderr

    def refused(s, model: str) -> bool:
        return s.models[model].start_failures >= 1 and REFUSED in s.models[model].last_failure

    state = wait_for(url, lambda s: all(m in s.models for m in ("shell", "big")) and refused(s, "shell")
                     and refused(s, "big"), timeout=60)
    assert "engines: llama.cpp; no templates" in state.models["big"].last_failure
    # Straight onto the command subject, as a wrong control plane would send
    # it: signed with the fleet's command key (issue 35: the agent checks it
    # first), so that what stops it is the agent file's allowlist.
    signer = signing.Signer.from_file(nats_server.auth.keys_dir / signing.SEED_FILE)
    forged = cmds.StartShard(
        shard="evil-1.0", replica="evil-1", generation=10**9, model="evil", fingerprint="f", rank=0, gpus=[],
        port=1, nodes=["n1"], profile=ev.ProfileSpec(name="p", engine=f"sh -c 'touch {marker}'", gpus=0),
    )

    async def send_and_read() -> list[ev.ShardStatus]:
        bus = await NatsBus.connect(url)
        try:
            await bus.send_command("n1", signer.seal("n1", cmds.encode(forged)))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                said = [ev.decode(data) for _, _, data in await bus.read_matching("llmgw.agent.n1.shard.status")]
                said = [e for e in said if e.shard == "evil-1.0"]
                if any(e.state == "failed" for e in said):
                    return said
                await asyncio.sleep(0.3)
            return said
        finally:
            await bus.close()

    said = asyncio.run(send_and_read())
    assert [e.state for e in said] == ["failed"] and REFUSED in said[0].reason, said
    assert not marker.exists(), "an undeclared shell line ran on the node"
