"""The gateway end to end: a real nats-server, the control plane, the real
agent running llama.cpp engines (xllamacpp, SmolLM2-135M-Instruct on the
CPU) and `llmgw gateway`, each a process of its own, asked through the
official `openai` SDK: sync, async and streaming; a replica killed
mid-stream; an on-demand model, scaled to zero, answering its first request.

Small for 2 cores: engines of one thread, a few tokens at temperature 0,
generous timeouts. Every process is stopped by its pid; engines by the agent
(--stop-engines-on-exit), and any left by a failed test by their process group.
"""

from __future__ import annotations

import asyncio
import json
import re
import os
import signal
import time
import urllib.request

import openai
import pytest

from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev

from .conftest import demo_gguf, engine_ports, kill_engines, run_llmgw, sample
from .test_e2e_nats import live, wait_for

GGUF = demo_gguf()

pytestmark = [
    pytest.mark.nats,
    pytest.mark.timeout(300),
]


PROFILE = """\
    profiles:
      - name: cpu
        engine: llama.cpp
        gpus: 0
        cpu_cores: 1
        model: smollm2
        args: ["--ctx-size", "1024", "--parallel", "1"]
"""
CATALOG = (
    "models:\n"
    "  - name: smol\n    aliases: [smollm]\n    min_replicas: 2\n" + PROFILE
    + "  - name: smol-od\n    min_replicas: 0\n    on_demand: true\n    idle_s: 600\n" + PROFILE
)  # fmt: skip
ASK = [{"role": "user", "content": "Say hello."}]


def engine_pid(agent_dir, port: int) -> int:
    """The engine listening on `port`, as the agent's state file and its runner's status say."""
    saved = json.loads((agent_dir / "agent.json").read_text())
    for rec in saved.get("shards", {}).values():
        if rec["port"] == port:
            with open(rec["status"]) as f:
                return json.load(f)["engine"]
    raise AssertionError(f"no engine of the agent listens on port {port}")


@pytest.fixture
def agent_dir(tmp_path):
    """The agent's state dir; engine runners of it still alive at the end are killed by process group."""
    d = tmp_path / "agent"
    yield d
    kill_engines(d)


def ready_of(state, model: str) -> list[str]:
    return sorted(r.id for r in state.replicas.values() if r.model == model and r.state == "ready")


def get(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        return r.read().decode()


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_openai_sdk_through_the_gateway_to_real_engines(nats_server, processes, tmp_path, agent_dir):
    url = nats_server.url
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text("address: 127.0.0.1\ncpu_cores: 4\n")
    spans = tmp_path / "spans.jsonl"
    port = free_port()
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
    processes.start(
        "agent", "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(agent_dir), "--nats", url,
        "--stop-engines-on-exit", "--engine-ports", engine_ports(),
    )  # fmt: skip
    processes.start(
        "gateway", "gateway", "--nats", url, "--port", str(port), "--name", "gw1", "--wait-timeout", "120",
        env={"LLMGW_TRACE_FILE": str(spans)},
    )  # fmt: skip
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
    assert out.returncode == 0, out.stderr
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/models")
    state = wait_for(url, lambda s: len(ready_of(s, "smol")) == 2, timeout=120)
    assert ready_of(state, "smol-od") == []  # on demand: nothing until asked
    time.sleep(0.5)  # the gateway folds the same log

    # Sync, async and streaming, through the official SDK.
    client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
    chat = client.chat.completions.create(model="smol", messages=ASK, max_tokens=6, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
    text = client.completions.create(model="smollm", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert text.choices[0].text
    assert {m.id for m in client.models.list().data} == {"smol", "smollm", "smol-od"}

    async def both() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
        got = await asyncio.gather(
            *(aclient.chat.completions.create(model="smol", messages=ASK, max_tokens=4, temperature=0) for _ in range(2))
        )
        return [g.choices[0].message.content for g in got]

    assert all(asyncio.run(both()))
    pieces = [
        c.choices[0].delta.content
        for c in client.chat.completions.create(model="smol", messages=ASK, max_tokens=8, temperature=0, stream=True)
        if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) >= 2 and "".join(pieces).strip()

    # A replica killed mid-stream: that client gets a clean error; the next request goes to the other.
    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=[{"role": "user", "content": "Count from 1 to 200, one number a line."}],
        max_tokens=400, temperature=0, stream=True,
    )  # fmt: skip
    victim = raw.headers["llmgw-replica"]
    stream = raw.parse()
    got = []
    with pytest.raises(openai.APIError) as failed:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
            if len(got) == 3:
                os.kill(engine_pid(agent_dir, state.replicas[victim].shards[0].port), signal.SIGKILL)
    assert len(got) >= 3 and f"replica {victim} failed mid-answer" in failed.value.message
    other = next(r for r in ready_of(state, "smol") if r != victim)
    after = client.chat.completions.with_raw_response.create(model="smol", messages=ASK, max_tokens=4, temperature=0)
    assert after.headers["llmgw-replica"] == other and after.parse().choices[0].message.content
    again = client.chat.completions.with_raw_response.create(model="smol", messages=ASK, max_tokens=4, temperature=0)
    assert again.headers["llmgw-replica"] != victim  # the other, or by now the victim's replacement

    # The on-demand model, at zero, answers its first request (the gateway wakes it).
    started = time.monotonic()
    first = client.chat.completions.create(model="smol-od", messages=ASK, max_tokens=4, temperature=0)
    assert first.choices[0].message.content
    woke_in = time.monotonic() - started
    state, records = live(url)
    loads = [e for _, s, d in records if s.startswith("llmgw.gw.gw1.") and (e := ev.decode(d)).model == "smol-od"]
    assert loads and loads[0].queued >= 1, loads  # the wake-up
    scaled = [
        a for _, s, d in records if s.startswith("llmgw.control.")
        for a in getattr(ev.decode(d), "actions", []) if isinstance(a, ev.ScaleModel) and a.model == "smol-od"
    ]  # fmt: skip
    assert scaled and scaled[-1].desired == 1, f"woke in {woke_in:.1f}s, no scale decision: {scaled}"

    # Metrics by model and replica; a span per request naming its replica.
    metrics = get(f"http://127.0.0.1:{port}/metrics")
    assert sample(metrics, "llmgw_gateway_requests_total", model="smol", replica=other, code="200")
    assert sample(metrics, "llmgw_gateway_requests_total", model="smol", replica=victim, code="502") == 1
    assert re.search(r'llmgw_gateway_time_to_first_token_seconds_count\{model="smol",', metrics)
    assert re.search(r'llmgw_gateway_tokens_total\{kind="\w+",model="smol-od"', metrics)
    processes.stop_all()  # spans are flushed at exit
    found = [json.loads(line) for line in spans.read_text().splitlines()]
    requests = [s for s in found if s["name"] == "gateway.request"]
    assert {s["attributes"].get("llmgw.replica") for s in requests} >= {victim, other}
    assert all(s["service"] == "llmgw-gateway" for s in requests)
