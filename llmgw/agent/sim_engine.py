"""The engine of a simulated shard: a tiny OpenAI-compatible HTTP server, no model.

A simulated replica once ran nothing and advertised `http://127.0.0.1:<port>`
with the port placement gave it, counted from 20000 on every node like a real
engine's: beside a real agent (the README's tour), a request for `llama-70b`
was answered, 200, by the SmolLM2 engine on that port. So each simulated
shard serves this on a port of its own (bound to port 0, advertised as
bound), and every answer says which simulated replica of which model wrote
it: the tour's simulated models can be asked, and the gateway, the tests and
the benchmarks go over real HTTP to them.

It answers, HTTP/1.1 with keep-alive: GET /v1/models (the model, with the
identity the agent gave it as an alias, as llama.cpp lists its aliases),
GET /health, POST /v1/chat/completions and /v1/completions (streamed as
server-sent events when asked, a word an event, the usage in the last), and
POST /v1/embeddings. Request bodies must come with a Content-Length.

Its usage says how many prompt tokens (words, here) it took from its prefix
cache (`prompt_tokens_details.cached_tokens`, as OpenAI's and vLLM's do): the
longest start a prompt shares with one of the last PREFIX_CACHE it was
asked, so that a simulated fleet's prefix-hit ratio (the console's plots)
moves with what it is asked, as a real engine's does.

Given a key, as an agent gives each engine its own, it answers 401 to any
request but GET /health without `Authorization: Bearer <key>` (as llama.cpp
does), so the gateway's tests and benchmarks go through the engine keys.
"""

from __future__ import annotations

import asyncio
import hmac
import json

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}
MAX_HEAD = 64 * 1024
PREFIX_CACHE = 64  # prompts a simulated engine remembers, for the prefixes it finds in its cache


class SimEngine:
    """One simulated engine, in the caller's event loop."""

    def __init__(self, model: str, *, identity: str = "", says: str = "", delay: float = 0.0, key: str = "") -> None:
        self.model = model
        self.identity = identity
        self.key = key  # "" : it answers anyone
        self.unauthorized = 0  # requests refused for want of the key
        self.says = says or f"simulated {model}"
        self.delay = delay  # seconds before an answer, and between streamed events
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._prompts: list[list[str]] = []  # the last PREFIX_CACHE prompts, as words: its "prefix cache"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> "SimEngine":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port or self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """The engine goes away: the port closed, its connections cut."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    # ----------------------------------------------------------------- what it says

    def pieces(self) -> list[str]:
        """The streamed answer, an event each."""
        words = self.says.split()
        return [w + " " for w in words[:-1]] + words[-1:]

    @staticmethod
    def prompt_words(req: dict) -> list[str]:
        prompt = req.get("prompt") or " ".join(str(m.get("content", "")) for m in req.get("messages") or [] if isinstance(m, dict))
        return str(prompt).split()

    def prompt_tokens(self, req: dict) -> int:
        return max(len(self.prompt_words(req)), 1)

    def cached_tokens(self, req: dict) -> int:
        """The words of this prompt found in its "cache": the longest start it
        shares with a prompt asked before (the prompt is then remembered)."""
        words = self.prompt_words(req)
        best = 0
        for seen in self._prompts:
            n = 0
            for a, b in zip(words, seen):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._prompts.append(words)
        del self._prompts[:-PREFIX_CACHE]
        return min(best, max(len(words) - 1, 0))  # as an engine, it evaluates at least the prompt's last token

    # ----------------------------------------------------------------- HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    self.send_json(writer, 400, error(400, "send the request body with a Content-Length"), close=True)
                    await writer.drain()
                    return
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                try:
                    req = json.loads(body) if body else {}
                except ValueError:
                    req = None
                if self.key and path != "/health" and not self.authorized(headers.get("authorization", "")):
                    self.unauthorized += 1
                    self.send_json(writer, 401, error(401, "Invalid API Key"))
                elif not isinstance(req, dict):
                    self.send_json(writer, 400, error(400, "the request body is not a JSON object"))
                elif not await self.answer(writer, method, path.split("?", 1)[0], req):
                    return
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def authorized(self, auth: str) -> bool:
        scheme, _, given = auth.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.key.encode())

    async def answer(self, writer: asyncio.StreamWriter, method: str, path: str, req: dict) -> bool:
        """Answer one request; False when the connection is done with."""
        if method == "GET" and path == "/v1/models":
            self.send_json(writer, 200, {"object": "list", "data": [self.model_card()]})
            return True
        if method == "GET" and path == "/health":
            self.send_json(writer, 200, {"status": "ok"})
            return True
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            self.send_json(writer, 404, error(404, f"no route {method} {path}"))
            return True
        if self.delay and not req.get("stream"):
            await asyncio.sleep(self.delay)
        prompt = self.prompt_tokens(req)
        if path == "/v1/embeddings":
            self.send_json(writer, 200, {
                "object": "list", "model": self.model, "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            })  # fmt: skip
            return True
        chat = path == "/v1/chat/completions"
        cached = self.cached_tokens(req)
        if req.get("stream"):
            return await self.stream(writer, chat, prompt, cached=cached)
        done = len(self.says.split())
        usage = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.says}, "finish_reason": "stop"}
        else:
            choice = {"index": 0, "text": self.says, "finish_reason": "stop"}
        kind = "chat.completion" if chat else "text_completion"
        self.send_json(writer, 200, {"id": "sim", "object": kind, "created": 1, "model": self.model, "choices": [choice], "usage": usage})
        return True

    def model_card(self) -> dict:
        card = {"id": self.model, "object": "model", "created": 1, "owned_by": "llmgw-simulated"}
        if self.identity:
            card["aliases"] = [self.model, self.identity]
        return card

    async def stream(self, writer: asyncio.StreamWriter, chat: bool, prompt: int, die_after: int = -1, *, cached: int = 0) -> bool:
        """A streamed answer; cut off (the connection dropped) after `die_after` events when that is not -1."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        pieces = self.pieces()
        kind = "chat.completion.chunk" if chat else "text_completion"
        for i, piece in enumerate(pieces):
            if i == die_after:
                await writer.drain()
                writer.transport.abort()
                return False
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat else {"index": 0, "text": piece, "finish_reason": None}
            self._event(writer, {"id": "sim", "object": kind, "model": self.model, "created": 1, "choices": [choice]})
            await writer.drain()
            if self.delay:
                await asyncio.sleep(self.delay)
        last = {"index": 0, "delta": {}, "finish_reason": "stop"} if chat else {"index": 0, "text": "", "finish_reason": "stop"}
        usage = {"prompt_tokens": prompt, "completion_tokens": len(pieces), "total_tokens": prompt + len(pieces),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        self._event(writer, {"id": "sim", "object": kind, "model": self.model, "created": 1, "choices": [last], "usage": usage})
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        return True

    @staticmethod
    def _event(writer: asyncio.StreamWriter, event: dict) -> None:
        data = b"data: " + json.dumps(event).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    @staticmethod
    def send_json(writer: asyncio.StreamWriter, status: int, answer: dict, close: bool = False) -> None:
        body = json.dumps(answer).encode()
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (status, _REASONS.get(status, "Error").encode(), len(body), b"Connection: close\r\n" if close else b"", body)
        )


def error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "code": status}}
