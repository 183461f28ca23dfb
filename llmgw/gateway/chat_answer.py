"""An engine's chat completions answer, read once for the APIs translated
onto it (responses_api.py, anthropic_api.py). Pure.

Both translated APIs answer from the same few facts: text, tool calls, why
generation stopped, tokens used. A whole answer (`whole`) and a stream's
chunks (`Deltas`) are read into those facts here, so each API renders them
in its own shape and neither parses chat completions itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


class BadRequest(ValueError):
    """A request the translated API refuses: 400 unless `status` says
    otherwise, with the parameter at fault, in the API's own error shape."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class Answer:
    """What a chat completion said, in the facts the translations render."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "tool_calls", ...
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def _usage(answer: Answer, data: dict) -> None:
    usage = data.get("usage")
    if isinstance(usage, dict):
        answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        answer.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            answer.cached_tokens = int(details.get("cached_tokens") or 0)
        return
    timings = data.get("timings")  # llama.cpp's, when it sends no usage
    if isinstance(timings, dict) and not answer.prompt_tokens:
        answer.prompt_tokens = int(timings.get("prompt_n") or 0)
        answer.completion_tokens = int(timings.get("predicted_n") or 0)


def whole(body: bytes) -> Answer:
    """An unstreamed chat completion. ValueError when it is not one."""
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("the engine's answer is not a chat completion")
    choice = data["choices"][0]
    message = choice.get("message") or {}
    answer = Answer(text=message.get("content") or "", finish_reason=choice.get("finish_reason"))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        answer.tool_calls.append(ToolCall(call.get("id") or f"call_{i}", fn.get("name") or "", fn.get("arguments") or ""))
    _usage(answer, data)
    return answer


# What a stream's chunk says, in order (Deltas.feed): each a tuple.
TEXT = "text"  # (TEXT, delta)
TOOL = "tool"  # (TOOL, index, id, name): a tool call begins
ARGS = "args"  # (ARGS, index, delta): more of its arguments
ERROR = "error"  # (ERROR, message, code): the stream ended with an error event


class Deltas:
    """A chat stream's chunks read into what they add: text, a tool call
    begun, its arguments. The answer so far (text, calls, finish reason,
    usage) is kept in `answer` for the closing events."""

    def __init__(self) -> None:
        self.answer = Answer()
        self._calls: dict[int, ToolCall] = {}

    def feed(self, data: bytes) -> list[tuple]:
        """One event's data (what follows `data:`)."""
        data = data.strip()
        if not data or data == b"[DONE]":
            return []
        try:
            chunk = json.loads(data)
        except ValueError:
            return [(ERROR, "the engine sent an event that is not JSON", "upstream_error")]
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk:  # the gateway's own (proxying._broken) or the engine's
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return [(ERROR, str(err.get("message") or "the engine failed"), err.get("code") or "upstream_error")]
        out: list[tuple] = []
        answer = self.answer
        _usage(answer, chunk)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                answer.text += text
                out.append((TEXT, text))
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                fn = call.get("function") or {}
                known = self._calls.get(index)
                if known is None:
                    known = self._calls[index] = ToolCall(call.get("id") or f"call_{index}", fn.get("name") or "")
                    answer.tool_calls.append(known)
                    out.append((TOOL, index, known.id, known.name))
                args = fn.get("arguments")
                if args:
                    known.arguments += args
                    out.append((ARGS, index, args))
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]
        return out


class SseReader:
    """Server-sent events out of a byte stream, as they complete: each the
    bytes after `data:` (an event's several data lines joined by newlines)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        events = []
        while True:
            cut = self._buf.find(b"\n\n")
            if cut < 0:
                break
            block, self._buf = self._buf[:cut], self._buf[cut + 2 :]
            lines = [line[5:].lstrip(b" ") for line in block.replace(b"\r", b"").split(b"\n") if line.startswith(b"data:")]
            if lines:
                events.append(b"\n".join(lines))
        return events

    def rest(self) -> list[bytes]:
        """What was left without its blank line at the end of the stream."""
        tail, self._buf = self._buf, b""
        return self.feed(tail + b"\n\n") if tail.strip() else []


def sse(event: str, data: bytes) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), data)


# A chat request's sampling parameters that the translated APIs pass as they are.
def number(req: dict, name: str, low: float, high: float, param: str | None = None, integer: bool = False):
    """`req[name]` checked to be a number in [low, high] (None if absent)."""
    value = req.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise BadRequest(f"Invalid type for '{param or name}': expected {'an integer' if integer else 'a number'}.", param or name, "invalid_type")
    if not low <= value <= high:
        raise BadRequest(f"Invalid '{param or name}': {value} is outside [{low:g}, {high:g}].", param or name, "invalid_value")
    return value


def expect(value, kind, param: str, what: str):
    """`value` checked to be of `kind` (a type or tuple of them)."""
    if isinstance(value, bool) and kind is not bool and (kind is int or (isinstance(kind, tuple) and int in kind)):
        raise BadRequest(f"Invalid type for '{param}': expected {what}, but got a boolean.", param, "invalid_type")
    if not isinstance(value, kind):
        raise BadRequest(f"Invalid type for '{param}': expected {what}, but got {type(value).__name__}.", param, "invalid_type")
    return value


def function_tool(name, description, parameters, strict=None) -> dict:
    """A chat completions function tool."""
    fn: dict = {"name": name, "parameters": parameters if parameters is not None else {"type": "object", "properties": {}}}
    if description:
        fn["description"] = description
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}
