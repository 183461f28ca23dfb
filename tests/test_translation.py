"""The translations of /v1/responses and /v1/messages onto chat completions,
both directions, streaming included: pure functions, no processes. Each
stream's events are checked against the official SDKs' own types."""

from __future__ import annotations

import itertools
import json

import pytest

from llmgw.gateway import anthropic_api, chat_answer, responses_api
from llmgw.gateway.chat_answer import BadRequest, SseReader

ids = itertools.count(1)


def fixed_ids(prefix: str) -> str:
    return f"{prefix}_{next(ids)}"


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    data: dict = {"object": "chat.completion.chunk", "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        data["usage"] = usage
    return json.dumps(data).encode()


TEXT_STREAM = [chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}), chunk({}, "stop"),
               chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 2})]  # fmt: skip
TOOL_STREAM = [
    chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}),
    chunk({}, "tool_calls"),
    chunk(None, usage={"prompt_tokens": 8, "completion_tokens": 6}),
]


def events(raw: bytes) -> list[dict]:
    """SSE events (`event:` and `data:`) as dicts, each event name checked against its data's type."""
    out = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
        data = json.loads(lines[b"data"])
        assert data["type"] == lines[b"event"].decode()
        out.append(data)
    return out


# --------------------------------------------------------------------------- /v1/responses


def test_a_responses_request_becomes_a_chat_body():
    req = responses_api.check({
        "model": "m", "instructions": "be brief", "max_output_tokens": 50, "temperature": 0.5, "stream": True,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        "input": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "look: "}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
    })  # fmt: skip
    history = [{"type": "message", "role": "user", "content": "before"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]  # fmt: skip
    body = responses_api.to_chat(req, "m", history)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "before"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "auto"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]  # fmt: skip
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_tokens"] == 50 and body["stream_options"] == {"include_usage": True}
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    "req, param, code",
    [
        ("not an object", None, None),
        ({"model": "m", "input": "x", "foo": 1}, "foo", "unknown_parameter"),
        ({"input": "x"}, "model", "missing_required_parameter"),
        ({"model": "m"}, "input", "missing_required_parameter"),
        ({"model": 3, "input": "x"}, "model", "invalid_type"),
        ({"model": "m", "input": {"a": 1}}, "input", "invalid_type"),
        ({"model": "m", "input": "x", "temperature": 2.5}, "temperature", "invalid_value"),
        ({"model": "m", "input": "x", "top_p": "1"}, "top_p", "invalid_type"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"model": "m", "input": "x", "store": "yes"}, "store", "invalid_type"),
        ({"model": "m", "input": "x", "background": True}, "background", "unsupported_parameter"),
        ({"model": "m", "input": "x", "reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
        ({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]}, "include", "unsupported_parameter"),
    ],
)
def test_responses_requests_openai_refuses_are_refused_naming_the_parameter(req, param, code):
    with pytest.raises(BadRequest) as e:
        responses_api.check(req)
    assert (e.value.param, e.value.code, e.value.status) == (param, code, 400)


@pytest.mark.parametrize(
    "req, param",
    [
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": "x", "text": {"format": "json"}}, "text.format"),
    ],
)
def test_what_cannot_be_translated_is_refused_never_dropped(req, param):
    with pytest.raises(BadRequest) as e:
        responses_api.to_chat(responses_api.check(req), "m")
    assert e.value.param == param


def test_an_unstreamed_chat_answer_becomes_a_response_the_sdk_reads():
    from openai.types.responses import Response

    answer = chat_answer.whole(json.dumps({
        "choices": [{"message": {"content": "Hi", "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    }).encode())  # fmt: skip
    req = {"model": "m", "input": "x", "metadata": {"a": "b"}}
    done = responses_api.complete(responses_api.skeleton(req, "resp_1", "m", 7), answer, fixed_ids)
    r = Response.model_validate(done)
    assert r.output_text == "Hi" and r.status == "completed" and r.metadata == {"a": "b"}
    assert [o.type for o in r.output] == ["message", "function_call"] and r.output[1].call_id == "call_1"
    assert r.usage.input_tokens == 4 and r.usage.input_tokens_details.cached_tokens == 2 and r.usage.total_tokens == 7
    cut = responses_api.complete(responses_api.skeleton(req, "resp_2", "m"), chat_answer.Answer(text="a", finish_reason="length"))
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _responses_stream(chunks: list[bytes]) -> tuple[list[dict], dict]:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    stream = responses_api.Stream(responses_api.skeleton({"model": "m", "input": "x"}, "resp_1", "m", 1), fixed_ids)
    raw = stream.start() + b"".join(stream.feed(c) for c in chunks)
    tail, done = stream.finish()
    got = events(raw + tail)
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in got:  # each in the SDK's own type, strictly
        adapter.validate_python(e)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    return got, done


def test_a_text_stream_becomes_responses_events_in_their_exact_order():
    got, done = _responses_stream(TEXT_STREAM)
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert got[0]["response"]["status"] == "in_progress" and got[-1]["response"]["status"] == "completed"
    assert got[6]["text"] == "Hello" and got[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert done["usage"]["input_tokens"] == 5 and done["usage"]["output_tokens"] == 2
    item = got[2]["item"]["id"]
    assert all(e["item_id"] == item for e in got[3:8])


def test_a_tool_call_stream_becomes_function_call_items_with_argument_deltas():
    got, done = _responses_stream(TOOL_STREAM)
    kinds = [e["type"] for e in got]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    first, second = done["output"]
    assert (first["call_id"], first["name"], first["arguments"]) == ("call_a", "f", '{"x":1}')
    assert (second["call_id"], second["name"], second["arguments"]) == ("call_b", "g", "{}")
    assert got[6]["output_index"] == 0 and got[10]["output_index"] == 1


def test_an_engine_failing_mid_stream_is_an_error_event_then_response_failed():
    stream = responses_api.Stream(responses_api.skeleton({"model": "m", "input": "x"}, "resp_1", "m", 1), fixed_ids)
    raw = stream.start() + stream.feed(TEXT_STREAM[0]) + stream.feed(b'{"error": {"message": "replica died", "code": "upstream_error"}}')
    got = events(raw)
    assert [e["type"] for e in got[-2:]] == ["error", "response.failed"] and stream.failed
    assert got[-1]["response"]["error"]["message"] == "replica died"


# --------------------------------------------------------------------------- /v1/messages


def test_a_messages_request_becomes_a_chat_body():
    req = anthropic_api.check({
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "be brief"}], "stop_sequences": ["END"], "top_k": 5,
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "calling"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                                         {"type": "text", "text": "and?"}]},
        ],
    })  # fmt: skip
    body = anthropic_api.to_chat(req, "m")
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "calling", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "user", "content": "and?"},
    ]  # fmt: skip
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert (body["max_tokens"], body["stop"], body["top_k"]) == (64, ["END"], 5)
    assert anthropic_api.to_chat({**req, "tool_choice": {"type": "tool", "name": "f"}}, "m")["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    counted = anthropic_api.to_chat(anthropic_api.check({"model": "m", "messages": [{"role": "user", "content": "x"}]}, counting=True), "m", counting=True)
    assert counted["max_tokens"] == 1 and "stream" not in counted


@pytest.mark.parametrize(
    "req, message",
    [
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "foo": 1}, "foo: Extra inputs are not permitted"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
        ({"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}, "Invalid type for 'max_tokens'"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages: at least one message"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "Invalid 'temperature'"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ],
)
def test_messages_requests_anthropic_refuses_are_refused(req, message):
    with pytest.raises(BadRequest) as e:
        anthropic_api.check(req)
    assert message in e.value.message


def test_an_error_is_in_anthropics_shape():
    assert json.loads(anthropic_api.error_body(429, "slow down")) == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert json.loads(anthropic_api.error_body(503, "none ready"))["error"]["type"] == "overloaded_error"


def test_an_unstreamed_chat_answer_becomes_a_message_the_sdk_reads():
    from anthropic.types import Message

    answer = chat_answer.Answer(text="Hi", finish_reason="tool_calls", prompt_tokens=4, completion_tokens=3,
                                tool_calls=[chat_answer.ToolCall("call_1", "f", '{"a": 1}')])  # fmt: skip
    m = Message.model_validate(anthropic_api.message(answer, "m", "msg_1"))
    assert [b.type for b in m.content] == ["text", "tool_use"] and m.content[1].input == {"a": 1}
    assert m.stop_reason == "tool_use" and m.usage.input_tokens == 4
    assert anthropic_api.message(chat_answer.Answer(finish_reason="length"), "m")["stop_reason"] == "max_tokens"


def _messages_stream(chunks: list[bytes]) -> list[dict]:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    stream = anthropic_api.Stream("m", "msg_1")
    raw = stream.start() + b"".join(stream.feed(c) for c in chunks) + stream.finish()
    got = events(raw)
    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in got:
        adapter.validate_python(e)
    return got


def test_a_text_stream_becomes_anthropics_events():
    got = _messages_stream(TEXT_STREAM)
    assert [e["type"] for e in got] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert "".join(e["delta"]["text"] for e in got if e["type"] == "content_block_delta") == "Hello"
    assert got[-2]["delta"]["stop_reason"] == "end_turn" and got[-2]["usage"]["output_tokens"] == 2


def test_a_tool_call_stream_becomes_tool_use_blocks_with_input_json_deltas():
    got = _messages_stream(TOOL_STREAM)
    starts = [e for e in got if e["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["name"]) for s in starts] == [(0, "f"), (1, "g")]
    deltas = [e["delta"]["partial_json"] for e in got if e["type"] == "content_block_delta" and e["index"] == 0]
    assert "".join(deltas) == '{"x":1}'
    assert got[-2]["delta"]["stop_reason"] == "tool_use"


def test_sse_events_are_read_across_any_cut():
    raw = b"data: a\n\ndata: b\ndata: c\n\nevent: x\ndata: d"
    for cut in range(len(raw)):
        r = SseReader()
        got = r.feed(raw[:cut]) + r.feed(raw[cut:]) + r.rest()
        assert got == [b"a", b"b\nc", b"d"]
