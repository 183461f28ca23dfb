"""Serving survives what users do, end to end: a real nats-server, the
control plane, this machine's real agent running a llama.cpp engine
(SmolLM2 on the CPU), a simulated node (`llmgw agent --simulate`, whose
replicas answer over real HTTP), `llmgw gateway`, each a process of its
own, asked through the official `openai` SDK.

- The README's tour: simulated models beside a real one are each answered
  by a replica of their own (they once came back 200 from SmolLM2).
- An on-demand model at zero, and a model whose single replica fails, are
  answered once a replica is ready (they once got 502); a model that no
  replica can come to (it fits nowhere) gets 503 with the reason and Retry-After.
- An engine that is not the replica's (a node advertising the real engine's
  port for another model; a stranger OpenAI server on a replica's port) is
  refused with the reason, never a 200.

Small for 2 cores: one engine of one thread, a few tokens, generous timeouts.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import openai
import pytest

from llmgw.agent.engines import identity
from llmgw.agent.simulated import SimulatedAgent
from llmgw.bus import engine_key_name
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import demo_gguf, engine_ports, kill_engines, run_llmgw
from .fake_openai import FakeEngine
from .scenario import publish
from .test_e2e_nats import wait_for
from .test_gateway_e2e import ready_of, wait_http

GGUF = demo_gguf()

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]

SMOLLM2 = """\
models:
  - name: smollm2
    profiles:
      - {name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: smollm2, args: ["--ctx-size", "1024", "--parallel", "1"]}
"""
SIMULATED = """\
  - name: llama-70b
    profiles: [{name: tp4, gpus: 4}]
  - name: qwen-8b
    min_replicas: 2
    profiles: [{name: single, gpus: 1}]
  - name: od
    min_replicas: 0
    on_demand: true
    idle_s: 600
    profiles: [{name: single, gpus: 1}]
  - name: huge
    min_replicas: 0
    on_demand: true
    profiles: [{name: all, gpus: 16}]
"""
ROGUE = """\
  - name: mistral-7b
    profiles: [{name: single, gpus: 1, pool: rogue}]
  - name: gemma-2b
    profiles: [{name: single, gpus: 1, pool: rogue}]
"""
ASK = [{"role": "user", "content": "Say hello."}]


class Rogue(SimulatedAgent):
    """A node whose replicas say they are ready where another engine answers:
    what the simulated agent did before its replicas served (the port of the
    real engine), and what a stranger that took a dead engine's port looks
    like. It reports the identity an honest agent would have given, and puts
    a key of its own for each, as an honest agent does."""

    def __init__(self, bus, where: dict[str, str]) -> None:
        super().__init__(bus, "rogue", 4, labels={"llmgw.io/pool": "rogue"}, heartbeat=0.5)
        self.where = where  # model -> the endpoint it claims

    async def _start(self, cmd: cmds.StartShard) -> None:
        me = identity(cmd.model, cmd.shard, cmd.generation)
        await self.bus.put_engine_key(engine_key_name(self.name, cmd.shard, cmd.generation), secrets.token_urlsafe(16))
        for st in ("starting", "loading"):
            await self._status(cmd.replica, cmd.shard, cmd.generation, st)
        await self._status(cmd.replica, cmd.shard, cmd.generation, "ready", endpoint=self.where[cmd.model], identity=me)


def start_local_fleet(processes, url: str, tmp_path, agent_dir, port: int, cpu_cores: int = 2) -> None:
    """The control plane, this machine's real agent (declaring `cpu_cores`,
    engines on ports of the test's own) and a gateway on `port`, each a process."""
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(f"address: 127.0.0.1\ncpu_cores: {cpu_cores}\n")
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
    processes.start(
        "agent", "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(agent_dir), "--nats", url,
        "--stop-engines-on-exit", "--engine-ports", engine_ports(),
    )  # fmt: skip
    processes.start("gateway", "gateway", "--nats", url, "--port", str(port), "--name", "gw1", "--wait-timeout", "120")


class Background:
    """An event loop of the test's own in a thread: the rogue node and the stranger."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cleanup: list = []  # tasks to await, then coroutine functions to call, in order

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def clean() -> None:
            for c in self.cleanup:
                try:
                    await asyncio.wait_for(c if isinstance(c, asyncio.Task) else c(), 10)
                except Exception:
                    pass

        self.run(clean(), 60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def background():
    bg = Background()
    try:
        yield bg
    finally:
        bg.close()


@pytest.fixture
def agent_dir(tmp_path):
    """The agent's state dir; engine runners of it still alive at the end are killed by process group."""
    d = tmp_path / "agent"
    yield d
    kill_engines(d)


def apply(url: str, path, text: str) -> None:
    path.write_text(text)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(path))
    assert out.returncode == 0, out.stderr


def fail_shard(url: str, node: str, shard: str) -> str:
    async def go() -> str:
        bus = await NatsBus.connect(url)
        try:
            return (await bus.nc.request(f"llmgw.sim.{node}.fail", shard.encode(), timeout=10)).data.decode()
        finally:
            await bus.close()

    return asyncio.run(go())


def test_each_model_is_answered_by_its_own_replica_or_waits_for_one_never_by_another(
    nats_server, processes, tmp_path, agent_dir, background
):
    url = nats_server.url
    port = free_port()
    start_local_fleet(processes, url, tmp_path, agent_dir, port)
    catalog = tmp_path / "catalog.yaml"
    apply(url, catalog, SMOLLM2)
    wait_for(url, lambda s: len(ready_of(s, "smollm2")) == 1, timeout=120)
    # The simulated node comes beside the real agent, as in the README's tour.
    processes.start("gpu-1", "agent", "--simulate", "--name", "gpu-1", "--gpus", "8", "--nats", url, "-v")
    wait_for(url, lambda s: "gpu-1" in s.nodes)
    apply(url, catalog, SMOLLM2 + SIMULATED)
    state = wait_for(url, lambda s: len(ready_of(s, "llama-70b")) == 1 and len(ready_of(s, "qwen-8b")) == 2, timeout=60)
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/models")
    client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)

    # Every model by a replica of its own: the simulated ones say which.
    for model in ("llama-70b", "qwen-8b"):
        for _ in range(3):
            raw = client.chat.completions.with_raw_response.create(model=model, messages=ASK, max_tokens=4)
            chat, replica = raw.parse(), raw.headers["llmgw-replica"]
            assert replica in ready_of(state, model)
            assert chat.model == model and chat.choices[0].message.content == f"simulated replica {replica} of {model} on node gpu-1"
    text = client.completions.create(model="qwen-8b", prompt="x", max_tokens=4).choices[0].text
    assert text.startswith("simulated replica qwen-8b-") and text.endswith(" of qwen-8b on node gpu-1")
    words = [
        c.choices[0].delta.content
        for c in client.chat.completions.create(model="llama-70b", messages=ASK, stream=True)
        if c.choices and c.choices[0].delta.content
    ]
    assert "".join(words) == "simulated replica llama-70b-1 of llama-70b on node gpu-1" and len(words) > 3
    real = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4, temperature=0)
    assert real.choices[0].message.content and "simulated" not in real.choices[0].message.content

    # An on-demand model at zero: woken by its first request, which is answered.
    assert ready_of(state, "od") == []
    woke = client.chat.completions.with_raw_response.create(model="od", messages=ASK)
    assert woke.parse().choices[0].message.content == f"simulated replica {woke.headers['llmgw-replica']} of od on node gpu-1"

    # The single replica of llama-70b fails: a request then is answered by its replacement.
    assert fail_shard(url, "gpu-1", "llama-70b-1.0") == "failed"
    raw = client.chat.completions.with_raw_response.create(model="llama-70b", messages=ASK)
    replacement = raw.headers["llmgw-replica"]
    assert replacement != "llama-70b-1"
    assert raw.parse().choices[0].message.content == f"simulated replica {replacement} of llama-70b on node gpu-1"

    # A model no replica can come to: woken, it fits nowhere, and the request
    # gets 503 with that reason and Retry-After, not after the 120 s wait (issue 34).
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="huge", messages=ASK)
    assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
    assert "model huge cannot be served now: no room: profile all needs" in e.value.message
    # (One on its way that does not come within the wait: tests/test_failfast_e2e.py.)

    # A node that says its replicas are ready where other engines answer: the
    # real SmolLM2 engine's port, and a stranger's that answers 200 to anything.
    smollm2 = state.replicas[ready_of(state, "smollm2")[0]].shards[0].endpoint
    stranger = background.run(FakeEngine("stranger").start())

    stop = asyncio.Event()

    async def rogue_node() -> None:
        bus = await NatsBus.connect(url)
        rogue = Rogue(bus, {"mistral-7b": smollm2, "gemma-2b": stranger.endpoint})
        running = asyncio.get_running_loop().create_task(rogue.run(stop))
        await rogue.registered.wait()
        # Its pool counts once an operator set it (core/rules/admission.py): the
        # attack here is the endpoints it reports, not the pool it claims.
        await publish(bus, ev.NodeLabeled(at=time.time(), node="rogue", set={"pool": "rogue"}))
        background.cleanup.append(running)
        background.cleanup.append(bus.close)

    background.run(rogue_node())
    apply(url, catalog, SMOLLM2 + SIMULATED + ROGUE)
    wait_for(url, lambda s: ready_of(s, "mistral-7b") and ready_of(s, "gemma-2b"))
    time.sleep(0.5)  # the gateway folds the same log
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="mistral-7b", messages=ASK, max_tokens=4)
    assert e.value.status_code == 502, e.value.message
    assert f"{smollm2.split('//')[1]} is not the engine started for this replica" in e.value.message
    # The real engine does not even say who it is without its own key (the rogue's is not).
    assert "GET /v1/models answered 401, not a list naming mistral-7b@mistral-7b-1.0/" in e.value.message
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="gemma-2b", prompt="x")
    assert e.value.status_code == 502 and "lists stranger, not gemma-2b@gemma-2b-1.0/" in e.value.message
    assert set(stranger.paths) == {"/v1/models"}  # asked who it is, never sent a request
    background.loop.call_soon_threadsafe(stop.set)
    background.cleanup.append(stranger.stop)
    # The real engine still serves its own model.
    assert client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4).choices[0].message.content

