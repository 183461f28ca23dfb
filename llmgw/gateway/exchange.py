"""One attempt of one request at one replica (Exchange): the engine's answer
passed to the client as it comes, and the attempt's outcome for the
gateway's retry loop (proxying.py). Moved out of server.py unchanged.
"""

from __future__ import annotations

import asyncio
import time

from .connection import Client, Request, _status_line
from .engine_errors import openai_error
from .intake import completion_ids
from .routing import Backend
from .upstream import Lost

USAGE_KEEP = 1 << 20  # an unstreamed answer longer than this is not read for its usage
STREAM_TAIL = 4096
ERROR_KEEP = 16384  # of an engine's error answer, what is kept to answer it in the OpenAI shape

# Outcomes of one attempt.
DONE, RETRY, STALE, GONE, BROKEN, TIMEOUT = range(6)


class Exchange:
    """One attempt of one request at one replica: the answer passed to the client as it comes."""

    __slots__ = (
        "client", "req", "stream", "backend", "fut", "upstream", "out", "sent", "chunked", "status", "keep_alive",
        "first_at", "parts", "kept", "tail", "events", "error", "retry_body", "timer", "completion_ids",
    )  # fmt: skip

    def __init__(self, client: Client, req: Request, stream: bool, backend: Backend, fut: asyncio.Future) -> None:
        self.client = client
        self.req = req
        self.stream = stream
        self.backend = backend
        self.fut = fut
        self.upstream = None
        self.out: list[bytes] = []
        self.sent = False  # the client has had the first byte
        self.chunked = False
        self.status = 0
        self.keep_alive = req.keep_alive
        self.first_at = 0.0
        self.parts: list[bytes] = []  # an unstreamed answer, for its usage
        self.kept = 0
        self.tail = b""  # the end of a stream, for its usage
        self.events = 0
        self.error: Lost | None = None
        self.retry_body = b""
        self.timer = None
        self.completion_ids = False  # a /v1/completions answer: its ids made OpenAI's (intake.completion_ids)

    def _resolve(self, outcome: int) -> None:
        if not self.fut.done():
            self.fut.set_result(outcome)

    # ----------------------------------------------------------------- from the engine

    def head(self, status: int, content_type: bytes, length: int | None, keep_alive: bool) -> None:
        self.status = status
        if status >= 400:  # 502-504: not answering, another replica may; else an error, answered in the OpenAI shape at end()
            self.retry_body = b""
            return
        self.chunked = length is None
        framing = b"Transfer-Encoding: chunked\r\n" if self.chunked else b"Content-Length: %d\r\n" % length
        self.out.append(
            b"%sContent-Type: %s\r\n%sllmgw-replica: %s\r\n%s%s\r\n"
            % (
                _status_line(status),
                content_type or b"application/json",
                framing,
                self.backend.replica.encode(),
                b"llmgw-route: %s\r\n" % self.req.route if self.req.route else b"",
                b"" if self.keep_alive else b"Connection: close\r\n",
            )
        )

    def body(self, data: bytes) -> None:
        if self.status >= 400:
            if len(self.retry_body) < ERROR_KEEP:
                self.retry_body += data
            return
        if self.completion_ids:
            data = completion_ids(data)
        if self.chunked:
            self.out.append(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.out.append(data)
        if self.stream:
            self.events += data.count(b"data:")
            tail = self.tail + data
            self.tail = tail[-STREAM_TAIL:] if len(tail) > STREAM_TAIL else tail
        elif self.kept < USAGE_KEEP:
            self.parts.append(data)
            self.kept += len(data)

    def end(self) -> None:
        self.upstream = None
        if self.status in (502, 503, 504):
            self.error = Lost(f"answered {self.status}: {self.retry_body[:300].decode(errors='replace')}")
            self._resolve(RETRY)
            return
        if self.status >= 400:
            self._engine_error()
            return
        if self.chunked:
            self.out.append(b"0\r\n\r\n")
        self.flush(final=True)
        self._resolve(DONE)

    def _engine_error(self) -> None:
        """The engine's error answer, whole, in the OpenAI error shape (engine_errors.py)."""
        body = openai_error(self.status, self.retry_body, self.backend.model)
        self.out = [
            b"%sContent-Type: application/json\r\nContent-Length: %d\r\nllmgw-replica: %s\r\n%s\r\n%s"
            % (_status_line(self.status), len(body), self.backend.replica.encode(),
               b"" if self.keep_alive else b"Connection: close\r\n", body)
        ]  # fmt: skip
        self.flush(final=True)
        self._resolve(DONE)

    def flush(self, final: bool = False) -> None:
        out = self.out
        if not out or (len(out) == 1 and not self.sent and not final):
            return  # the head alone: held until the first byte of the body
        client = self.client
        if client.closed:
            self.client_gone()
            return
        client.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        if not self.sent:
            self.sent = True
            self.first_at = time.monotonic()
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def lost(self, error: Lost) -> None:
        self.upstream = None
        self.error = error
        if self.status in (502, 503, 504):
            self._resolve(RETRY)
        elif error.stale and not self.sent and not self.out:
            self._resolve(STALE)
        elif not self.sent:
            self._resolve(RETRY)
        else:
            self._resolve(BROKEN)

    # ----------------------------------------------------------------- from elsewhere

    def client_gone(self) -> None:
        up = self.upstream
        self.upstream = None
        if up is not None:
            up.abort()  # the engine stops generating for no one
        self._resolve(GONE)

    def timed_out(self) -> None:
        self.timer = None
        if self.sent or self.fut.done():
            return
        up = self.upstream
        self.upstream = None
        if up is not None:
            up.abort()
        self._resolve(TIMEOUT)
