"""Stored responses (gateway/stored.py) on the in-memory bus: owner-scoped
keys, the size bound's marker, the TTL, a chain walked back in order and
bounded. (Through real gateways and NATS: test_translated_gateway.py,
test_translated_e2e.py; who may touch the bucket: test_auth.py.)"""

from __future__ import annotations

import json
import time

import pytest

from llmgw.bus.memory import MemoryBus
from llmgw.gateway.chat_answer import BadRequest
from llmgw.gateway.config import GatewayConfig
from llmgw.gateway.stored import Stored, key_of, record


def response(rid: str, previous: str | None = None, text: str = "ok") -> dict:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": rid, "object": "response", "previous_response_id": previous, "output": [item]}


def user(text: str) -> list[dict]:
    return [{"type": "message", "role": "user", "content": text}]


async def test_a_chain_is_read_back_oldest_first_by_its_owner_only():
    s = Stored(MemoryBus(), GatewayConfig())
    await s.put("acme/a", response("resp_1"), user("one"))
    await s.put("acme/a", response("resp_2", "resp_1", "two!"), user("two"))
    items = await s.history("acme/a", "resp_2")
    assert [i["content"] if i["role"] == "user" else i["content"][0]["text"] for i in items] == ["one", "ok", "two", "two!"]
    for who in ("acme/b", None, "acme"):  # another owner, no keys, the owner above: none of them
        with pytest.raises(BadRequest) as e:
            await s.history(who, "resp_2")
        assert (e.value.status, e.value.code) == (404, "previous_response_not_found")
    assert key_of("acme/a", "resp_1") != key_of("acme/b", "resp_1") and "/" not in key_of("acme/a", "resp_1")
    with pytest.raises(BadRequest):  # not an id this gateway makes: no key is even looked up
        await s.get("acme/a", "resp_1.>")


async def test_a_response_past_the_size_bound_is_not_stored_and_says_so():
    cfg = GatewayConfig(max_stored_response=2000)
    s = Stored(MemoryBus(), cfg)
    await s.put(None, response("resp_big", text="x" * 5000), user("hi"))
    assert len(s.bus.stored[key_of(None, "resp_big")]) < 200  # a marker, not the response
    with pytest.raises(BadRequest) as e:
        await s.history(None, "resp_big")
    assert e.value.code == "response_not_stored" and "max_stored_response (2000)" in e.value.message


async def test_past_the_ttl_a_response_is_not_found_and_a_chain_is_bounded():
    s = Stored(MemoryBus(), GatewayConfig(stored_response_ttl=60, max_response_chain=3))
    s.bus.stored[key_of(None, "resp_old")] = record(response("resp_old"), [], 10_000, now=time.time() - 61)
    with pytest.raises(BadRequest) as e:
        await s.get(None, "resp_old")
    assert e.value.status == 404
    previous = None
    for i in range(5):
        await s.put(None, response(f"resp_{i}", previous), user(str(i)))
        previous = f"resp_{i}"
    assert len(await s.history(None, "resp_2")) == 6
    with pytest.raises(BadRequest) as e:
        await s.history(None, "resp_4")
    assert e.value.code == "response_chain_too_long"
    await s.delete(None, "resp_2")
    with pytest.raises(BadRequest) as e:
        await s.get(None, "resp_2")
    assert e.value.status == 404 and json.loads(s.bus.stored[key_of(None, "resp_2")])["deleted"]
