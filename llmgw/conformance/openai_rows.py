"""The OpenAI API's rows of the matrix: chat (tools, tool_choice, streamed
tool-call deltas), completions, embeddings, rerank, and the checks OpenAI
makes of a request. Each row asks through the official `openai` SDK (raw
HTTP only where the SDK cannot send the fault: malformed JSON, an oversized
body) with small max_tokens and temperature 0.

A refusal counts as a clear error only in OpenAI's shape, with the status,
`param` and `code` OpenAI gives; anything else that is not the answer asked
for is a failure. Tools answered with prose when a call was required is a
failure: that is the silent drop this matrix exists to catch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from .matrix import Outcome, Row, Target, Verdict

def _function(name: str, description: str, param: str) -> dict:
    schema = {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


WEATHER = _function("get_weather", "The weather in a city now", "city")
TIME = _function("get_time", "The time in a time zone now", "tz")
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SMALL = {"max_tokens": 48, "temperature": 0}


def _client(t: Target):
    import openai

    return openai.AsyncOpenAI(base_url=t.url, api_key=t.key, timeout=120, max_retries=0)


def works(detail: str) -> Outcome:
    return Outcome(Verdict.WORKS, detail)


def fails(detail: str) -> Outcome:
    return Outcome(Verdict.FAILS, detail)


async def refused(call: Awaitable, status: int, code: str | None = None, param: str | None = None) -> Outcome:
    """A clear error when `call` raises OpenAI's error with this status, code and param."""
    import openai

    try:
        await call
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        got = (e.status_code, body.get("code"), body.get("param"))
        if e.status_code == status and (code is None or got[1] == code) and (param is None or got[2] == param):
            return Outcome(Verdict.CLEAR_ERROR, f"{e.status_code} {got[1]} ({got[2]}): {body.get('message', '')}")
        return fails(f"wanted {status} {code} ({param}), got {got}: {body.get('message', e)}")
    return fails(f"answered 200 where {status} {code} ({param}) was due")


def _calls(message) -> list[tuple[str, dict]]:
    out = []
    for c in message.tool_calls or []:
        out.append((c.function.name, json.loads(c.function.arguments or "{}")))
    return out


# --------------------------------------------------------------------------- chat


async def chat_plain(t: Target) -> Outcome:
    r = await _client(t).chat.completions.create(model=t.model, messages=ASK, **SMALL)
    text = r.choices[0].message.content
    if not text or not r.id.startswith("chatcmpl-"):
        return fails(f"no text, or id {r.id}")
    return works(f"{r.usage.prompt_tokens}+{r.usage.completion_tokens} tokens: {text[:40]!r}")


async def chat_streamed(t: Target) -> Outcome:
    stream = await _client(t).chat.completions.create(
        model=t.model, messages=ASK, stream=True, stream_options={"include_usage": True}, **SMALL
    )
    words, usage = [], None
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            words.append(c.choices[0].delta.content)
        usage = c.usage or usage
    if not words or usage is None:
        return fails(f"{len(words)} deltas, usage {usage}")
    return works(f"{len(words)} deltas, usage {usage.prompt_tokens}+{usage.completion_tokens}")


async def tools_auto(t: Target) -> Outcome:
    r = await _client(t).chat.completions.create(model=t.model, messages=ASK, tools=[WEATHER], tool_choice="auto", **SMALL)
    m = r.choices[0].message
    if not (m.content or m.tool_calls):
        return fails("neither text nor a call")
    return works(f"the model chose: {'calls ' + str(_calls(m)) if m.tool_calls else 'text'}")


async def tools_required(t: Target) -> Outcome:
    r = await _client(t).chat.completions.create(model=t.model, messages=ASK, tools=[WEATHER], tool_choice="required", **SMALL)
    calls = _calls(r.choices[0].message)
    if not calls or calls[0][0] != "get_weather":
        return fails(f"no call where one was required: {r.choices[0].message.content!r:.80}")
    return works(f"{calls[0][0]}({json.dumps(calls[0][1])})")


async def tools_named(t: Target) -> Outcome:
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = await _client(t).chat.completions.create(model=t.model, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, **SMALL)
    calls = _calls(r.choices[0].message)
    if not calls or any(name != "get_time" for name, _ in calls):
        return fails(f"wanted get_time, got {calls or r.choices[0].message.content!r}")
    return works(f"get_time({json.dumps(calls[0][1])})")


async def tools_none(t: Target) -> Outcome:
    r = await _client(t).chat.completions.create(model=t.model, messages=ASK, tools=[WEATHER], tool_choice="none", **SMALL)
    m = r.choices[0].message
    if m.tool_calls or not m.content:
        return fails(f"tool_choice none answered calls {_calls(m)}")
    return works(f"text: {m.content[:40]!r}")


async def tools_parallel(t: Target) -> Outcome:
    r = await _client(t).chat.completions.create(
        model=t.model, messages=[{"role": "user", "content": "The weather in Paris and the time in UTC?"}],
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=True, max_tokens=96, temperature=0,
    )  # fmt: skip
    calls = _calls(r.choices[0].message)
    if not calls:
        return fails("no call")
    ids = {c.id for c in r.choices[0].message.tool_calls}
    if len(ids) != len(calls):
        return fails(f"calls without ids of their own: {ids}")
    return works(f"{len(calls)} call(s): {', '.join(n for n, _ in calls)}")


async def tools_streamed(t: Target) -> Outcome:
    stream = await _client(t).chat.completions.create(
        model=t.model, messages=ASK, tools=[WEATHER], tool_choice="required", stream=True, **SMALL
    )
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    deltas = 0
    async for c in stream:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            deltas += 1
            if d.function and d.function.name:
                names[d.index] = d.function.name
            if d.function and d.function.arguments:
                args[d.index] = args.get(d.index, "") + d.function.arguments
    if not names or names.get(0) != "get_weather":
        return fails(f"no streamed call: {names}")
    try:
        parsed = json.loads(args.get(0, "{}"))
    except ValueError:
        return fails(f"the streamed arguments do not join into JSON: {args.get(0)!r}")
    return works(f"{deltas} deltas: get_weather({json.dumps(parsed)})")


async def tool_result(t: Target) -> Outcome:
    """A call's result sent back: the conversation goes on."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]  # fmt: skip
    r = await _client(t).chat.completions.create(model=t.model, messages=msgs, tools=[WEATHER], **SMALL)
    m = r.choices[0].message
    return works(f"answered: {(m.content or str(_calls(m)))[:40]!r}") if (m.content or m.tool_calls) else fails("empty")


# --------------------------------------------------------------------------- completions, embeddings, rerank


async def completions_plain(t: Target) -> Outcome:
    r = await _client(t).completions.create(model=t.model, prompt="Once upon a time", **SMALL)
    if not r.id.startswith("cmpl-") or not r.choices[0].text:
        return fails(f"id {r.id}, text {r.choices[0].text!r}")
    return works(f"{r.id[:12]}…: {r.choices[0].text[:30]!r}")


async def completions_streamed(t: Target) -> Outcome:
    stream = await _client(t).completions.create(model=t.model, prompt="Once upon a time", stream=True, **SMALL)
    ids, text = set(), []
    async for c in stream:
        ids.add(c.id)
        text.extend(ch.text for ch in c.choices)
    if not ids or any(not i.startswith("cmpl-") for i in ids) or not "".join(text):
        return fails(f"ids {ids}")
    return works(f"{len(text)} pieces, ids cmpl-")


async def completions_echo(t: Target) -> Outcome:
    return await refused(_client(t).completions.create(model=t.model, prompt="x", echo=True, max_tokens=4), 400, "unsupported_parameter", "echo")


async def completions_logprobs(t: Target) -> Outcome:
    return await refused(_client(t).completions.create(model=t.model, prompt="x", logprobs=2, max_tokens=4), 400, "unsupported_parameter", "logprobs")


async def embeddings(t: Target) -> Outcome:
    if not t.embed_model:
        return Outcome(Verdict.SKIPPED, "no --embed-model")
    r = await _client(t).embeddings.create(model=t.embed_model, input=["hello", "world"])
    if len(r.data) != 2 or not r.data[0].embedding:
        return fails(f"{len(r.data)} vectors")
    return works(f"2 vectors of {len(r.data[0].embedding)}, {r.usage.prompt_tokens} tokens")


async def embeddings_of_chat_model(t: Target) -> Outcome:
    return await refused(_client(t).embeddings.create(model=t.model, input="x"), 400, "embeddings_not_served", "model")


async def rerank_of_chat_model(t: Target) -> Outcome:
    c = _client(t)
    call = c.post("/rerank", body={"model": t.model, "query": "q", "documents": ["a", "b"]}, cast_to=object)
    return await refused(call, 400, "rerank_not_served", "model")


# --------------------------------------------------------------------------- checks


def _bad(param: str, code: str, **fields) -> Callable[[Target], Awaitable[Outcome]]:
    async def check(t: Target) -> Outcome:
        body = {"messages": ASK, "max_tokens": 4, **fields}
        return await refused(_client(t).chat.completions.create(model=t.model, **body), 400, code, param)

    return check


async def prompt_past_context(t: Target) -> Outcome:
    long = [{"role": "user", "content": "hello " * 5000}]
    return await refused(_client(t).chat.completions.create(model=t.model, messages=long, max_tokens=4), 400, "context_length_exceeded", "messages")


async def _raw(t: Target, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """One raw HTTP request at the gateway: (status, the JSON answer)."""
    u = urlsplit(t.url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        writer.write(head + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1 << 20), 30)
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            more = await asyncio.wait_for(reader.read(1 << 20), 30)
            if not more:
                break
            data += more
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1])
    try:
        return status, json.loads(data.split(b"\r\n\r\n", 1)[1])
    except ValueError:
        return status, {}


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _post(t: Target, body: bytes, length: int | None = None) -> bytes:
    path = urlsplit(t.url).path.rstrip("/") + "/chat/completions"
    return (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {t.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def malformed_json(t: Target) -> Outcome:
    body = b'{"model": "x", "messages": [}'
    status, answer = await _raw(t, _post(t, body), body)
    err = answer.get("error", {})
    if status == 400 and err.get("type") == "invalid_request_error" and err.get("message"):
        return Outcome(Verdict.CLEAR_ERROR, f"400: {err['message']}")
    return fails(f"{status} {answer}")


async def oversized_body(t: Target) -> Outcome:
    status, answer = await _raw(t, _post(t, b"", length=1 << 40))
    err = answer.get("error", {})
    if status == 413 and err.get("message"):
        return Outcome(Verdict.CLEAR_ERROR, f"413: {err['message']}")
    return fails(f"{status} {answer}")


ROWS = [
    Row("openai chat", "text", chat_plain),
    Row("openai chat", "text, streamed with usage", chat_streamed),
    Row("openai chat", "tools, tool_choice=auto", tools_auto),
    Row("openai chat", "tools, tool_choice=required", tools_required),
    Row("openai chat", "tools, tool_choice=a named function", tools_named),
    Row("openai chat", "tools, tool_choice=none", tools_none),
    Row("openai chat", "tools, parallel_tool_calls", tools_parallel),
    Row("openai chat", "tools, streamed tool-call deltas", tools_streamed),
    Row("openai chat", "a tool's result sent back", tool_result),
    Row("openai completions", "text, id cmpl-", completions_plain),
    Row("openai completions", "streamed, ids cmpl-", completions_streamed),
    Row("openai completions", "echo", completions_echo),
    Row("openai completions", "logprobs (the completions shape)", completions_logprobs),
    Row("openai embeddings", "an embeddings profile", embeddings),
    Row("openai embeddings", "asked of a chat-only model", embeddings_of_chat_model),
    Row("openai rerank", "asked of a model that does not rerank", rerank_of_chat_model),
    Row("openai checks", "messages: []", _bad("messages", "empty_array", messages=[])),
    Row("openai checks", "temperature: 5", _bad("temperature", "decimal_above_max_value", temperature=5)),
    Row("openai checks", "top_p: 2", _bad("top_p", "decimal_above_max_value", top_p=2)),
    Row("openai checks", "max_tokens past the context", _bad("max_tokens", "invalid_value", max_tokens=100000)),
    Row("openai checks", "messages of the wrong type", _bad("messages", "invalid_type", messages="hello")),
    Row("openai checks", "a tool_choice naming no tool given", _bad("tool_choice", "invalid_value", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})),
    Row("openai checks", "a prompt past the context", prompt_past_context),
    Row("openai checks", "malformed JSON", malformed_json),
    Row("openai checks", "an oversized body", oversized_body),
]
