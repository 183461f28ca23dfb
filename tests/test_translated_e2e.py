"""/v1/responses and /v1/messages over real processes: `llmgw up` with the
real llama.cpp demo model (SmolLM2 on the CPU), a second `llmgw gateway` on
the same fleet, API keys of two owners; the official `openai` SDK, the
`anthropic` SDK and the OpenAI Agents SDK as clients, through the rows of
the conformance matrix (llmgw/conformance). A stored response is continued
through the other gateway; another owner's key finds none of it.

The tool rows need an engine that honours tools (issue 31, part 1: the demo
model's chat template with tools). Where the engine answers prose to a
required tool call they are skipped saying so, never passed.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from llmgw.bus.server import free_port

from .conftest import Processes, demo_gguf, engine_ports

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("agents")

pytestmark = [pytest.mark.nats, pytest.mark.timeout(900)]

KEY_ONE, KEY_TWO = "sk-e2e-one-0123456789abcdef", "sk-e2e-two-0123456789abcdef"
CATALOG = f"""\
owners:
  - name: acme
  - name: acme/one
  - name: acme/two
api_keys:
  - name: one
    owner: acme/one
    key: {KEY_ONE}
  - name: two
    owner: acme/two
    key: {KEY_TWO}
"""
TOOL_ROWS = ("function tool", "function_call_output", "tool-using agent", "tool_use")
MINE = ("llmgw.conformance.responses_rows", "llmgw.conformance.anthropic_rows")  # openai_rows: chat and embeddings, tested elsewhere


class Fleet:
    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.processes = Processes(tmp)
        self.state = tmp / "state"
        self.nats_port, self.port, self.other_port = free_port(), free_port(), free_port()
        self.nats = f"nats://127.0.0.1:{self.nats_port}"
        self.env = {"LLMGW_STATE_DIR": str(self.state)}

    def wait_log(self, name: str, text: str, proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.processes.log(name):
            assert proc.poll() is None and time.monotonic() < deadline, f"{name} never said {text!r}:\n{self.processes.log(name)[-3000:]}"
            time.sleep(0.5)

    def wait_answer(self, port: int, timeout: float) -> None:
        """A model answered through the gateway at `port` (with a key)."""
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY_ONE, max_retries=0, timeout=60)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
                return
            except (openai.APIConnectionError, openai.APIStatusError) as e:
                assert time.monotonic() < deadline, f"the gateway on {port} never answered: {e}"
                time.sleep(0.5)

    def start(self) -> None:
        demo_gguf()
        up = self.processes.start(
            "up", "up", "--state-dir", str(self.state), "--nats-port", str(self.nats_port), "--gateway-port", str(self.port),
            "--console-port", str(free_port()), "--name", "node-e2e", "--engine-ports", engine_ports(),
        )  # fmt: skip
        self.wait_log("up", "smollm2 is ready", up, 300)
        (self.tmp / "keys.yaml").write_text(CATALOG)
        env = {**os.environ, **self.env}
        out = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "apply", "-f", str(self.tmp / "keys.yaml"), "--nats", self.nats],
                             capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        other = self.processes.start("gateway-2", "gateway", "--nats", self.nats, "--port", str(self.other_port), "--name", "gw-two", env=self.env)
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.other_port)) == 0:
                    break
            assert other.poll() is None and time.monotonic() < deadline, self.processes.log("gateway-2")
            time.sleep(0.2)
        self.wait_answer(self.port, 120)
        self.wait_answer(self.other_port, 120)

    def stop(self) -> None:
        up = next((p for p in self.processes.procs if p.name == "up"), None)
        if up is not None and up.poll() is None:
            up.send_signal(2)  # Ctrl-C: it stops its engines, then NATS
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                pass
        self.processes.stop_all()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("translated"))
    try:
        f.start()
        yield f
    finally:
        f.stop()


def target(fleet, key: str = KEY_ONE):
    from llmgw.conformance.matrix import Target

    return Target(f"http://127.0.0.1:{fleet.port}/v1", key, "smollm2", other_url=f"http://127.0.0.1:{fleet.other_port}/v1")


def test_the_matrix_without_tools_works_or_errs_clearly_with_the_real_engine(fleet):
    from llmgw.conformance.matrix import Verdict, gather_rows, render, run_rows

    rows = [r for r in gather_rows(MINE) if not any(t in r.name for t in TOOL_ROWS)]
    results = asyncio.run(run_rows(rows, target(fleet)))
    table = render(results)
    print(table)
    assert [o.verdict for _, o in results].count(Verdict.FAILS) == 0, table
    assert Verdict.SKIPPED not in [o.verdict for _, o in results], table


def test_tool_rows_with_the_real_engine(fleet):
    """The tool rows (function tools, tool_use, the Agents SDK loop), each to a call and its answer."""
    from llmgw.conformance.matrix import Verdict, gather_rows, render, run_rows

    rows = [r for r in gather_rows(MINE) if any(t in r.name for t in TOOL_ROWS)]
    results = asyncio.run(run_rows(rows, target(fleet)))
    table = render(results)
    print(table)
    assert Verdict.FAILS not in [o.verdict for _, o in results], table


def test_another_owners_key_finds_no_stored_response_on_either_gateway(fleet):
    one = openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.port}/v1", api_key=KEY_ONE, max_retries=0, timeout=60)
    r = one.responses.create(model="smollm2", input="Remember the word teapot.", max_output_tokens=8)
    for port in (fleet.port, fleet.other_port):
        two = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY_TWO, max_retries=0, timeout=60)
        with pytest.raises(openai.NotFoundError):
            two.responses.create(model="smollm2", input="Which word?", previous_response_id=r.id, max_output_tokens=8)
        with pytest.raises(openai.NotFoundError):
            two.responses.retrieve(r.id)
    # ... while its owner's key finds it through the other gateway.
    mine = openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.other_port}/v1", api_key=KEY_ONE, max_retries=0, timeout=60)
    assert mine.responses.retrieve(r.id).id == r.id
