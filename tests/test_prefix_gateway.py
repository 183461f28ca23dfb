"""Cache-aware routing through the gateway's HTTP path (issue 30), with fake
engines (tests/fake_openai.py) on a memory bus: the `llmgw-route` header, a
session by X-Session-Id or `user`, the reasons on /metrics and in the
gateway's load reports."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import sample
from .gateway_harness import spec
from .test_gateway_server import Setup, setup  # noqa: F401  (the fixture: a gateway on a memory bus, fake engines)

pytestmark = pytest.mark.timeout(60)


def chat(system: str, question: str, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}], **extra}


async def session_post(setup: Setup, payload: dict, session: str) -> tuple[int, dict, bytes]:
    import json

    body = json.dumps(payload).encode()
    return await setup.raw(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Session-Id: %s\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (session.encode(), len(body), body)
    )


async def test_a_prefix_stays_warm_sessions_stick_and_the_reasons_are_counted(setup):
    a, b = await setup.engine("a"), await setup.engine("b")
    m = spec("m")
    await setup.log.model(m)
    await setup.log.replica(m, a.endpoint)
    await setup.log.replica(m, b.endpoint)
    await setup.gateway()
    system = "You answer questions about the fleet. " * 60

    status, first, _ = await setup.post("/v1/chat/completions", chat(system, "one?"))
    assert status == 200 and first["llmgw-route"] == "hashed"
    for q in ("two?", "three?"):
        status, h, _ = await setup.post("/v1/chat/completions", chat(system, q))
        assert (h["llmgw-replica"], h["llmgw-route"]) == (first["llmgw-replica"], "warm")

    # A session stays where it went, whatever its prompts: by the header, or the request's `user`.
    _, s1, _ = await session_post(setup, chat("first " * 100, "x"), "alice")
    for i in range(3):
        _, h, _ = await session_post(setup, chat(f"unrelated {i} " * 100, "x"), "alice")
        assert (h["llmgw-replica"], h["llmgw-route"]) == (s1["llmgw-replica"], "session")
    _, u1, _ = await setup.post("/v1/chat/completions", chat("bob's " * 100, "x", user="bob"))
    _, u2, _ = await setup.post("/v1/chat/completions", chat("nothing alike " * 100, "x", user="bob"))
    assert (u2["llmgw-replica"], u2["llmgw-route"]) == (u1["llmgw-replica"], "session")

    # Embeddings have no prompt to match: the least loaded.
    status, h, _ = await setup.post("/v1/embeddings", {"model": "m", "input": "x"})
    assert status == 200 and h["llmgw-route"] == "least_load"

    metrics = (await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))[2].decode()
    home = first["llmgw-replica"]
    assert sample(metrics, "llmgw_gateway_routed_total", model="m", replica=home, reason="warm") == 2
    assert sample(metrics, "llmgw_gateway_prefix_index_blocks") > 0
    # The load reports carry the same, for the fold (and `ctl describe model`).
    for _ in range(40):
        routed: dict = {}
        for e in setup.loads("m"):
            for r in e.routes:
                routed[(r.replica, r.reason)] = routed.get((r.replica, r.reason), 0) + r.requests
        if routed.get((home, "warm")):
            break
        await asyncio.sleep(0.1)
    assert routed[(home, "warm")] == 2 and routed[(home, "hashed")] >= 1
