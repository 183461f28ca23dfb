"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`)
onto an engine's chat completions. Pure: a request dict in, a chat body
out; a chat answer (whole, or a stream's chunks) in, a Message or the
Messages stream's events out; errors in Anthropic's shape
(`{"type":"error","error":{"type":...,"message":...}}`).

    system (a string or text blocks)       a system message first
    messages: text, image (base64 / url),  chat messages; tool_use blocks
      tool_use, tool_result blocks         are the assistant's tool calls,
                                           tool_result blocks tool messages
    tools, tool_choice (auto, any, tool,   chat tools, tool_choice auto /
      none; disable_parallel_tool_use)     required / named / none,
                                           parallel_tool_calls
    max_tokens, stop_sequences,            max_tokens, stop, temperature,
      temperature, top_p, top_k            top_p, top_k (llama.cpp and vLLM
                                           take top_k)
    metadata, service_tier                 accepted (nothing to do here)
    thinking (enabled), documents, server
      tools, cache_control on the request,
      anything Anthropic does not know     refused with a 400 that says so

count_tokens counts with the engine itself: the same chat body asked for
one token, and the engine's `usage.prompt_tokens` (its chat template, its
tokenizer, the tools included) is the answer.
"""

from __future__ import annotations

import json
import uuid

from .chat_answer import ARGS, ERROR, TEXT, TOOL, Answer, BadRequest, Deltas, expect, function_tool, number, sse

KNOWN = frozenset({
    "model", "messages", "system", "max_tokens", "stream", "stop_sequences", "temperature", "top_p", "top_k", "tools",
    "tool_choice", "metadata", "service_tier", "thinking", "container", "cache_control", "output_config", "speed",
    "inference_geo", "diagnostics", "mcp_servers",
})  # fmt: skip
UNSUPPORTED = {
    "container": "containers are not served by this gateway",
    "cache_control": "prompt caching directives are not served by this gateway",
    "output_config": "output_config is not served by this gateway",
    "speed": "speed is not served by this gateway",
    "inference_geo": "inference_geo is not served by this gateway",
    "diagnostics": "diagnostics are not served by this gateway",
    "mcp_servers": "MCP servers are not served by this gateway",
}
COUNT_KNOWN = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})

# Anthropic's error types by status.
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large", 414: "invalid_request_error",
    429: "rate_limit_error", 431: "invalid_request_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
    504: "timeout_error",
}  # fmt: skip
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


PATHS = (b"/v1/messages", b"/v1/messages/count_tokens")


def serves(path: bytes) -> bool:
    """Whether a path is Anthropic's (its errors in Anthropic's shape, even the HTTP edge's)."""
    return path in PATHS


def error_body(status: int, message: str) -> bytes:
    kind = ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def error_event(status: int, message: str) -> bytes:
    return sse("error", error_body(status, message))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def check(req, counting: bool = False) -> dict:
    """The request's fields checked as Anthropic checks them (BadRequest if not)."""
    if not isinstance(req, dict):
        raise BadRequest("The request body must be a JSON object.")
    known = COUNT_KNOWN if counting else KNOWN
    for name in req:
        if name not in known:
            raise BadRequest(f"{name}: Extra inputs are not permitted", name)
    for name, why in UNSUPPORTED.items():
        if req.get(name) is not None:
            raise BadRequest(why, name)
    for name in ("model", "messages") if counting else ("model", "messages", "max_tokens"):
        if name not in req:
            raise BadRequest(f"{name}: Field required", name)
    expect(req["model"], str, "model", "a string")
    expect(req["messages"], list, "messages", "a list")
    if not req["messages"]:
        raise BadRequest("messages: at least one message is required", "messages")
    if not counting:
        expect(req["max_tokens"], int, "max_tokens", "an integer")
        if req["max_tokens"] < 1:
            raise BadRequest("max_tokens: must be greater than or equal to 1", "max_tokens")
        if req.get("stream") is not None:
            expect(req["stream"], bool, "stream", "a boolean")
        if req.get("stop_sequences") is not None:
            expect(req["stop_sequences"], list, "stop_sequences", "a list")
            for s in req["stop_sequences"]:
                expect(s, str, "stop_sequences", "a list of strings")
        number(req, "temperature", 0, 1)
        number(req, "top_p", 0, 1)
        number(req, "top_k", 0, 1 << 31, integer=True)
        if req.get("metadata") is not None:
            expect(req["metadata"], dict, "metadata", "an object")
    thinking = req.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise BadRequest("thinking: extended thinking is not served by this gateway's engines", "thinking")
    if req.get("system") is not None:
        expect(req["system"], (str, list), "system", "a string or a list of text blocks")
    if req.get("tools") is not None:
        expect(req["tools"], list, "tools", "a list")
    return req


# --------------------------------------------------------------------------- request -> chat


def _text(blocks, param: str) -> str:
    """A string, or text blocks, as one string."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise BadRequest(f"{param}: Input should be a valid string or list", param)
    out = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise BadRequest(f"{param}.{i}: only text blocks are served here", f"{param}.{i}")
        out.append(b["text"])
    return "".join(out)


def _image(block: dict, param: str) -> dict:
    source = expect(block.get("source") or {}, dict, f"{param}.source", "an object")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        raise BadRequest(f"{param}.source: image source {source.get('type')!r} is not served by this gateway", f"{param}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _message(msg, i: int) -> list[dict]:
    """One Anthropic message as chat messages (tool results become tool messages)."""
    param = f"messages.{i}"
    if not isinstance(msg, dict):
        raise BadRequest(f"{param}: Input should be a valid dictionary", param)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        raise BadRequest(f"{param}.role: Input should be 'user' or 'assistant'", f"{param}.role")
    content = msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{param}.content: Input should be a valid string or list", f"{param}.content")
    out: list[dict] = []
    parts: list[dict] = []
    calls: list[dict] = []
    for j, block in enumerate(content):
        where = f"{param}.content.{j}"
        if not isinstance(block, dict):
            raise BadRequest(f"{where}: Input should be a valid dictionary", where)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": expect(block.get("text"), str, f"{where}.text", "a string")})
        elif kind == "image" and role == "user":
            parts.append(_image(block, where))
        elif kind == "tool_use" and role == "assistant":
            expect(block.get("id"), str, f"{where}.id", "a string")
            expect(block.get("name"), str, f"{where}.name", "a string")
            args = json.dumps(block.get("input") or {}, separators=(",", ":"))
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": args}})
        elif kind == "tool_result" and role == "user":
            expect(block.get("tool_use_id"), str, f"{where}.tool_use_id", "a string")
            result = _text(block.get("content") if block.get("content") is not None else "", f"{where}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            raise BadRequest(f"{where}.type: a {kind!r} block in a {role} message is not served by this gateway", f"{where}.type")
    if parts or calls:
        if role == "assistant" or all(p["type"] == "text" for p in parts):
            text = "".join(p["text"] for p in parts if p["type"] == "text")
            message: dict = {"role": role, "content": text if (text or not calls) else None}
        else:
            message = {"role": role, "content": parts}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _tool_choice(choice) -> tuple[object, bool | None]:
    """(chat's tool_choice, parallel_tool_calls)."""
    expect(choice, dict, "tool_choice", "an object")
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise BadRequest(f"tool_choice: type {kind!r} is not one of auto, any, tool, none", "tool_choice")


def _tools(tools: list) -> list[dict]:
    out = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        expect(tool, dict, where, "an object")
        if tool.get("type") not in (None, "custom"):
            raise BadRequest(f"{where}: server tool {tool.get('type')!r} is not served by this gateway", where)
        expect(tool.get("name"), str, f"{where}.name", "a string")
        out.append(function_tool(tool["name"], tool.get("description"), tool.get("input_schema")))
    return out


def to_chat(req: dict, model: str, counting: bool = False) -> dict:
    """The chat completions body for a checked request (`counting`: a
    count_tokens request, asked for one token)."""
    messages: list[dict] = []
    if req.get("system"):
        messages.append({"role": "system", "content": _text(req["system"], "system")})
    for i, msg in enumerate(req["messages"]):
        messages += _message(msg, i)
    body: dict = {"model": model, "messages": messages}
    if counting:
        body["max_tokens"] = 1
    else:
        body["max_tokens"] = req["max_tokens"]
        if req.get("stream"):
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if req.get("stop_sequences"):
            body["stop"] = req["stop_sequences"]
        for name in ("temperature", "top_p", "top_k"):
            if req.get(name) is not None:
                body[name] = req[name]
    if req.get("tools"):
        body["tools"] = _tools(req["tools"])
        if req.get("tool_choice") is not None:
            choice, parallel = _tool_choice(req["tool_choice"])
            body["tool_choice"] = choice
            if parallel is not None:
                body["parallel_tool_calls"] = parallel
    return body


# --------------------------------------------------------------------------- answer -> Message


def _input(arguments: str) -> dict:
    """A tool call's arguments as tool_use's input (an object)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"_unparsed_arguments": arguments}  # the model's words kept, not dropped
    return value if isinstance(value, dict) else {"value": value}


def _usage(answer: Answer) -> dict:
    return {
        "input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": answer.cached_tokens,
    }  # fmt: skip


def message(answer: Answer, model: str, mid: str | None = None) -> dict:
    """The Message of an unstreamed chat answer."""
    content: list[dict] = []
    if answer.text or not answer.tool_calls:
        content.append({"type": "text", "text": answer.text})
    for call in answer.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
    stop = STOP_REASONS.get(answer.finish_reason or "stop", "end_turn")
    if answer.tool_calls:
        stop = "tool_use"
    return {
        "id": mid or new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop, "stop_sequence": None, "usage": _usage(answer),
    }  # fmt: skip


def count(answer: Answer) -> dict:
    return {"input_tokens": answer.prompt_tokens}


class Stream:
    """A chat stream's chunks as the Messages stream's events: message_start,
    per block content_block_start, content_block_delta (text_delta or
    input_json_delta)..., content_block_stop, then message_delta (stop
    reason, usage) and message_stop; an `error` event when the engine
    failed midway."""

    def __init__(self, model: str, mid: str | None = None) -> None:
        self.model = model
        self.mid = mid or new_id("msg")
        self.deltas = Deltas()
        self.index = -1  # of the open block
        self.open: str | None = None  # "text" or "tool_use"
        self.calls: dict[int, int] = {}  # chat's tool call index -> block index
        self.failed = False

    @staticmethod
    def _event(kind: str, **fields) -> bytes:
        return sse(kind, json.dumps({"type": kind, **fields}, separators=(",", ":")).encode())

    def start(self) -> bytes:
        msg = {
            "id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0},
        }  # fmt: skip
        return self._event("message_start", message=msg)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return self._event("content_block_stop", index=self.index)

    def feed(self, data: bytes) -> bytes:
        out = b""
        for op in self.deltas.feed(data):
            if op[0] == TEXT:
                if self.open != "text":
                    out += self._close()
                    self.index += 1
                    self.open = "text"
                    out += self._event("content_block_start", index=self.index, content_block={"type": "text", "text": ""})
                out += self._event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": op[1]})
            elif op[0] == TOOL:
                out += self._close()
                self.index += 1
                self.open = "tool_use"
                self.calls[op[1]] = self.index
                block = {"type": "tool_use", "id": op[2], "name": op[3], "input": {}}
                out += self._event("content_block_start", index=self.index, content_block=block)
            elif op[0] == ARGS:
                if self.open == "tool_use" and self.calls.get(op[1]) == self.index:
                    out += self._event("content_block_delta", index=self.index, delta={"type": "input_json_delta", "partial_json": op[2]})
            elif op[0] == ERROR:
                out += self.fail(op[1])
        return out

    def fail(self, message: str, status: int = 502) -> bytes:
        self.failed = True
        return error_event(status, message)

    def finish(self) -> bytes:
        out = b""
        if self.index < 0:  # nothing said: an empty text block, as Anthropic's
            self.index, self.open = 0, "text"
            out += self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        out += self._close()
        answer = self.deltas.answer
        stop = "tool_use" if answer.tool_calls else STOP_REASONS.get(answer.finish_reason or "stop", "end_turn")
        usage = _usage(answer)
        out += self._event("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage=usage)
        return out + self._event("message_stop")
