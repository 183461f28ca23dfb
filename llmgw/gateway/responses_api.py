"""OpenAI's Responses API (`POST /v1/responses`) onto an engine's chat
completions. Pure: a request dict in, a chat body out; a chat answer (whole,
or a stream's chunks) in, a Response object or the Responses stream's events
out. The shell (translated.py) sends the chat body through the gateway's
chat path (routing, limits, load reports) and stores what `store` asks
(stored.py).

What is translated, and what is refused with a 400 that says so (nothing is
dropped without a word):

    input (text, or items: messages with input_text / output_text /
      input_image parts, function_call, function_call_output)
                                   chat messages, in order; a
                                   function_call joins the assistant
                                   message before it as a tool call
    instructions                   a system message first (not carried to
                                   the next response, as OpenAI does)
    previous_response_id           that response's input and output items
                                   before this input (stored.py finds them)
    tools (function), tool_choice  chat tools; other tool types (web
                                   search, file search, ...) are refused
    max_output_tokens, temperature, top_p, parallel_tool_calls, text.format
                                   their chat counterparts
    store, metadata, user, truncation, include ([]), prompt_cache_key,
    safety_identifier, service_tier, stream_options
                                   kept on the Response, as OpenAI does
    background, conversation, prompt, reasoning with an effort, and
    anything OpenAI does not know  refused (OpenAI refuses unknown fields)
"""

from __future__ import annotations

import json
import time
import uuid

from .chat_answer import ARGS, ERROR, TEXT, TOOL, Answer, BadRequest, Deltas, expect, function_tool, number, sse

KNOWN = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options", "tools",
    "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "text", "metadata", "user",
    "truncation", "include", "prompt_cache_key", "safety_identifier", "service_tier", "reasoning", "background",
    "conversation", "prompt", "max_tool_calls", "top_logprobs", "context_management", "prompt_cache_retention",
    "prompt_cache_options",
})  # fmt: skip
# Known to OpenAI, not served here: refused with a word, not ignored.
UNSUPPORTED = {
    "background": "background responses are not served by this gateway",
    "conversation": "conversations are not served by this gateway: use previous_response_id",
    "prompt": "stored prompts are not served by this gateway",
    "max_tool_calls": "max_tool_calls is not served by this gateway",
    "top_logprobs": "logprobs are not served on /v1/responses by this gateway",
    "context_management": "context_management is not served by this gateway",
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def check(req) -> dict:
    """The request's fields checked as OpenAI checks them (BadRequest if not)."""
    if not isinstance(req, dict):
        raise BadRequest("The request body must be a JSON object.")
    for name in req:
        if name not in KNOWN:
            raise BadRequest(f"Unknown parameter: '{name}'.", name, "unknown_parameter")
    for name, why in UNSUPPORTED.items():
        if req.get(name) not in (None, False):
            raise BadRequest(why, name, "unsupported_parameter")
    if "model" not in req:
        raise BadRequest("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    expect(req["model"], str, "model", "a string")
    if "input" in req:
        expect(req["input"], (str, list), "input", "a string or an array of input items")
    elif not req.get("previous_response_id"):
        raise BadRequest("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    for name in ("instructions", "previous_response_id", "user", "truncation", "prompt_cache_key", "safety_identifier", "service_tier"):
        if req.get(name) is not None:
            expect(req[name], str, name, "a string")
    if req.get("truncation") not in (None, "auto", "disabled"):
        raise BadRequest("Invalid value for 'truncation': expected 'auto' or 'disabled'.", "truncation", "invalid_value")
    for name in ("store", "stream", "parallel_tool_calls"):
        if req.get(name) is not None:
            expect(req[name], bool, name, "a boolean")
    for name in ("metadata", "text", "stream_options"):
        if req.get(name) is not None:
            expect(req[name], dict, name, "an object")
    if req.get("include"):
        expect(req["include"], list, "include", "an array")
        raise BadRequest(f"include {req['include']!r} is not served by this gateway (no such output is made)", "include", "unsupported_parameter")
    reasoning = req.get("reasoning")
    if reasoning is not None:
        expect(reasoning, dict, "reasoning", "an object")
        if reasoning.get("effort") is not None or reasoning.get("summary") is not None:
            raise BadRequest("reasoning effort and summaries are not served by this gateway's engines", "reasoning", "unsupported_parameter")
    number(req, "temperature", 0, 2)
    number(req, "top_p", 0, 1)
    number(req, "max_output_tokens", 1, 1 << 31, integer=True)
    if req.get("tools") is not None:
        expect(req["tools"], list, "tools", "an array")
    return req


# --------------------------------------------------------------------------- request -> chat


def _text_of(content, param: str) -> str:
    """A function_call_output's output (a string, or input_text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part(p, f"{param}[{i}]", "user").get("text", "") for i, p in enumerate(content))
    raise BadRequest(f"Invalid type for '{param}': expected a string or an array of content parts.", param, "invalid_type")


def _part(part, param: str, role: str) -> dict:
    """A content part of a message, as chat's."""
    if not isinstance(part, dict):
        raise BadRequest(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = part.get("text", part.get("refusal"))
        expect(text, str, f"{param}.text", "a string")
        return {"type": "text", "text": text}
    if kind == "input_image" and role != "assistant":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise BadRequest("input_image needs an image_url (file ids are not served by this gateway)", f"{param}.image_url", "unsupported_parameter")
        return {"type": "image_url", "image_url": {"url": url, "detail": part.get("detail") or "auto"}}
    raise BadRequest(f"Content part type {kind!r} is not served by this gateway.", f"{param}.type", "unsupported_parameter")


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise BadRequest(f"Invalid value for '{param}.role': {role!r}.", f"{param}.role", "invalid_value")
    content = item.get("content")
    chat_role = "system" if role == "developer" else role
    if isinstance(content, str):
        return {"role": chat_role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"Invalid type for '{param}.content': expected a string or an array.", f"{param}.content", "invalid_type")
    parts = [_part(p, f"{param}.content[{i}]", role) for i, p in enumerate(content)]
    if chat_role != "user" or all(p["type"] == "text" for p in parts):
        return {"role": chat_role, "content": "".join(p["text"] for p in parts if p["type"] == "text")}
    return {"role": chat_role, "content": parts}


def items_to_messages(items: list, param: str = "input") -> list[dict]:
    """Responses input (or stored output) items as chat messages."""
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"Invalid type for '{where}': expected an object.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                expect(item.get(name), str, f"{where}.{name}", "a string")
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), (str, type(None))):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            expect(item.get("call_id"), str, f"{where}.call_id", "a string")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text_of(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue  # no engine here reasons aloud: an item of another's carries nothing for it
        else:
            raise BadRequest(f"Input item type {kind!r} is not served by this gateway.", f"{where}.type", "unsupported_parameter")
    return messages


def input_items(req: dict) -> list[dict]:
    """This request's input as items (a string is one user message)."""
    given = req.get("input")
    if given is None:
        return []
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return list(given)


def _tools(tools) -> list[dict]:
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        expect(tool, dict, where, "an object")
        if tool.get("type") != "function":
            raise BadRequest(f"Tool type {tool.get('type')!r} is not served by this gateway: only function tools.", f"{where}.type", "unsupported_parameter")
        expect(tool.get("name"), str, f"{where}.name", "a string")
        out.append(function_tool(tool["name"], tool.get("description"), tool.get("parameters"), tool.get("strict")))
    return out


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(f"tool_choice {choice!r} is not served by this gateway: auto, none, required or a function.", "tool_choice", "unsupported_parameter")


def _format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is not None:
        expect(fmt, dict, "text.format", "an object")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(f"text.format {fmt.get('type')!r} is not served by this gateway.", "text.format", "unsupported_parameter")


def to_chat(req: dict, model: str, history: list[dict] = ()) -> dict:
    """The chat completions body for a checked request; `history`: the items
    of the responses before it (previous_response_id), oldest first."""
    messages: list[dict] = []
    if req.get("instructions"):
        messages.append({"role": "system", "content": req["instructions"]})
    messages += items_to_messages(list(history), "previous_response_id")
    messages += items_to_messages(input_items(req))
    if not messages:
        raise BadRequest("The input is empty.", "input", "empty_input")
    body: dict = {"model": model, "messages": messages}
    if req.get("stream"):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if req.get("tools"):
        body["tools"] = _tools(req["tools"])
    if req.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(req["tool_choice"])
    if req.get("parallel_tool_calls") is not None:
        body["parallel_tool_calls"] = req["parallel_tool_calls"]
    if req.get("max_output_tokens") is not None:
        body["max_tokens"] = req["max_output_tokens"]
    for name in ("temperature", "top_p"):
        if req.get(name) is not None:
            body[name] = req[name]
    fmt = _format(req.get("text"))
    if fmt is not None:
        body["response_format"] = fmt
    return body


# --------------------------------------------------------------------------- answer -> Response


def skeleton(req: dict, rid: str, model: str, created_at: int | None = None) -> dict:
    """The Response as created, before any output: what `response.created` carries."""
    return {
        "id": rid, "object": "response", "created_at": created_at if created_at is not None else int(time.time()),
        "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"), "model": model, "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True), "previous_response_id": req.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None}, "store": req.get("store", True),
        "temperature": req.get("temperature", 1.0), "text": req.get("text") or {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools") or [], "top_p": req.get("top_p", 1.0),
        "truncation": req.get("truncation") or "disabled", "usage": None, "user": req.get("user"),
        "metadata": req.get("metadata") or {}, "service_tier": req.get("service_tier") or "default",
    }  # fmt: skip


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" or text else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def _usage(answer: Answer) -> dict:
    return {
        "input_tokens": answer.prompt_tokens, "input_tokens_details": {"cached_tokens": answer.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": answer.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }  # fmt: skip


def _finished(response: dict, answer: Answer) -> dict:
    done = dict(response)
    if answer.finish_reason == "length":
        done["status"], done["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    else:
        done["status"] = "completed"
    done["usage"] = _usage(answer)
    return done


def complete(response: dict, answer: Answer, ids=new_id) -> dict:
    """The Response of an unstreamed chat answer."""
    output = []
    if answer.text or not answer.tool_calls:
        output.append(_message_item(ids("msg"), answer.text))
    for call in answer.tool_calls:
        output.append(_call_item(ids("fc"), call.id, call.name, call.arguments))
    done = _finished(response, answer)
    done["output"] = output
    return done


def error_event(seq: int, message: str, code: str | None) -> dict:
    return {"type": "error", "code": code, "message": message, "param": None, "sequence_number": seq}


class Stream:
    """A chat stream's chunks as the Responses stream's events:
    response.created, response.in_progress, then per output item
    output_item.added, (content_part.added, output_text.delta...,
    output_text.done, content_part.done | function_call_arguments.delta...,
    function_call_arguments.done), output_item.done, and
    response.completed (response.incomplete when cut by max_output_tokens;
    an error event then response.failed when the engine failed midway)."""

    def __init__(self, response: dict, ids=new_id) -> None:
        self.response = response
        self.ids = ids
        self.deltas = Deltas()
        self.seq = 0
        self.output: list[dict] = []  # items done
        self.open: dict | None = None  # the item being streamed
        self.calls: dict[int, dict] = {}  # chat's tool call index -> its item
        self.failed = False

    def _event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return sse(kind, json.dumps(data, separators=(",", ":")).encode())

    def start(self) -> bytes:
        return self._event("response.created", response=self.response) + self._event("response.in_progress", response=self.response)

    def _close_open(self) -> bytes:
        item, self.open = self.open, None
        if item is None:
            return b""
        index = len(self.output)
        out = b""
        if item["type"] == "message":
            text = item["_text"]
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out += self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)
            done = _message_item(item["id"], text)
        else:
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index, name=item["name"], arguments=item["arguments"])
            done = _call_item(item["id"], item["call_id"], item["name"], item["arguments"])
        out += self._event("response.output_item.done", output_index=index, item=done)
        self.output.append(done)
        return out

    def feed(self, data: bytes) -> bytes:
        """One chat event's data: the Responses events it makes."""
        out = b""
        for op in self.deltas.feed(data):
            index = len(self.output)
            if op[0] == TEXT:
                if self.open is None or self.open["type"] != "message":
                    out += self._close_open()
                    index = len(self.output)
                    item_id = self.ids("msg")
                    self.open = {"type": "message", "id": item_id, "_text": ""}
                    out += self._event("response.output_item.added", output_index=index, item=_message_item(item_id, "", "in_progress"))
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    out += self._event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part)
                self.open["_text"] += op[1]
                out += self._event("response.output_text.delta", item_id=self.open["id"], output_index=index, content_index=0, delta=op[1], logprobs=[])
            elif op[0] == TOOL:
                out += self._close_open()
                index = len(self.output)
                item = {"type": "function_call", "id": self.ids("fc"), "call_id": op[2], "name": op[3], "arguments": ""}
                self.open = self.calls[op[1]] = item
                out += self._event("response.output_item.added", output_index=index, item=_call_item(item["id"], op[2], op[3], "", "in_progress"))
            elif op[0] == ARGS:
                item = self.calls.get(op[1])
                if item is not None and item is self.open:
                    item["arguments"] += op[2]
                    out += self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=op[2])
            elif op[0] == ERROR:
                out += self.fail(op[1], op[2])
        return out

    def fail(self, message: str, code: str | None) -> bytes:
        """The engine (or the gateway's wait) failed mid-stream: an error event, then response.failed."""
        self.open = None
        self.failed = True
        failed = dict(self.response, status="failed", output=self.output, error={"code": code or "server_error", "message": message})
        return self._event("error", code=code, message=message, param=None) + self._event("response.failed", response=failed)

    def finish(self) -> tuple[bytes, dict]:
        """The closing events, and the Response as it ended."""
        out = self._close_open()
        if not self.output:  # nothing said: an empty message, as OpenAI's
            item_id = self.ids("msg")
            out += self._event("response.output_item.added", output_index=0, item=_message_item(item_id, "", "in_progress"))
            self.open = {"type": "message", "id": item_id, "_text": ""}
            out += self._close_open()
        done = _finished(self.response, self.deltas.answer)
        done["output"] = self.output
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=done), done


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    from .api import ERROR_TYPES

    return json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param, "code": code}}).encode()
