"""Cache-aware routing end to end (issue 30): a real nats-server, the control
plane, the real agent running two llama.cpp replicas (SmolLM2 on the CPU,
one thread each), two `llmgw gateway`s, asked through the official `openai`
SDK.

- A long system prompt sent through one gateway lands where it hashes; the
  same prefix sent through the other gateway (which never saw it) lands on
  the same replica, and its engine answers with more than 90 % of the prompt
  from its cache; a third turn through the first gateway goes there as warm.
- The warm replica's engine killed (-9) and restarted: the gateways forget
  what it held at once (a new generation is a new backend), so the prefix is
  warm nowhere and goes where it hashes.
- /metrics says why each request went where it did, and the cached tokens.

Small for 2 cores: engines of one thread, a ~600-token prompt, 4 tokens out.
"""

from __future__ import annotations

import os
import signal
import time

import openai
import pytest

from llmgw.bus.server import free_port

from .conftest import demo_gguf, engine_ports, kill_engines, run_llmgw, sample
from .test_e2e_nats import wait_for
from .test_gateway_e2e import engine_pid, get, ready_of, wait_http

GGUF = demo_gguf()

pytestmark = [pytest.mark.nats, pytest.mark.timeout(420)]

CATALOG = """\
models:
  - name: smol
    min_replicas: 2
    profiles:
      - {name: cpu, engine: llama.cpp, gpus: 0, cpu_cores: 1, model: smollm2, args: ["--ctx-size", "2048", "--parallel", "1"]}
"""
SYSTEM = " ".join(f"Rule {i}: answer politely and briefly about topic {i}." for i in range(40))  # ~600 tokens


def ask(client: openai.OpenAI, question: str, user: str | None = None):
    """(replica, route, prompt tokens, cached tokens) of one chat request."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    extra = {"user": user} if user else {}
    raw = client.chat.completions.with_raw_response.create(model="smol", messages=messages, max_tokens=4, temperature=0, **extra)
    usage = raw.parse().usage
    details = usage.prompt_tokens_details
    return raw.headers["llmgw-replica"], raw.headers["llmgw-route"], usage.prompt_tokens, (details.cached_tokens if details else 0)


@pytest.fixture
def agent_dir(tmp_path):
    d = tmp_path / "agent"
    yield d
    kill_engines(d)


def test_a_prefix_goes_where_it_is_warm_through_either_gateway_and_a_restarted_replica_is_forgotten(
    nats_server, processes, tmp_path, agent_dir
):
    url = nats_server.url
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text("address: 127.0.0.1\ncpu_cores: 2\n")
    ports = free_port(), free_port()
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
    processes.start(
        "agent", "agent", "--name", "n1", "--agent-file", str(agent_file), "--state-dir", str(agent_dir), "--nats", url,
        "--stop-engines-on-exit", "--engine-ports", engine_ports(),
    )  # fmt: skip
    for i, port in enumerate(ports):
        processes.start(f"gateway{i}", "gateway", "--nats", url, "--port", str(port), "--name", f"gw{i}", "--wait-timeout", "120")
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(tmp_path / "catalog.yaml"))
    assert out.returncode == 0, out.stderr
    state = wait_for(url, lambda s: len(ready_of(s, "smol")) == 2, timeout=180)
    clients = []
    for port in ports:
        wait_http(f"http://127.0.0.1:{port}/v1/models")
        clients.append(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300, max_retries=0))
    one, two = clients

    # New everywhere: where it hashes. Through the other gateway, which never sent it: the same replica, warm
    # (the first gateway told it where it went: gateway/hints.py; and both fold the same log: the same hash).
    home, route, _, _ = ask(one, "What is two plus two?")
    assert route == "hashed"
    replica, route, prompt, cached = ask(two, "Name a colour.")
    assert (replica, route) == (home, "warm")
    assert cached > 0.9 * prompt, (prompt, cached)
    # The first gateway's own next turn: warm, there.
    replica, route, prompt, cached = ask(one, "And three plus three?")
    assert (replica, route) == (home, "warm") and cached > 0.9 * prompt

    metrics = get(f"http://127.0.0.1:{ports[0]}/metrics")
    assert sample(metrics, "llmgw_gateway_routed_total", model="smol", replica=home, reason="warm") == 1
    assert sample(metrics, "llmgw_gateway_routed_total", model="smol", replica=home, reason="hashed") == 1
    assert sample(metrics, "llmgw_gateway_prefix_hits_total", model="smol", replica=home) == 1
    assert sample(metrics, "llmgw_gateway_cached_token_ratio", model="smol", replica=home) > 0.4

    # The gateways report it in the log (what `ctl describe model` shows): both gateways' counts, summed.
    routed = wait_for(url, lambda s: sum(s.models["smol"].routed.get(home, {}).get(k, 0) for k in ("warm", "hashed")) == 3)
    assert routed.models["smol"].routed[home]["cached_tokens"] > 0.6 * routed.models["smol"].routed[home]["prompt_tokens"]

    # The warm replica's engine is killed and restarted: what it held is gone, and forgotten.
    rec = state.replicas[home]
    os.kill(engine_pid(agent_dir, rec.shards[0].port), signal.SIGKILL)
    generation = rec.shards[0].generation

    def restarted(s) -> bool:
        ready = ready_of(s, "smol")
        if len(ready) != 2:
            return False
        r = s.replicas.get(home)
        return r is None or r.state != "ready" or r.shards[0].generation != generation

    state = wait_for(url, lambda s: restarted(s) and len(ready_of(s, "smol")) == 2, timeout=180)
    time.sleep(0.5)  # the gateways fold the same log
    for client in clients:
        replica, route, prompt, cached = ask(client, "What is two plus two?")
        assert route in ("hashed", "warm"), route
        if client is one:
            assert route == "hashed"  # believed warm nowhere: the restarted engine is forgotten
            assert cached < 0.5 * prompt, (prompt, cached)  # and it was indeed cold
