"""The real agent end to end: a real nats-server, the control plane and the
agent as processes of their own, real llama.cpp engines (xllamacpp, serving
SmolLM2-135M-Instruct on the CPU), asked through the official `openai` SDK.

Kept small for a 2-core machine: two engines of one thread each, a few
tokens per answer at temperature 0, generous timeouts. Every process is
stopped by its pid at the end; engines are stopped by the agent
(--stop-engines-on-exit), and any left by a test that failed midway are
killed by their process group from the agent's state file. Engines listen on
ports of a range the test chose (--engine-ports), never the default one,
and only processes the test started are looked at."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from llmgw.agent import logs
from llmgw.bus import engine_key_name
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev

from .conftest import agent_runners, demo_gguf, engine_ports, engine_starts, kill_engines, run_llmgw
from .test_e2e_nats import live, wait_for

GGUF = demo_gguf()

pytestmark = [
    pytest.mark.nats,
]


PROFILE = """\
    profiles:
      - name: cpu
        engine: llama.cpp
        gpus: 0
        cpu_cores: 1
        model: {model}
        args: ["--ctx-size", "1024", "--parallel", "1"]
"""
CATALOG = "models:\n  - name: smol-a\n" + PROFILE.format(model="smollm2") + "  - name: smol-b\n" + PROFILE.format(model=GGUF)


def key_for(url: str, state, replica: str) -> str:
    """The key of the engine of `replica`'s rank 0 shard, from the engine keys bucket (as a gateway reads it)."""
    shard = state.replicas[replica].shards[0]

    async def get() -> str:
        bus = await NatsBus.connect(url)
        try:
            return await bus.engine_key(engine_key_name(shard.node, shard.id, shard.generation))
        finally:
            await bus.close()

    key = asyncio.run(get())
    assert key, f"no key for {shard.id} in the engine keys bucket"
    return key


def ask(endpoint: str, model: str, key: str) -> str:
    """A chat completion and a completion from one engine (which asks for its key), through the openai SDK."""
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key=key, timeout=120, max_retries=0)
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
    text = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert text.choices[0].text
    return chat.choices[0].message.content


def ready_replicas(state) -> dict[str, tuple[str, str]]:
    """model -> (replica, endpoint) of its ready replica."""
    return {
        r.model: (r.id, r.shards[0].endpoint) for r in state.replicas.values() if r.state == "ready" and r.shards[0].endpoint
    }


def both_ready(state) -> bool:
    return set(ready_replicas(state)) == {"smol-a", "smol-b"}


def engines_of(state_dir: Path) -> dict[str, tuple[int, int]]:
    """shard -> (runner pid, engine pid), from the agent's state file."""
    saved = json.loads((state_dir / "agent.json").read_text())
    out = {}
    for shard, rec in saved.get("shards", {}).items():
        status = json.loads(Path(rec["status"]).read_text())
        out[shard] = (rec["pid"], status["engine"])
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def state_dirs(tmp_path):
    """Agent state dirs of a test; the engines their agents recorded are killed at its end, whatever happened."""
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        kill_engines(d)


def registrations(records) -> list[ev.NodeRegistered]:
    return [ev.decode(d) for _, s, d in records if s.endswith(".node.registered")]


def events_after(records, seq: int, kind):
    return [ev.decode(d) for q, s, d in records if q > seq and isinstance(ev.decode(d), kind)]


def placements(records) -> list[str]:
    out = []
    for _, subject, data in records:
        if subject == "llmgw.control.control.decided":
            out += [a.replica for a in ev.decode(data).actions if isinstance(a, ev.PlaceReplica)]
    return out


def test_real_engines_serve_fail_are_replaced_and_are_adopted_across_agent_and_control_plane_kills(
    nats_server, processes, tmp_path, state_dirs
):
    url = nats_server.url
    agent_dir = tmp_path / "agent"
    state_dirs.append(agent_dir)
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text("address: 127.0.0.1\ncpu_cores: 4\nlabels: {llmgw.io/site: test}\n")
    agent_args = (
        "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(agent_dir), "--nats", url,
        "--engine-ports", engine_ports(),
    )  # fmt: skip
    control_args = ("control", "--nats", url, "--state-dir", str(tmp_path / "control"))

    control = processes.start("control", *control_args)
    agent = processes.start("agent", *agent_args, "--stop-engines-on-exit")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
    assert out.returncode == 0, out.stderr

    # Both ready, and both answer from their endpoints.
    state = wait_for(url, both_ready, timeout=120)
    ready = ready_replicas(state)
    for model, (rid, endpoint) in ready.items():
        ask(endpoint, model, key_for(url, state, rid))

    # Logs over NATS, as `llmgw ctl logs` will ask for them.
    async def fetch_logs(replica):
        import nats

        nc = await nats.connect(url)
        try:
            return await logs.fetch_all(nc, ["n1"], replica, lines=50)
        finally:
            await nc.close()

    got = asyncio.run(fetch_logs(ready["smol-a"][0]))
    (lines,) = [s["lines"] for s in got["shards"].values()]
    assert any("llmgw: serving" in line for line in lines), lines

    # kill -9 of one engine: reported failed, with the signal, and replaced.
    victim_replica = ready["smol-a"][0]
    victim = engines_of(agent_dir)[f"{victim_replica}.0"][1]  # the engine itself, not its runner
    assert victim > 0
    os.kill(victim, signal.SIGKILL)
    state = wait_for(url, lambda s: both_ready(s) and ready_replicas(s)["smol-a"][0] != victim_replica, timeout=120)
    _, records = live(url)
    failed = [e for e in events_after(records, 0, ev.ShardStatus) if e.replica == victim_replica and e.state == "failed"]
    assert failed and failed[0].reason.startswith("engine killed by signal 9 (SIGKILL)"), failed
    ready = ready_replicas(state)
    ask(ready["smol-a"][1], "smol-a", key_for(url, state, ready["smol-a"][0]))

    # kill -9 of the agent: its engines keep answering; the agent started
    # again adopts them, and no engine is started again.
    engines = engines_of(agent_dir)
    assert len(engines) == 2 and agent_runners(agent_dir) == sorted(r for r, _ in engines.values())
    starts = engine_starts(agent_dir)  # 3: both, and the replacement of the one killed
    assert starts == 3
    processes.kill9(agent)
    for model, (rid, endpoint) in ready.items():
        ask(endpoint, model, key_for(url, state, rid))
    _, records = live(url)
    seq_before = records[-1][0]
    processes.start("agent-2", *agent_args, "--stop-engines-on-exit")
    wait_for(url, lambda s: both_ready(s), timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, records = live(url)
        regs = [e for e in events_after(records, seq_before, ev.NodeRegistered)]
        if regs:
            break
        time.sleep(0.3)
    assert {r.shard for r in regs[0].running} == set(engines) and all(r.state == "ready" for r in regs[0].running)
    time.sleep(2)  # room for a wrong start to show
    _, records = live(url)
    assert [e for e in events_after(records, seq_before, ev.ShardStatus) if e.state == "starting"] == []
    assert engines_of(agent_dir) == engines and agent_runners(agent_dir) == sorted(r for r, _ in engines.values())
    assert engine_starts(agent_dir) == starts  # no engine started again
    assert "adopted 2 running engine(s)" in processes.log("agent-2")
    for model, (rid, endpoint) in ready.items():
        ask(endpoint, model, key_for(url, state, rid))

    # kill -9 of the control plane and the agent together: still adopted, nothing twice.
    agent2 = next(p for p in processes.procs if p.name == "agent-2")  # type: ignore[attr-defined]
    placed_before = placements(records)
    seq_before = records[-1][0]
    os.kill(control.pid, signal.SIGKILL)
    os.kill(agent2.pid, signal.SIGKILL)
    control.wait(10)
    agent2.wait(10)
    processes.start("control-2", *control_args)
    processes.start("agent-3", *agent_args, "--stop-engines-on-exit")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state, records = live(url)
        if events_after(records, seq_before, ev.NodeRegistered) and both_ready(state):
            break
        time.sleep(0.3)
    time.sleep(3)  # the control plane decides on what it folded
    state, records = live(url)
    assert both_ready(state) and ready_replicas(state) == ready
    assert placements(records) == placed_before and len(set(placed_before)) == len(placed_before) == 3
    assert [e for e in events_after(records, seq_before, ev.ShardStatus) if e.state in ("starting", "failed", "stopped")] == []
    assert engines_of(agent_dir) == engines and agent_runners(agent_dir) == sorted(r for r, _ in engines.values())
    assert engine_starts(agent_dir) == starts
    for model, (rid, endpoint) in ready.items():
        ask(endpoint, model, key_for(url, state, rid))


def test_up_on_a_fresh_folder_answers_a_chat_completion_from_the_real_model_through_its_gateway(tmp_path, state_dirs):
    port, gateway_port = free_port(), free_port()
    state = tmp_path / "state"
    state_dirs.append(state / "agent")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "up", "--nats-port", str(port), "--state-dir", str(state),
         "--gateway-port", str(gateway_port), "--console-port", str(free_port()), "--engine-ports", engine_ports()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    seen = []
    try:
        endpoint = None
        deadline = time.monotonic() + 120
        while endpoint is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)
                continue
            seen.append(line)
            m = re.search(r"smollm2 is ready at (http://\S+)", line)
            if m:
                endpoint = m.group(1)
        assert endpoint, "llmgw up never said the demo model is ready:\n" + "".join(seen)
        assert endpoint == f"http://127.0.0.1:{gateway_port}"  # asked through the gateway
        assert any("curl " + endpoint in line for line in [lines.get(timeout=5)])
        client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="unused", timeout=120, max_retries=0)
        chat = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hello! Who are you?"}], max_tokens=12, temperature=0
        )
        assert chat.choices[0].message.content.strip()
        (runner,) = agent_runners(state / "agent")
        ((_, engine),) = engines_of(state / "agent").values()
        # Its engine's log, as the operator reads it, from the agent of its node.
        where = ("--nats", f"nats://127.0.0.1:{port}", "--db", str(state / "readmodels.db"),
                 "--creds", str(state / "creds" / "operator.creds"))  # fmt: skip
        listing = run_llmgw("ctl", *where, "get", "replicas", "-o", "json", cwd=tmp_path)
        (ready,) = [r["id"] for r in json.loads(listing.stdout) if r["state"] == "ready"]
        out = run_llmgw("ctl", *where, "logs", ready, "-n", "20", cwd=tmp_path)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    # Ctrl-C stops everything, the engine with it.
    assert not alive(runner) and not alive(engine) and agent_runners(state / "agent") == []


def test_the_agent_waits_for_nats_and_reconnects_forever_registering_each_time(processes, tmp_path, state_dirs):
    from llmgw.bus.server import NatsServer

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    state_dirs.append(tmp_path / "agent")
    # The agent first, with nothing listening yet: it waits.
    processes.start(
        "agent", "agent", "--name", "n1", "--state-dir", str(tmp_path / "agent"), "--nats", url,
        "--engine-ports", engine_ports(),
    )  # fmt: skip
    time.sleep(1.5)
    server = NatsServer(tmp_path / "nats", port).start()
    try:
        state = wait_for(url, lambda s: "n1" in s.nodes, timeout=30)
        assert state.nodes["n1"].agent.startswith("llmgw-agent/")
        server.stop()
        time.sleep(1.5)
        server = NatsServer(tmp_path / "nats", port).start()
        deadline = time.monotonic() + 30
        while len(registrations(live(url)[1])) < 2:
            assert time.monotonic() < deadline, processes.log("agent")
            time.sleep(0.3)
        assert "reconnected to NATS" in processes.log("agent")
    finally:
        server.stop()
