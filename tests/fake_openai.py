"""A stand-in OpenAI engine for tests of the gateway, in the test's own loop.

Answers chat completions, completions and embeddings with fixed content and
a usage, streams `chunks` events (`delay` seconds apart) when asked to, and
misbehaves on request: `mode` "down" (the port closed), "503" (answers 503),
"hang-up" (closes the connection without answering), "die-after:N" (a
stream cut off after N events). Keeps every request it got.
"""

from __future__ import annotations

import asyncio
import json


class FakeEngine:
    def __init__(self, name: str = "fake", chunks: int = 4, delay: float = 0.0) -> None:
        self.name = name
        self.chunks = chunks
        self.delay = delay
        self.mode = "ok"
        self.requests: list[dict] = []
        self.paths: list[str] = []
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> "FakeEngine":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port or self.port)
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.paths.append(path)
                req = json.loads(body) if body else {}
                self.requests.append(req)
                if not await self._answer(writer, path, req):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, path: str, req: dict) -> bool:
        mode = self.mode
        if mode == "hang-up":
            writer.transport.abort()
            return False
        if mode == "503":
            body = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return True
        model = req.get("model", "")
        if req.get("stream"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            die_after = int(mode.split(":")[1]) if mode.startswith("die-after:") else -1
            for i in range(self.chunks):
                if i == die_after:
                    await writer.drain()
                    writer.transport.abort()
                    return False
                event = {"id": "x", "object": "chat.completion.chunk", "model": model, "created": 1,
                         "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                if self.delay:
                    await asyncio.sleep(self.delay)
            last = {"id": "x", "object": "chat.completion.chunk", "model": model, "created": 1,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": self.chunks, "total_tokens": 7 + self.chunks}}
            for data in (b"data: " + json.dumps(last).encode() + b"\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        if self.delay:
            await asyncio.sleep(self.delay)
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if path.endswith("/embeddings"):
            answer = {"object": "list", "model": model, "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                      "usage": {"prompt_tokens": 2, "total_tokens": 2}}
        elif path.endswith("/chat/completions"):
            answer = {"id": "c", "object": "chat.completion", "created": 1, "model": model, "usage": usage,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": f"hello from {self.name}"}, "finish_reason": "stop"}]}
        else:
            answer = {"id": "c", "object": "text_completion", "created": 1, "model": model, "usage": usage,
                      "choices": [{"index": 0, "text": f"hello from {self.name}", "finish_reason": "stop"}]}
        body = json.dumps(answer).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        return True
