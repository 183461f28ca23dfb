"""OpenAI's shapes, as far as the gateway reads and writes them. Pure.

The gateway reads of a request only what routes it (`model`, `stream`), and
of an answer only its usage; everything else passes through untouched.
"""

from __future__ import annotations

import msgspec

from ..core.contract.tenancy import may_use
from .routing import Table

# Paths proxied to an engine (their bodies checked and prepared by intake.py).
PROXIED = (b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/rerank")

REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long",
    429: "Too Many Requests", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout",
}  # fmt: skip

# OpenAI's error types by status.
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error",
    413: "invalid_request_error", 414: "invalid_request_error", 431: "invalid_request_error",
    429: "rate_limit_error", 502: "server_error", 503: "server_error", 504: "server_error",
}  # fmt: skip


class RequestHead(msgspec.Struct):
    """What routes a request: the rest of the body is not decoded."""

    model: str = ""
    stream: bool = False
    user: str = ""  # a session: the replica it stays on (choose.py)


_head = msgspec.json.Decoder(RequestHead)


def request_head(body: bytes) -> RequestHead:
    """Raises ValueError with a message for the client when the body is not a request."""
    try:
        return _head.decode(body)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid request body: {e}") from None
    except msgspec.DecodeError:
        raise ValueError("We could not parse the JSON body of your request: it must be a JSON object (OpenAI's API takes JSON).") from None
    except RecursionError:  # nested past the interpreter's limit: the edge's max_json_depth stops these first
        raise ValueError("the request body nests too deeply") from None


_encode = msgspec.json.encode


class _Error(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _Error


def error_body(status: int, message: str, code: str | None = None, type_: str | None = None, param: str | None = None) -> bytes:
    return _encode(_ErrorBody(_Error(message, type_ or ERROR_TYPES.get(status, "server_error"), param, code)))


def sse_error(status: int, message: str, code: str | None = None) -> bytes:
    """An error as the last event of a stream (the openai SDK raises it)."""
    return b"data: " + error_body(status, message, code) + b"\n\n"


class _Model(msgspec.Struct):
    id: str
    object: str
    created: int
    owned_by: str


class _List(msgspec.Struct):
    object: str
    data: list[_Model]


def visible(table: Table, owner: str | None) -> list[str]:
    """Model names a key of `owner` may use (None: no keys, all of them)."""
    return [name for name, r in table.routes.items() if owner is None or may_use(owner, r.owner)]


def models_list(table: Table, owner: str | None) -> bytes:
    """/v1/models: the models and their aliases this key reaches."""
    data = []
    for name in visible(table, owner):
        route = table.routes[name]
        owned = route.owner or "llmgw"
        data.append(_Model(name, "model", route.created, owned))
        for alias in table.aliases(name):
            data.append(_Model(alias, "model", route.created, owned))
    return _encode(_List("list", data))


def model_object(table: Table, name: str) -> bytes:
    route = table.resolve(name)
    assert route is not None
    return _encode(_Model(name, "model", route.created, route.owner or "llmgw"))


# --------------------------------------------------------------------------- usage


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None  # vLLM sends null when it does not count them


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptDetails | None = None


class Timings(msgspec.Struct):  # llama.cpp's, on the last chunk of a stream
    prompt_n: int = 0  # the prompt's tokens it had to compute (past its cache)
    predicted_n: int = 0
    cache_n: int = 0  # the prompt's tokens it had in its cache


class _Answer(msgspec.Struct):
    usage: Usage | None = None
    timings: Timings | None = None


_answer = msgspec.json.Decoder(_Answer)


def usage_of(body: bytes) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt) tokens of an answer, or None if it
    does not say. The cached are those the engine took from its prefix cache
    (0 when it does not say): the console plots their share of the prompt."""
    try:
        a = _answer.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if a.usage is not None:
        u = a.usage
        cached = (u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details is not None else 0
        if not cached and a.timings is not None:
            cached = a.timings.cache_n
        return u.prompt_tokens, u.completion_tokens, cached
    if a.timings is not None:
        t = a.timings
        return t.prompt_n + t.cache_n, t.predicted_n, t.cache_n  # its prompt_n counts only what it evaluated
    return None


def stream_usage(tail: bytes) -> tuple[int, int, int] | None:
    """Usage from the last events of a stream (`usage`, or llama.cpp's `timings`)."""
    for event in reversed(tail.split(b"\n\n")):
        event = event.strip()
        if event.startswith(b"data:") and (b'"usage"' in event or b'"timings"' in event):
            found = usage_of(event[5:].strip())
            if found is not None:
                return found
    return None
