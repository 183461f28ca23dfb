"""A request's body made ready for its engine: decoded once, checked
(checks.py), its tools put as the engine honours them (tools.py), the model
named as the engine knows it, and encoded again only when something
changed. Pure.

The gateway once read of a body only `model` and `stream`, and passed the
rest untouched; what OpenAI refuses then reached engines that accepted it,
and tools reached one that dropped them (issue 31). Decoding the whole body
costs microseconds (benchmarks/gateway.py), against an answer's
milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from . import checks, tools
from .checks import Refusal
from .serves import Serves

_decode = msgspec.json.Decoder()
_encode = msgspec.json.encode
CHAT = b"/v1/chat/completions"
COMPLETIONS = b"/v1/completions"


class Prepared(NamedTuple):
    body: bytes  # what to send
    tools: bool  # it asks for tool calls: a replica whose engine cannot make them refuses it (proxying.py)


def prepare(path: bytes, body: bytes, model: str, asked: str, serves: Serves) -> Prepared | Refusal:
    """The body to send for `model` (asked for as `asked`, a name or an
    alias), or the Refusal to answer instead."""
    check = checks.CHECKS.get(path)
    if check is None and asked == model:
        return Prepared(body, False)
    try:
        data = _decode.decode(body)
    except (msgspec.DecodeError, RecursionError):  # request_head decoded it already: not met
        return Refusal("We could not parse the JSON body of your request.")
    if not isinstance(data, dict):
        return Refusal("The request body must be a JSON object.")
    changed = asked != model
    if changed:
        data["model"] = model  # engines know the model's name, not its aliases
    if check is not None:
        refused = check(data, serves, model)
        if refused is not None:
            return refused
    wants_tools = path == CHAT and bool(data.get("tools")) and data.get("tool_choice") != "none"
    if path == CHAT:
        changed = tools.prepare(data, serves.llama_cpp, serves.hermes) or changed
    return Prepared(_encode(data) if changed else body, wants_tools)


# llama.cpp names its completions `chatcmpl-`; OpenAI's are `cmpl-`. Rewritten
# byte for byte at the same length, so that Content-Length and chunk sizes hold.
_CHAT_ID = b'"id":"chatcmpl-'
_COMPLETION_ID = b'"id":"cmpl-llm-'


def completion_ids(data: bytes) -> bytes:
    """A piece of a /v1/completions answer with its ids as OpenAI writes them."""
    return data.replace(_CHAT_ID, _COMPLETION_ID) if _CHAT_ID in data else data
