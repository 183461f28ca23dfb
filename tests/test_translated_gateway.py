"""/v1/responses and /v1/messages through the gateway's shell in one process:
the log on an in-memory bus, stand-in engines that speak chat completions
only, the official `openai` and `anthropic` SDKs as clients. (The same over
real processes and the real engine: test_translated_e2e.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from .fake_openai import FakeEngine
from .gateway_harness import spec
from .test_gateway_server import setup  # noqa: F401 (the fixture)

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(60)


class ToolEngine(FakeEngine):
    """Calls the first tool when tools are given (tool_choice not none) and no tool result is last, else talks."""

    def prompt_tokens(self, req: dict) -> int:
        return 7 if len(req.get("messages") or ()) < 2 and not req.get("tools") else 7 + len(json.dumps(req)) // 40

    async def answer(self, writer, method, path, req) -> bool:
        tools = req.get("tools") or []
        answered = (req.get("messages") or [{}])[-1].get("role") == "tool"  # a tool's result in: the model answers
        if path != "/v1/chat/completions" or not tools or req.get("tool_choice") == "none" or answered:
            return await super().answer(writer, method, path, req)
        self.paths.append(path)
        self.requests.append(req)
        name = tools[0]["function"]["name"]
        prompt = self.prompt_tokens(req)
        usage = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
        if not req.get("stream"):
            call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"city":"Paris"}'}}
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
            self.send_json(writer, 200, {"id": "x", "object": "chat.completion", "created": 1, "model": self.model,
                                         "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}], "usage": usage})  # fmt: skip
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        deltas = [
            {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        ]
        for d in deltas:
            self._event(writer, {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
        self._event(writer, {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        self._event(writer, {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage})
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        return True


async def served(setup, keys: bool = False) -> ToolEngine:
    e = await ToolEngine("a").start()
    setup.engines.append(e)
    chat = spec("chat", aliases=["c"])
    await setup.log.model(chat)
    await setup.log.replica(chat, e.endpoint)
    if keys:
        await setup.log.key("k-one", "acme/one", "sk-one")
        await setup.log.key("k-two", "acme/two", "sk-two")
    await setup.gateway()
    if keys:
        await setup.settle()
    return e


WEATHER = {"type": "function", "name": "get_weather", "description": "the weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


async def test_responses_text_streamed_tools_and_a_stored_chain(setup):
    engine = await served(setup)
    client = setup.client()
    r = await client.responses.create(model="c", input="hi", instructions="be brief", max_output_tokens=9)
    assert r.output_text == "hello from a" and r.status == "completed" and r.id.startswith("resp_")
    assert r.usage.input_tokens == engine.prompt_tokens(engine.requests[-1]) and r.usage.output_tokens == 3 and r.model == "c"
    sent = engine.requests[-1]
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert sent["max_tokens"] == 9 and sent["model"] == "chat"

    kinds, text = [], ""
    async with await client.responses.create(model="chat", input="again", stream=True) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                done = event.response
    assert text == "w0 w1 w2 w3 " and done.output_text == text and done.usage.output_tokens == 4
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]

    # A function tool, streamed: the call's arguments as deltas, then the item.
    calls = []
    async with await client.responses.create(model="chat", input="weather in Paris?", tools=[WEATHER], stream=True) as stream:
        async for event in stream:
            if event.type == "response.function_call_arguments.delta":
                calls.append(event.delta)
            if event.type == "response.completed":
                called = event.response
    assert "".join(calls) == '{"city":"Paris"}'
    item = called.output[0]
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments) == {"city": "Paris"}

    # The tool's output, continuing the stored response: the chain reaches the engine whole.
    after = await client.responses.create(
        model="chat", previous_response_id=called.id, tool_choice="none", tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": "sunny"}],
    )  # fmt: skip
    assert after.previous_response_id == called.id and after.output_text == "hello from a"
    messages = engine.requests[-1]["messages"]
    assert messages[0] == {"role": "user", "content": "weather in Paris?"}
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[2] == {"role": "tool", "tool_call_id": item.call_id, "content": "sunny"}
    got = await client.responses.retrieve(after.id)
    assert got.output_text == "hello from a"
    await client.responses.delete(after.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(after.id)

    # store: false is not stored; an unknown id is a 404.
    r = await client.responses.create(model="chat", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="chat", input="y", previous_response_id=r.id)


async def test_a_key_finds_only_its_owners_stored_responses(setup):
    await served(setup, keys=True)
    one, two = setup.client("sk-one"), setup.client("sk-two")
    r = await one.responses.create(model="chat", input="hi")
    assert (await one.responses.create(model="chat", input="more", previous_response_id=r.id)).output_text
    with pytest.raises(openai.NotFoundError) as e:
        await two.responses.create(model="chat", input="more", previous_response_id=r.id)
    assert e.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await two.responses.retrieve(r.id)
    # x-api-key as well as Bearer.
    status, _, body = await setup.raw(
        b'POST /v1/responses HTTP/1.1\r\nHost: x\r\nx-api-key: sk-one\r\nContent-Length: 33\r\nConnection: close\r\n\r\n{"model":"chat","input":"hello"}\n'
    )
    assert status == 200 and json.loads(body)["output"][0]["content"][0]["text"] == "hello from a"


async def test_responses_bad_input_is_refused_in_openais_shape(setup):
    await served(setup)
    client = setup.client()
    cases = [
        (dict(model="chat", input="x", foo=1), "foo", "unknown_parameter"),
        (dict(model="chat", input=5), "input", "invalid_type"),
        (dict(model="chat", input="x", temperature=3), "temperature", "invalid_value"),
        (dict(model="chat", input="x", tools=[{"type": "web_search"}]), "tools[0].type", "unsupported_parameter"),
        (dict(model="chat", input="x", background=True), "background", "unsupported_parameter"),
    ]
    for body, param, code in cases:
        with pytest.raises(openai.BadRequestError) as e:
            await client.post("/responses", body=body, cast_to=object)
        assert (e.value.body["param"], e.value.body["code"]) == (param, code), body
    status, _, body = await setup.post("/v1/responses", {"model": "nope", "input": "x"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = await setup.raw(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{oops")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"


def anthropic_client(setup, key: str = "none") -> "anthropic.AsyncAnthropic":
    return anthropic.AsyncAnthropic(base_url=f"http://{setup.gw.listening_on}:{setup.gw.port}", api_key=key, max_retries=0, timeout=20)


async def test_messages_text_streamed_tools_and_count_tokens(setup):
    engine = await served(setup)
    client = anthropic_client(setup)
    m = await client.messages.create(model="chat", max_tokens=16, system="be brief", messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == "hello from a" and m.stop_reason == "end_turn" and m.usage.output_tokens == 3
    assert engine.requests[-1]["messages"][0] == {"role": "system", "content": "be brief"}

    async with client.messages.stream(model="chat", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "w0 w1 w2 w3 " and final.usage.output_tokens == 4 and final.stop_reason == "end_turn"

    tool = {"name": "get_weather", "description": "weather", "input_schema": WEATHER["parameters"]}
    m = await client.messages.create(model="chat", max_tokens=16, tools=[tool], tool_choice={"type": "any"},
                                     messages=[{"role": "user", "content": "weather in Paris?"}])  # fmt: skip
    use = m.content[0]
    assert m.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"city": "Paris"}
    assert engine.requests[-1]["tool_choice"] == "required"
    async with client.messages.stream(model="chat", max_tokens=16, tools=[tool], messages=[{"role": "user", "content": "Paris?"}]) as stream:
        final = await stream.get_final_message()
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"

    # The tool's result, multi-turn: the engine sees the call and its result.
    m = await client.messages.create(model="chat", max_tokens=16, messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
    ])  # fmt: skip
    sent = engine.requests[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == use.id and sent[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}

    count = await client.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert count.input_tokens == 7 and engine.requests[-1]["max_tokens"] == 1


async def test_messages_errors_are_in_anthropics_shape_and_x_api_key_is_a_key(setup):
    await served(setup, keys=True)
    good = anthropic_client(setup, "sk-one")
    assert (await good.messages.create(model="chat", max_tokens=4, messages=[{"role": "user", "content": "hi"}])).content
    with pytest.raises(anthropic.AuthenticationError) as e:
        await anthropic_client(setup, "sk-wrong").messages.create(model="chat", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "Incorrect API key provided."}}
    with pytest.raises(anthropic.NotFoundError) as e:
        await good.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        await good.post("/v1/messages", body={"model": "chat", "max_tokens": 4, "messages": [], "extra": 1}, cast_to=object)
    assert e.value.body["error"] == {"type": "invalid_request_error", "message": "extra: Extra inputs are not permitted"}
    with pytest.raises(anthropic.BadRequestError) as e:
        await good.post("/v1/messages", body={"model": "chat", "max_tokens": "4", "messages": [{"role": "user", "content": "x"}]}, cast_to=object)
    assert "max_tokens" in e.value.body["error"]["message"]


async def test_an_oversized_body_is_413_in_each_apis_shape(setup):
    e = await FakeEngine("a").start()
    setup.engines.append(e)
    await setup.log.model(spec("chat"))
    await setup.log.replica(spec("chat"), e.endpoint)
    await setup.gateway(max_body=1024)
    big = b'{"model":"chat","input":"' + b"x" * 2000 + b'"}'
    for path, shape in ((b"/v1/messages", "anthropic"), (b"/v1/responses", "openai")):
        status, _, body = await setup.raw(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(big), big)
        )
        got = json.loads(body)
        assert status == 413
        if shape == "anthropic":
            assert got["type"] == "error" and got["error"]["type"] == "request_too_large"
        else:
            assert got["error"]["code"] == "request_too_large"


async def test_the_conformance_rows_against_stand_in_engines_and_two_gateways(setup):
    """The matrix's rows (python -m llmgw.conformance) against two gateways of one log: none FAILS."""
    from llmgw.conformance.matrix import Target, Verdict, gather_rows, render, run_rows
    from llmgw.gateway.config import GatewayConfig
    from llmgw.gateway.server import Gateway

    await served(setup, keys=True)
    other = Gateway(setup.bus, name="gw-other", config=GatewayConfig(port=0))
    await other.start()
    try:
        rows = gather_rows(("llmgw.conformance.responses_rows", "llmgw.conformance.anthropic_rows"))
        target = Target(setup.url, "sk-one", "chat", other_url=f"http://127.0.0.1:{other.port}/v1")
        results = await run_rows(rows, target)
    finally:
        await other.close(grace=0.5)
    table = render(results)
    assert not [r for r, o in results if o.verdict is Verdict.FAILS], table
    assert all(o.verdict is not Verdict.SKIPPED for _, o in results), table
    agent = next(o for r, o in results if r.api == "openai agents")
    assert agent.detail == "get_weather('Paris') then: 'hello from a'", table
