"""Engine keys (issue 12, part 4): every engine is started with a key of its
own and answers only with it, so only the gateways (which read the keys from
the LLMGW_ENGINE_KEYS bucket) reach it, never whoever finds its port.

- Where each kind is given its key: never on the command line where the
  engine can take it from the environment (llama.cpp through our server,
  vLLM); SGLang and templates (`{key}`) on it, as they must.
- A real agent on a real nats-server runs the real demo engine (llama.cpp,
  SmolLM2) and a template engine: each key is in the bucket once the shard is
  ready, the engine answers the official openai SDK 401 without its key or
  with another engine's, 200 with its own; the key is in no command line,
  event or log served over NATS (logs are 0600), is kept (0600) across an
  agent restart that adopts the engine, and is deleted when the engine stops.
- The gateway sends the key on every request, its identity check included;
  a key that is another engine's, missing, or unreadable (the bucket
  unreachable) is a failed attempt with the reason, and the engine is never
  sent a request without it.
"""

from __future__ import annotations

import asyncio
import json
import re
import stat
import sys
from pathlib import Path

import openai
import pytest

from llmgw.agent import agentfile, engines, logs
from llmgw.agent import supervisor as sv
from llmgw.agent.agentfile import AgentFile
from llmgw.agent.inventory import Inventory
from llmgw.agent.node import NodeAgent
from llmgw.bus import ENGINE_KEYS_BUCKET, engine_key_name
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import demo_gguf, engine_ports, kill_engines
from .gateway_harness import spec
from .test_agent import FAKE, start_cmd
from .test_gateway_server import CHAT, setup  # noqa: F401  (the fixture)

KV_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


# --------------------------------------------------------------------------- names and command lines


def test_key_names_are_valid_kv_keys_of_three_tokens_under_their_node_one_per_shard_and_generation():
    assert ENGINE_KEYS_BUCKET == "LLMGW_ENGINE_KEYS"
    names = {
        engine_key_name("gpu-01", shard, gen)
        for shard in ("smol-1.0", "org/smol:v1-1.0", "a..b-2.1", "x=3A-1.0", "ünï-1.0")
        for gen in (1, 17)
    }
    assert len(names) == 10  # one each
    for name in names:
        assert KV_KEY.match(name) and not name.startswith(".") and not name.endswith(".")
        node, encoded, gen = name.split(".")  # exactly three tokens: `<node>.>` permissions hold
        assert node == "gpu-01" and gen in ("1", "17") and encoded
    assert engine_key_name("n1", "org/smol:v1-1.0", 3) == "n1.org=2Fsmol=3Av1-1=2E0.3"
    assert engine_key_name("n1", "x=3A-1.0", 3) != engine_key_name("n1", "x:-1.0", 3)  # `=` itself is escaped


def test_each_kind_gets_its_key_from_the_environment_where_it_can_else_its_command_line(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = "k-" + "x" * 40

    def launch(engine: str, args=()):
        cmd = start_cmd(free_port(), engine=engine, args=args)
        return engines.build(
            cmd, host="127.0.0.1", model=str(model), key=key, which=lambda p: f"/opt/bin/{p}",
            engines=dict.fromkeys(engines.KINDS, ""), templates={"srv": f"{sys.executable} server.py --port {{port}} --key={{key}}"},
        )  # fmt: skip

    llama = launch(engines.LLAMA_CPP)
    assert key not in " ".join(llama.argv) and llama.env[engines.KEY_ENV] == key and llama.key == key
    vllm = launch(engines.VLLM)
    assert key not in " ".join(vllm.argv) and vllm.env["VLLM_API_KEY"] == key
    sglang = launch(engines.SGLANG)  # SGLang has no other way
    assert sglang.argv[sglang.argv.index("--api-key") + 1] == key
    template = launch("srv")
    assert template.argv[-1] == f"--key={key}" and template.env[engines.KEY_ENV] == key
    # The log head of a start says what was started, but not the key.
    log = tmp_path / "e.log"
    template = engines.Launch(["/bin/sh", "-c", "exit 0", f"--key={key}"], {engines.KEY_ENV: key}, "/v1/models", key=key)
    proc = sv.spawn(template, log=log, status=tmp_path / "s.json", shard="m-1.0", generation=1)
    proc.popen.wait(10)
    assert "--key=<engine key>" in log.read_text() and key not in log.read_text()


# --------------------------------------------------------------------------- a real agent, the real engine


GGUF = demo_gguf()


def llama_cmd(port: int, generation: int = 1) -> cmds.StartShard:
    profile = ev.ProfileSpec(
        name="cpu", engine="llama.cpp", gpus=0, cpu_cores=1, model=str(GGUF), args=["--ctx-size", "512", "--parallel", "1"]
    )
    return cmds.StartShard(
        shard="smol:v1-1.0", replica="smol:v1-1", generation=generation, model="smol", profile=profile,
        fingerprint="f", rank=0, gpus=[], port=port, nodes=["n1"],
    )  # fmt: skip


async def statuses(bus: NatsBus) -> list[ev.ShardStatus]:
    return [e for _, _, d in await bus.read_matching("llmgw.agent.>") if isinstance(e := ev.decode(d), ev.ShardStatus)]


async def until_state(bus: NatsBus, shard: str, state: str, timeout: float) -> ev.ShardStatus:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = [e for e in await statuses(bus) if e.shard == shard and e.state == state]
        if found:
            return found[-1]
        failed = [e for e in await statuses(bus) if e.shard == shard and e.state == "failed"]
        assert not failed, failed[-1].reason
        assert asyncio.get_running_loop().time() < deadline, f"{shard} not {state} in time"
        await asyncio.sleep(0.1)


@pytest.fixture
def agent_dir(tmp_path):
    d = tmp_path / "agent"
    yield d
    kill_engines(d)


@pytest.mark.nats
@pytest.mark.timeout(240)
async def test_a_real_engine_answers_only_its_key_which_only_the_bucket_and_the_agents_state_hold(nats_server, agent_dir):
    bus = await NatsBus.connect(nats_server.url)
    await bus.ensure_streams()
    ports = agentfile.PortRange.parse(engine_ports())
    # A template engine that asks for its key too (the agent's health checks send it).
    keyed = f"{sys.executable} {FAKE} --port {{port}} --key {{key}}"
    af = AgentFile(stop_timeout_s=10, start_timeout_s=180, engine_ports=ports, templates={"keyed": keyed})
    stop = asyncio.Event()

    def agent() -> NodeAgent:
        return NodeAgent(
            bus, "n1", state_dir=agent_dir, agent_file=af, inventory=Inventory(gpus=[], cpu_cores=2, memory_gb=4),
            heartbeat=0.5, check_interval=0.1, ready_interval=0.5,
        )  # fmt: skip

    a = agent()
    task = asyncio.create_task(a.run(stop))
    try:
        await asyncio.wait_for(a.registered.wait(), 20)
        llama_port, fake_port = ports.first, ports.first + 1
        await bus.send_command("n1", cmds.encode(llama_cmd(llama_port)))
        fake = start_cmd(fake_port, shard="other-1.0", engine="keyed")
        await bus.send_command("n1", cmds.encode(fake))
        await until_state(bus, "other-1.0", "ready", 30)
        ready = await until_state(bus, "smol:v1-1.0", "ready", 180)

        name = engine_key_name("n1", "smol:v1-1.0", 1)
        key = await bus.engine_key(name)
        other_key = await bus.engine_key(engine_key_name("n1", "other-1.0", 1))
        assert key and other_key and key != other_key
        rec = a.state.shards["smol:v1-1.0"]
        assert rec.key == key

        url = f"{ready.endpoint}/v1"
        ask = dict(model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
        for wrong in ("", other_key):  # no key; another engine's
            client = openai.AsyncOpenAI(base_url=url, api_key=wrong or "none", max_retries=0, timeout=60)
            with pytest.raises(openai.AuthenticationError) as e:
                await client.chat.completions.create(**ask)
            assert e.value.status_code == 401
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
        mine = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)
        answer = await mine.chat.completions.create(**ask)
        assert answer.choices[0].message.content is not None
        assert (await mine.models.list()).data

        # Not in ps, the log, the events; in the state file, the agent's alone.
        proc = a.procs["smol:v1-1.0"]
        engine_pid = sv.engine_pid(proc)
        for pid in (proc.pid, engine_pid):
            assert key not in " ".join(sv.cmdline(pid) or ["gone"])
        assert key not in Path(rec.log).read_text(errors="replace")
        other_log = Path(a.state.shards["other-1.0"].log)
        log_text = other_log.read_text(errors="replace")
        assert "the environment's key is the same" in log_text and stat.S_IMODE(other_log.stat().st_mode) == 0o600
        assert "--key <engine key>" in log_text.splitlines()[0]  # the agent's head line says what started, not the key
        # An engine that prints its key (SGLang prints its arguments) does not give it away over NATS.
        assert f"key={other_key}" in log_text
        served = json.dumps(await logs.fetch_all(bus.nc, ["n1"], "other-1", lines=50))
        assert other_key not in served and "key=<engine key>" in served
        everything = b"".join(d for _, _, d in await bus.read_matching("llmgw.>"))
        assert key.encode() not in everything and other_key.encode() not in everything
        state = agent_dir / "agent.json"
        assert stat.S_IMODE(state.stat().st_mode) == 0o600 and key in state.read_text()

        # The agent goes and comes back: it adopts the engine and keeps its key.
        stop.set()
        await task
        stop = asyncio.Event()
        a = agent()
        task = asyncio.create_task(a.run(stop))
        await asyncio.wait_for(a.registered.wait(), 20)
        assert "smol:v1-1.0" in a.adopted and a.state.shards["smol:v1-1.0"].key == key
        assert await bus.engine_key(name) == key
        assert (await mine.chat.completions.create(**ask)).choices

        # Stopped: its key is deleted.
        await bus.send_command("n1", cmds.encode(cmds.StopShard(shard="smol:v1-1.0", generation=1, reason="test")))
        await until_state(bus, "smol:v1-1.0", "stopped", 30)
        deadline = asyncio.get_running_loop().time() + 10
        while await bus.engine_key(name) is not None:
            assert asyncio.get_running_loop().time() < deadline, "the key of a stopped engine was not deleted"
            await asyncio.sleep(0.05)
        assert await bus.engine_key(engine_key_name("n1", "other-1.0", 1)) == other_key  # the other's stays
    finally:
        a.stop_engines_on_exit = True
        stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()


# --------------------------------------------------------------------------- the gateway


async def test_the_gateway_sends_each_engine_its_own_key_on_every_request_identity_check_included(setup):  # noqa: F811
    m = spec("m")
    await setup.log.model(m)
    e = await setup.engine("e", identity="m@m-1.0/1", key="key-of-e")
    e.model = "m"
    await setup.log.replica(m, e.endpoint, identity="m@m-1.0/1", key="key-of-e")
    await setup.gateway()
    client = setup.client()
    for _ in range(3):
        assert (await client.chat.completions.create(model="m", messages=CHAT)).choices[0].message.content == "hello from e"
    stream = await client.chat.completions.create(model="m", messages=CHAT, stream=True)
    assert [c async for c in stream]
    assert e.unauthorized == 0 and "/v1/models" in e.paths and len(e.paths) == 5
    # Straight at the engine, without its key: 401.
    direct = openai.AsyncOpenAI(base_url=f"{e.endpoint}/v1", api_key="none", max_retries=0, timeout=10)
    with pytest.raises(openai.AuthenticationError):
        await direct.chat.completions.create(model="m", messages=CHAT)


async def test_another_engines_key_a_missing_one_or_an_unreachable_bucket_is_a_failed_attempt_never_a_keyless_request(
    setup,  # noqa: F811
):
    m = spec("m")
    await setup.log.model(m)
    a = await setup.engine("a", key="key-of-a")
    b = await setup.engine("b", key="key-of-b")
    # The bucket says b's key for a's replica: a refuses it at the identity check.
    r_a = await setup.log.replica(m, a.endpoint, identity="m@m-1.0/1", key="key-of-b")
    a.identity, a.model = "m@m-1.0/1", "m"
    await setup.gateway(failover_timeout=0.2)
    client = setup.client()
    with pytest.raises(openai.APIStatusError) as e:
        await client.chat.completions.create(model="m", messages=CHAT)
    message = e.value.body["message"]
    assert e.value.status_code == 502 and r_a in message and "answered 401" in message, message
    assert "refused the engine's key" in message and a.paths == [] and a.unauthorized >= 1

    # No key in the bucket for b's replica: nothing is sent to b.
    await setup.log.drain(r_a)
    r_b = await setup.log.replica(m, b.endpoint, key="key-of-b")
    setup.bus.engine_keys.clear()
    await setup.settle()
    with pytest.raises(openai.APIStatusError) as e:
        await client.chat.completions.create(model="m", messages=CHAT)
    message = e.value.body["message"]
    assert e.value.status_code == 502 and r_b in message and "has no key" in message, message
    assert b.paths == [] and b.unauthorized == 0

    # The bucket cannot be reached: the same, with that reason.
    setup.bus.engine_keys_down = True
    with pytest.raises(openai.APIStatusError) as e:
        await client.chat.completions.create(model="m", messages=CHAT)
    message = e.value.body["message"]
    assert e.value.status_code == 502 and "cannot be read from the engine keys bucket" in message, message
    assert b.paths == [] and b.unauthorized == 0

    # Back, with the key: answered, and the key kept for the next requests.
    setup.bus.engine_keys_down = False
    await setup.bus.put_engine_key(engine_key_name("n1", f"{r_b}.0", setup.log.generations[r_b]), "key-of-b")
    answer = await client.chat.completions.with_raw_response.create(model="m", messages=CHAT)
    assert answer.headers["llmgw-replica"] == r_b and b.unauthorized == 0
    setup.bus.engine_keys_down = True  # read once: not needed again
    assert (await client.chat.completions.create(model="m", messages=CHAT)).choices


# --------------------------------------------------------------------------- with NATS auth on


@pytest.mark.nats
@pytest.mark.timeout(60)
async def test_with_auth_an_agent_puts_and_deletes_its_own_nodes_keys_which_a_gateway_reads_and_another_agent_cannot(
    auth_nats,
):
    control = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("control"))
    await control.ensure_streams()  # the control plane makes the bucket
    a = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "a"))
    b = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("agent", "b"))
    gw = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("gateway", "g1"))
    try:
        await a.ensure_streams()  # as an agent does at start: it may not look at the streams, and need not
        name = engine_key_name("a", "org/smol:v1-1.0", 7)
        await a.put_engine_key(name, "secret-a")
        assert await gw.engine_key(name) == "secret-a"
        assert await gw.engine_key(engine_key_name("a", "other-1.0", 1)) is None
        with pytest.raises(Exception):  # another node's agent reads nothing of it
            await b.engine_key(name)
        await a.delete_engine_key(name)
        assert await gw.engine_key(name) is None
    finally:
        for bus in (a, b, gw, control):
            await bus.close()
