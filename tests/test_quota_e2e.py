"""Limits every gateway holds together, end to end (issue 32): a real
nats-server, the control plane, a simulated agent serving simulated engines
(llmgw/agent/sim_engine.py, real HTTP) and three `llmgw gateway` processes,
each with its role's credential; the official `openai` SDK as the client.

- A key allowed R requests a minute through three gateways gets R, not 3R.
- NATS killed: the gateway failing open lets requests in under its own
  count, the one failing closed answers 503 with Retry-After; NATS back:
  both hold the shared limit again, what was let in meanwhile counted.
- Their usage, per key, owner and model, summed from the log by `ctl get usage`.
- Budgets across a day boundary, over the real KV bucket: two gateways'
  shared limits with a clock of the test's (no one sleeps a day).
"""

from __future__ import annotations

import asyncio
import calendar
import json
import time

import openai
import pytest

from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.gateway.config import GatewayConfig
from llmgw.gateway.quota import Kind, Limit, Refused
from llmgw.gateway.shared_limits import Grant, SharedLimits

from .conftest import run_llmgw
from .test_admission_e2e import until
from .test_e2e_nats import wait_for
from .test_gateway_e2e import wait_http

pytestmark = [pytest.mark.nats, pytest.mark.timeout(240)]

KEY = "sk-shared-limit-0123456789"
R = 30
CATALOG = f"""\
models:
  - name: m
    profiles: [{{name: p, gpus: 1}}]
owners:
  - name: org
api_keys:
  - name: k
    owner: org
    key: {KEY}
    requests_per_minute: {R}
"""
ASK = [{"role": "user", "content": "hi"}]


def ask(base: str) -> tuple[int, dict, str]:
    """One request: (status, headers, error message)."""
    client = openai.OpenAI(base_url=base, api_key=KEY, timeout=20, max_retries=0)
    try:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=ASK, max_tokens=4)
        return raw.status_code, dict(raw.headers), ""
    except openai.APIStatusError as e:
        return e.status_code, dict(e.response.headers), e.message


def test_a_key_gets_its_limit_through_three_gateways_and_nats_killed_and_back(nats_server, processes, tmp_path):
    url = nats_server.url
    processes.start("control", "control", "--nats", url, "--state-dir", str(tmp_path / "control"))
    processes.start("n1", "agent", "--simulate", "--name", "n1", "--nats", url, "--gpus", "2", "--heartbeat", "0.5")
    ports = [free_port() for _ in range(3)]
    for i, port in enumerate(ports):
        policy = "closed" if i == 2 else "open"
        processes.start(
            f"gw{i}", "gateway", "--nats", url, "--port", str(port), "--name", f"gw{i}", "--wait-timeout", "30",
            "--quota-failure", policy, "--quota-retry", "0.5", "--quota-timeout", "0.5", "--usage-interval", "0.5",
        )  # fmt: skip
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    out = run_llmgw("ctl", "--nats", url, "apply", "-f", str(catalog))
    assert out.returncode == 0, out.stderr
    bases = [f"http://127.0.0.1:{p}/v1" for p in ports]
    for p in ports:
        wait_http(f"http://127.0.0.1:{p}/health")
    wait_for(url, lambda s: any(r.model == "m" and r.state == "ready" for r in s.replicas.values()), timeout=60)
    time.sleep(0.5)  # the gateways fold the same log

    # R a minute through three gateways: R in all (the bucket full at first), not 3R.
    codes = []
    refusal = None
    for i in range(3 * R):
        status, headers, message = ask(bases[i % 3])
        codes.append(status)
        if status == 429 and refusal is None:
            refusal = (headers, message)
    served = codes.count(200)
    assert set(codes) <= {200, 429}, codes
    # A minute's burst, and what refilled while the test asked (one every 60/R s), at most.
    assert R - 2 <= served <= R + 3, codes
    headers, message = refusal
    assert int(headers["retry-after"]) >= 1 and f"requests per minute of this API key ({R})" in message

    # The usage on the log, summed over the three gateways' reports.
    def usage():
        out = run_llmgw("ctl", "--nats", url, "get", "usage", "--owner", "org", "--since", "1h", "-o", "json")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout or "[]")
        return rows if rows and rows[0]["requests"] == served and rows[0]["refused"] == 3 * R - served else None

    (row,) = until(usage, "the usage of key k reported")
    assert (row["key"], row["owner"], row["model"]) == ("k", "org", "m") and row["tokens_in"] > 0

    # NATS killed: gw0 fails open (its own count: fresh, so it lets requests in), gw2 closed (503).
    nats_server.stop()
    status, headers, message = until(lambda: (got := ask(bases[2]))[0] == 503 and got, "gw2 failing closed")
    assert int(headers["retry-after"]) >= 1 and "fails closed" in message
    assert until(lambda: ask(bases[0])[0] == 200, "gw0 failing open")

    # NATS back: the shared limit holds again at both (what gw0 let in meanwhile was counted).
    nats_server.start()
    assert until(lambda: ask(bases[2])[0] == 429, "gw2 holding the shared limit again", timeout=90)
    assert until(lambda: ask(bases[0])[0] == 429, "gw0 holding the shared limit again", timeout=30)


NEAR_MIDNIGHT = calendar.timegm((2026, 12, 5, 23, 59, 30))


async def test_a_day_budget_holds_across_gateways_until_the_next_utc_day(nats_server):
    now = [NEAR_MIDNIGHT]
    buses = [await NatsBus.connect(nats_server.url) for _ in range(2)]
    await buses[0].ensure_streams()
    try:
        gws = [SharedLimits(b, GatewayConfig(), clock=lambda: now[0]) for b in buses]
        limits = (Limit("owner", "org", Kind.TOKENS_PER_DAY, 1000),)
        body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 300}).encode()
        spent = 0
        for i in range(6):
            got = await gws[i % 2].reserve(limits, body)
            if isinstance(got, Grant):
                gws[i % 2].settle(got, 300, 0)
                spent += 300
        assert spent == 900  # three of 300 fit in 1,000: the fourth would pass it
        refused = await gws[1].reserve(limits, body)
        assert isinstance(refused, Refused) and "tokens per day of owner org (1000) budget" in refused.message()
        assert 29 <= refused.wait_s <= 30  # until midnight UTC
        now[0] += 31  # 00:00:01, a new day
        assert isinstance(await gws[1].reserve(limits, body), Grant)
        assert isinstance(await gws[0].reserve(limits, body), Grant)
    finally:
        for b in buses:
            await b.close()
