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


async def test_a_model_routed_by_least_load_tells_no_hints(setup):
    """Hints say where a prefix went for the prefix policy; another policy's choices say nothing of the cache."""
    a, b = await setup.engine("a"), await setup.engine("b")
    m = spec("m", routing="least-load")
    await setup.log.model(m)
    await setup.log.replica(m, a.endpoint)
    await setup.log.replica(m, b.endpoint)
    gw = await setup.gateway()
    for q in ("one?", "two?"):
        status, h, _ = await setup.post("/v1/chat/completions", chat("You answer questions about the fleet. " * 60, q))
        assert status == 200 and h["llmgw-route"] == "least_load"
    assert len(gw.hints) == 0 and gw.hints_told == 0 and len(gw.router.index) == 0


async def test_a_second_gateway_hears_where_the_first_sent_a_prompt_and_finds_it_warm(setup):
    """Prefix hints (gateway/hints.py): a prompt sent through one gateway is
    warm for the other, which has never seen it (`warm`, not `hashed`),
    wherever the first sent it. A hint of a replica the table does not list,
    or of another generation of it, and a malformed hint, are dropped."""
    from llmgw.gateway import hints
    from llmgw.gateway.config import GatewayConfig
    from llmgw.gateway.server import Gateway

    a, b = await setup.engine("a"), await setup.engine("b")
    m = spec("m")
    await setup.log.model(m)
    await setup.log.replica(m, a.endpoint)
    await setup.log.replica(m, b.endpoint)
    first = await setup.gateway()
    second = Gateway(setup.bus, name="gw-second", config=GatewayConfig(port=0, wait_timeout=3.0))
    await second.start()
    try:
        system = "You answer questions about the fleet. " * 60
        # Two prompts through the first gateway (one of a session: the hint says where, whatever the reason).
        status, h, _ = await setup.post("/v1/chat/completions", chat(system, "one?"))
        assert status == 200
        sent_to = h["llmgw-replica"]
        _, h2, _ = await session_post(setup, chat("Another system prompt entirely. " * 60, "one?"), "pinned")
        for _ in range(50):  # the hints go out on the report loop's next turn
            if second.hints_heard >= 2:
                break
            await asyncio.sleep(0.05)
        assert second.hints_heard >= 2
        for prompt, where in ((system, sent_to), ("Another system prompt entirely. " * 60, h2["llmgw-replica"])):
            _, h, _ = await _post_to(second, chat(prompt, "two?"))
            assert (h["llmgw-replica"], h["llmgw-route"]) == (where, "warm")  # never seen here: "hashed" without the hint
        # Dropped: a replica the table does not list, another identity (a past generation), a malformed message.
        heard, dropped = second.hints_heard, second.hints_dropped
        out = hints.Outbox()
        out.add("m", "m-99", "", [b"\0" * 8])
        out.add("m", sent_to, "not-its-identity", [b"\0" * 8])
        for data in out.batches():
            await setup.bus.hint("gw-test", data)
        await setup.bus.hint("gw-test", b"\xc1 not msgpack")
        await setup.bus.hint("gw-test", hints.msgspec.msgpack.encode([["m", sent_to, "", b"\0" * 5]]))  # not whole hashes
        assert (second.hints_heard, second.hints_dropped) == (heard, dropped + 4)
        metrics = second.render_metrics().decode()  # the same on /metrics
        assert sample(metrics, "llmgw_gateway_prefix_hints_total", outcome="heard") == heard
        assert sample(metrics, "llmgw_gateway_prefix_hints_total", outcome="dropped") == dropped + 4
        told = (await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))[2].decode()
        assert sample(told, "llmgw_gateway_prefix_hint_messages_told_total") >= 1
    finally:
        await second.close(grace=0.5)


async def _post_to(gw, payload: dict) -> tuple[int, dict, bytes]:
    import json

    body = json.dumps(payload).encode()
    reader, writer = await asyncio.open_connection(gw.listening_on, gw.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    return int(lines[0].split()[1]), {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}, rest


def test_hints_are_sent_in_bounded_batches_and_read_back():
    from llmgw.gateway import hints

    out = hints.Outbox()
    for i in range(hints.MAX_PENDING + 10):
        out.add("m", f"m-{i % 3}", "id", [i.to_bytes(8, "big"), b"\1" * 8])
    assert len(out) == hints.MAX_PENDING  # the oldest went
    batches = out.batches()
    assert len(out) == 0 and len(batches) == -(-hints.MAX_PENDING // hints.BATCH)
    told = [t for data in batches for t in hints.decode(data)]
    assert len(told) == hints.MAX_PENDING and told[-1] == ("m", f"m-{(hints.MAX_PENDING + 9) % 3}", "id", [(hints.MAX_PENDING + 9).to_bytes(8, "big"), b"\1" * 8])
    assert max(len(d) for d in batches) < 64 * 1024  # under the readers' payload limit, even at 128 blocks a hint
    big = hints.Outbox()
    for _ in range(hints.BATCH):
        big.add("m" * 64, "r" * 64, "i" * 128, [b"\0" * 8] * 128)
    assert len(big.batches()[0]) < 64 * 1024
