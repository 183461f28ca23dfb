"""Requests checked as OpenAI checks them, before any engine sees them. Pure.

Engines accept what OpenAI refuses: `messages: []`, `temperature: 5` and
`max_tokens: 100000` all got 200 from llama.cpp (issue 31), and a client
written against OpenAI learns of its mistake only from us. Each check takes
a decoded request body (a dict) and what the model serves (serves.Serves),
and returns None or a Refusal: a 400 with OpenAI's `param` and `code` and
words in OpenAI's manner ("Invalid 'temperature': decimal above maximum
value..."). The Responses and Anthropic paths translate into a chat
completions body and call `chat` on it too.

Fields that are not OpenAI's pass: engines take extensions of their own
(llama.cpp's `grammar`, vLLM's `guided_json`), which users choose them for.
What an engine would silently ignore is refused instead, saying so: llama.cpp's
completions have no `echo`, `suffix` or `best_of`, its `logprobs` come in the
chat shape, and it has no `dimensions` for embeddings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .serves import Serves

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_N = 128
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused: answered `status` in OpenAI's error shape."""

    message: str
    param: str | None = None
    code: str | None = None
    status: int = 400


def _type_name(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _wrong_type(param: str, expected: str, v) -> Refusal:
    return Refusal(f"Invalid type for '{param}': expected {expected}, but got {_type_name(v)} instead.", param, "invalid_type")


def _missing(param: str) -> Refusal:
    return Refusal(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _number(body: dict, param: str, lo: float, hi: float) -> Refusal | None:
    v = body.get(param)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _wrong_type(param, "a decimal", v)
    if v > hi:
        return Refusal(f"Invalid '{param}': decimal above maximum value. Expected a value <= {hi:g}, but got {v:g} instead.", param, "decimal_above_max_value")
    if v < lo:
        return Refusal(f"Invalid '{param}': decimal below minimum value. Expected a value >= {lo:g}, but got {v:g} instead.", param, "decimal_below_min_value")
    return None


def _integer(body: dict, param: str, lo: int, hi: int | None = None) -> Refusal | None:
    v = body.get(param)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        return _wrong_type(param, "an integer", v)
    if v < lo:
        return Refusal(f"Invalid '{param}': integer below minimum value. Expected a value >= {lo}, but got {v} instead.", param, "integer_below_min_value")
    if hi is not None and v > hi:
        return Refusal(f"Invalid '{param}': integer above maximum value. Expected a value <= {hi}, but got {v} instead.", param, "integer_above_max_value")
    return None


def _boolean(body: dict, param: str) -> Refusal | None:
    v = body.get(param)
    if v is not None and not isinstance(v, bool):
        return _wrong_type(param, "a boolean", v)
    return None


def _sampling(body: dict, serves: Serves) -> Refusal | None:
    """What chat and completions share: sampling ranges and the token budget."""
    for param, lo, hi in (("temperature", 0, 2), ("top_p", 0, 1), ("presence_penalty", -2, 2), ("frequency_penalty", -2, 2)):
        found = _number(body, param, lo, hi)
        if found:
            return found
    found = _integer(body, "n", 1, MAX_N) or _boolean(body, "stream")
    if found:
        return found
    for param in ("max_tokens", "max_completion_tokens"):
        found = _integer(body, param, 1)
        if found:
            return found
        v = body.get(param)
        if v is not None and serves.context and v > serves.context:
            return Refusal(
                f"{param} is too large: {v}. This model's context is {serves.context} tokens (prompt and completion), "
                f"whereas you asked for {v} completion tokens.", param, "invalid_value",
            )  # fmt: skip
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return _wrong_type("stream_options", "an object", options)
        if not body.get("stream"):
            return Refusal("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options", "invalid_value")
    return None


def _content(i: int, m: dict) -> Refusal | None:
    c = m.get("content")
    param = f"messages[{i}].content"
    if c is None:
        if m.get("role") == "assistant" and (m.get("tool_calls") or m.get("function_call")):
            return None
        if m.get("role") == "assistant":
            return None
        return _missing(param)
    if isinstance(c, str):
        return None
    if isinstance(c, list):
        for j, part in enumerate(c):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                return _wrong_type(f"{param}[{j}]", "an object with a 'type'", part)
        return None
    return _wrong_type(param, "one of a string or array of objects", c)


def _messages(body: dict) -> Refusal | None:
    if "messages" not in body:
        return _missing("messages")
    msgs = body["messages"]
    if not isinstance(msgs, list):
        return _wrong_type("messages", "an array", msgs)
    if not msgs:
        return Refusal(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "messages", "empty_array",
        )  # fmt: skip
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return _wrong_type(f"messages[{i}]", "an object", m)
        role = m.get("role")
        if role is None:
            return _missing(f"messages[{i}].role")
        if role not in ROLES:
            return Refusal(
                f"Invalid value: '{str(role)[:40]}'. Supported values are: {', '.join(repr(r) for r in ROLES)}.",
                f"messages[{i}].role", "invalid_value",
            )  # fmt: skip
        found = _content(i, m)
        if found:
            return found
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            return _missing(f"messages[{i}].tool_call_id")
    return None


def _tools(body: dict, serves: Serves, model: str) -> Refusal | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice is not None and choice != "none":
            return Refusal("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice", "invalid_value")
        return None
    if not isinstance(tools, list):
        return _wrong_type("tools", "an array", tools)
    names = set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            return _wrong_type(f"tools[{i}]", "an object", t)
        if t.get("type") != "function":
            return Refusal(f"Invalid value: '{str(t.get('type'))[:40]}'. Supported values are: 'function'.", f"tools[{i}].type", "invalid_value")
        fn = t.get("function")
        if not isinstance(fn, dict):
            return _missing(f"tools[{i}].function") if fn is None else _wrong_type(f"tools[{i}].function", "an object", fn)
        name = fn.get("name")
        if not isinstance(name, str):
            return _missing(f"tools[{i}].function.name") if name is None else _wrong_type(f"tools[{i}].function.name", "a string", name)
        if not TOOL_NAME.match(name):
            return Refusal(
                f"Invalid 'tools[{i}].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$' of at most 64 characters.",
                f"tools[{i}].function.name", "invalid_value",
            )  # fmt: skip
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            return _wrong_type(f"tools[{i}].function.parameters", "an object", params)
        names.add(name)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            return Refusal(f"Invalid value: '{choice[:40]}'. Supported values are: 'none', 'auto' and 'required'.", "tool_choice", "invalid_value")
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            return Refusal("Invalid 'tool_choice': expected {'type': 'function', 'function': {'name': ...}}.", "tool_choice", "invalid_value")
        if name not in names:
            return Refusal(f"Invalid 'tool_choice': function '{name[:64]}' is not among the tools given.", "tool_choice", "invalid_value")
    elif choice is not None:
        return _wrong_type("tool_choice", "one of a string or an object", choice)
    found = _boolean(body, "parallel_tool_calls")
    if found:
        return found
    if tools and choice != "none" and not serves.tools:
        return Refusal(
            f"The model `{model}` cannot call tools: its catalog profile says `tools: false` (its chat template has no "
            "tool format). Ask without `tools`, with tool_choice 'none', or use a model that calls tools.",
            "tools", "tools_not_supported",
        )  # fmt: skip
    return None


def tool_less(model: str, replica: str) -> str:
    """Why a request with tools is refused where the replica's engine says its template takes none."""
    return (
        f"The model `{model}` cannot call tools: the chat template its engine runs (replica {replica}) has no tool "
        "format, and llama.cpp would answer with prose. Give its catalog profile a template with tools "
        "(`args: [--chat-template-file, FILE]`, or `[--chat-template, llmgw-chatml-tools]` for a ChatML model), "
        "or `tools: false` to have them refused before any replica is asked."
    )


def chat(body: dict, serves: Serves, model: str) -> Refusal | None:
    """A /v1/chat/completions body: None when OpenAI would take it."""
    found = _messages(body) or _sampling(body, serves) or _tools(body, serves, model) or _boolean(body, "logprobs")
    if found:
        return found
    found = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if found:
        return found
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        return Refusal("Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is given.", "top_logprobs", "invalid_value")
    fmt = body.get("response_format")
    if fmt is not None and not isinstance(fmt, dict):
        return _wrong_type("response_format", "an object", fmt)
    return None


def _unsupported(param: str, why: str) -> Refusal:
    return Refusal(f"'{param}' is not supported by this model's engine: {why}.", param, "unsupported_parameter")


def completion(body: dict, serves: Serves, model: str) -> Refusal | None:
    """A /v1/completions body."""
    if "prompt" not in body:
        return _missing("prompt")
    prompt = body["prompt"]
    if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not prompt):
        return _wrong_type("prompt", "a string or a non-empty array of strings or tokens", prompt)
    found = _sampling(body, serves) or _boolean(body, "echo")
    if found:
        return found
    found = _integer(body, "logprobs", 0, 5) if not isinstance(body.get("logprobs"), bool) else None
    if found:
        return found
    if serves.llama_cpp:
        if body.get("echo"):
            return _unsupported("echo", "llama.cpp does not return the prompt with the completion")
        if body.get("logprobs") not in (None, 0, False):
            return _unsupported("logprobs", "llama.cpp gives completions' logprobs in the chat shape; ask /v1/chat/completions with logprobs: true")
        if body.get("suffix"):
            return _unsupported("suffix", "llama.cpp does not insert completions (use its /infill)")
        if body.get("best_of") not in (None, 1):
            return _unsupported("best_of", "llama.cpp returns one completion per prompt")
    return None


def _not_served(model: str, serves: Serves, what: str, how: str, code: str) -> Refusal:
    return Refusal(f"The model `{model}` does not {what}: it serves {serves.what()}. {how}", "model", code)


def embeddings(body: dict, serves: Serves, model: str) -> Refusal | None:
    """A /v1/embeddings body."""
    if not serves.embeddings:
        how = "A llama.cpp engine serves embeddings (and chat still) when started with them: give the model's profile `args: [--embeddings, --pooling, mean]` in the catalog."
        return _not_served(model, serves, "serve embeddings", how, "embeddings_not_served")
    if "input" not in body:
        return _missing("input")
    data = body["input"]
    if isinstance(data, str):
        if not data:
            return Refusal("Invalid 'input': empty string. Expected a non-empty string.", "input", "invalid_value")
    elif isinstance(data, list):
        if not data:
            return Refusal("Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead.", "input", "empty_array")
        for i, x in enumerate(data):
            if isinstance(x, str) and not x:
                return Refusal(f"Invalid 'input[{i}]': empty string. Expected a non-empty string.", f"input[{i}]", "invalid_value")
            if not isinstance(x, (str, int, list)) or isinstance(x, bool):
                return _wrong_type(f"input[{i}]", "a string, a token or an array of tokens", x)
    else:
        return _wrong_type("input", "a string or an array", data)
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        return Refusal(f"Invalid value: '{str(fmt)[:40]}'. Supported values are: 'float' and 'base64'.", "encoding_format", "invalid_value")
    found = _integer(body, "dimensions", 1)
    if found:
        return found
    if serves.llama_cpp and body.get("dimensions") is not None:
        return _unsupported("dimensions", "llama.cpp returns the model's own size")
    return None


def rerank(body: dict, serves: Serves, model: str) -> Refusal | None:
    """A /v1/rerank body (Jina's and Cohere's shape, as llama.cpp and vLLM serve it)."""
    if not serves.rerank:
        how = "A llama.cpp engine of a reranking model reranks when started with `args: [--reranking]` in its catalog profile."
        return _not_served(model, serves, "rerank", how, "rerank_not_served")
    if not isinstance(body.get("query"), str):
        return _missing("query") if body.get("query") is None else _wrong_type("query", "a string", body["query"])
    docs = body.get("documents")
    if docs is None:
        return _missing("documents")
    if not isinstance(docs, list) or not docs:
        return _wrong_type("documents", "a non-empty array", docs)
    return _integer(body, "top_n", 1)


CHECKS = {
    b"/v1/chat/completions": chat,
    b"/v1/completions": completion,
    b"/v1/embeddings": embeddings,
    b"/v1/rerank": rerank,
}
