"""An engine's error answer in the OpenAI shape, so that a client sees one
shape from the gateway whoever failed: {"error": {"message", "type", "param",
"code"}}, the message the engine's own words.

Engines answer errors each their own way: llama.cpp `{"error": {"code": 400,
"message", "type"}}` (with nlohmann-json internals such as
`[json.exception.type_error.302]` in front of the words), vLLM and SGLang
`{"object": "error", "message", "type", "param", "code": 400}`, FastAPI
`{"detail": ...}`, or plain text. Only error answers come here: the
success path never parses a body.
"""

from __future__ import annotations

import re

import msgspec

from .api import ERROR_TYPES

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()
_INTERNAL = re.compile(r"^\s*\[json\.exception\.[a-z_]+\.\d+\]\s*")
MAX_MESSAGE = 2000

# What an engine's words mean for the catalog: (a phrase of the engine's, what to change, OpenAI's code).
HINTS = (
    (
        "--embeddings",
        "{model} serves no embeddings here: its llama.cpp engine serves them only when started with them (and "
        "then serves chat and completions as well). Give the model's profile `args: [--embeddings, --pooling, mean]` "
        "in the catalog.",
        "embeddings_not_served",
    ),
    (
        "--reranking",
        "{model} does not rerank here: a llama.cpp engine of a reranking model reranks when started with "
        "`args: [--reranking]` in its catalog profile.",
        "rerank_not_served",
    ),
)
# llama.cpp's error types that OpenAI has a code for: (code, param).
CODES = {"exceed_context_size_error": ("context_length_exceeded", "messages")}


def _text(v) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return _encode.encode(v).decode()


def openai_error(status: int, body: bytes, model: str) -> bytes:
    """The engine's error answer `body` (status `status`) as an OpenAI error body."""
    message, type_, param, code = "", None, None, None
    try:
        data = _decode.decode(body)
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            message = _text(err.get("message") or err.get("detail") or err.get("msg"))
            type_ = err.get("type") if isinstance(err.get("type"), str) else None
            param = err.get("param") if isinstance(err.get("param"), str) else None
            code = err.get("code") if isinstance(err.get("code"), str) else None
        else:
            message = _text(err)
        if not message and "detail" in data:
            message = _text(data["detail"])
    elif data is not None:
        message = _text(data)
    if not message:
        message = body.decode(errors="replace").strip() or f"the engine answered {status} with no words"
    message = _INTERNAL.sub("", message)[:MAX_MESSAGE]
    if type_ in CODES and code is None:
        code, param = CODES[type_]
        type_ = None  # OpenAI's: invalid_request_error
    for phrase, hint, hint_code in HINTS:
        if phrase in message:
            message = f"{hint.format(model=model)} (The engine said: {message})"
            code = hint_code
            break
    openai_type = type_ if type_ in ERROR_TYPES.values() else ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return _encode.encode({"error": {"message": message, "type": openai_type, "param": param, "code": code}})
