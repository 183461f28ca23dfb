"""A request for a model that cannot be served now fails fast (issue 34):
`llmgw up` (NATS, control plane, gateway), a simulated 8-GPU node, and the
official openai SDK as the client.

- A model that can never fit (16 GPUs on an 8-GPU node) gets 503 within a
  second, with the control plane's reason and Retry-After, where it hung for
  the gateway's whole wait timeout (300 s) and then got a 503 without it.
- A model on its way (its replica placing, starting, loading) is still
  waited for, and answered.
- `llmgw up --wait-timeout` reaches its gateway: a replica that does not
  become ready within it gets 503 after that wait, not after the default.
"""

from __future__ import annotations

import re
import time

import openai
import pytest

from llmgw.bus.server import free_port
from llmgw.gateway.config import GatewayConfig

from .conftest import run_llmgw
from .test_control_metrics import run_issue
from .test_up import start_up, stop_up, tools_creds

pytestmark = [pytest.mark.nats, pytest.mark.timeout(240)]

ASK = [{"role": "user", "content": "Say hello."}]
CATALOG = """\
models:
  - name: huge
    profiles: [{name: all, gpus: 16}]
  - name: slow
    profiles: [{name: one, gpus: 1}]
"""


def fleet(tmp_path, processes, wait_timeout: str, ready_after: str) -> tuple[object, str]:
    """`llmgw up` with `--wait-timeout`, a simulated 8-GPU node whose shards
    load for `ready_after` seconds, and CATALOG applied: (up, the gateway's /v1)."""
    gateway = free_port()
    proc, lines = start_up(tmp_path, free_port(), gateway, extra=("--no-agent", "--no-demo", "--wait-timeout", wait_timeout))
    nats = re.search(r"NATS \(JetStream\) at (\S+)", "".join(lines)).group(1)
    processes.start(
        "gpu-1", "agent", "--simulate", "--name", "gpu-1", "--gpus", "8", "--nats", nats,
        "--creds", run_issue(tmp_path, "agent", "gpu-1"), "--ready-after", ready_after,
    )  # fmt: skip
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    applied = run_llmgw("ctl", "apply", "-f", str(catalog), "--nats", nats, "--creds", tools_creds(tmp_path), cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    return proc, f"http://127.0.0.1:{gateway}/v1"


def test_a_model_that_cannot_fit_gets_503_with_the_reason_at_once_and_one_loading_is_waited_for(tmp_path, processes):
    proc, base = fleet(tmp_path, processes, wait_timeout="120", ready_after="3")
    try:
        client = openai.OpenAI(base_url=base, api_key="unused", timeout=150, max_retries=0)
        # The one on its way (placing, then loading for 3 s): waited for, and answered by its replica.
        raw = client.chat.completions.with_raw_response.create(model="slow", messages=ASK)
        assert raw.http_response.status_code == 200
        assert raw.parse().choices[0].message.content == "simulated replica slow-1 of slow on node gpu-1"

        # The one that fits nowhere: refused with the control plane's reason (the first
        # answer may wait for that reason to be decided: it was applied just now).
        for attempt in range(2):
            began = time.monotonic()
            with pytest.raises(openai.APIStatusError) as e:
                client.chat.completions.create(model="huge", messages=ASK)
            took = time.monotonic() - began
            assert e.value.status_code == 503
            message = e.value.message
            assert "model huge cannot be served now: no room: profile all needs a node with 16 free GPU(s)" in message
            assert "GPUs: needs 16, has 8 in all (first: gpu-1)" in message
            assert e.value.response.headers["retry-after"] == str(GatewayConfig().unavailable_retry_after)
            assert e.value.body["code"] == "model_unavailable"
        # The bound the issue states: within 1 s (the wait timeout is 120 s).
        assert took < 1.0, f"the 503 took {took:.2f}s"
    finally:
        assert stop_up(proc) == 0


def test_up_passes_its_wait_timeout_to_its_gateway(tmp_path, processes):
    proc, base = fleet(tmp_path, processes, wait_timeout="1", ready_after="60")
    try:
        client = openai.OpenAI(base_url=base, api_key="unused", timeout=60, max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="slow", messages=ASK)  # loading for a minute
        assert e.value.status_code == 503, e.value.message
        assert "no replica of slow became ready within 1s" in e.value.message
    finally:
        assert stop_up(proc) == 0


def test_up_refuses_a_wait_timeout_that_is_not_seconds(tmp_path):
    for bad in ("-1", "soon", "inf"):
        out = run_llmgw("up", "--state-dir", str(tmp_path / "state"), "--wait-timeout", bad, cwd=tmp_path)
        assert out.returncode == 2
        assert "argument --wait-timeout: seconds" in out.stderr and "Traceback" not in out.stderr
