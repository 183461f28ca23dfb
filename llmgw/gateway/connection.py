"""One client connection of the gateway's HTTP edge: requests parsed by
httptools as the bytes arrive, each size counted against GatewayConfig's
limits (a refusal stops the parser: nothing past a limit is buffered), each
phase's deadline (idle, head, body, answer, linger) looked at by the
gateway's sweep, answers written in order. Moved out of server.py (issue 35:
the limits against one client, edge_limits.py, are asked here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import httptools

from . import anthropic_api, api
from .edge_limits import client_of

if TYPE_CHECKING:
    from .server import Gateway

log = logging.getLogger("llmgw.gateway")

_REASON = {k: v.encode() for k, v in api.REASONS.items()}


def _enough_files(connections: int) -> None:
    """Raise the soft limit of open files for `connections` clients and as many
    upstream connections (the hard limit allowing)."""
    try:
        import resource
    except ImportError:
        return
    want = 2 * connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
        if new < want:
            log.warning("open files are limited to %d: fewer than %d connections will fit (raise ulimit -n)", new, connections)


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASON.get(status, b"Unknown"))


class Request:
    __slots__ = ("method", "path", "auth", "body", "keep_alive", "received", "expect", "session", "route")

    def __init__(self) -> None:
        self.method = b""
        self.path = b""
        self.auth = b""
        self.body = b""
        self.keep_alive = True
        self.received = 0.0
        self.expect = False
        self.session = b""  # X-Session-Id: the replica it stays on (choose.py)
        self.route = b""  # why its replica was chosen (choose.Reason), said in the llmgw-route header


class Refused(Exception):
    """Raised in a parser callback: the request is answered `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


# A connection's phase, for its deadline (see config.py).
IDLE, HEAD, BODY, ANSWER, LINGER = range(5)


class Client(asyncio.Protocol):
    """One client connection: requests parsed, answered one at a time, in order."""

    __slots__ = (
        "gw", "transport", "parser", "req", "parts", "size", "busy", "queue", "closed", "local", "exchange",
        "paused", "url", "admin", "phase", "deadline", "head_bytes", "length", "refusal", "cfg",
        "client", "answer_by", "task", "late", "answered",
    )  # fmt: skip

    def __init__(self, gw: "Gateway", admin: bool = False) -> None:
        self.gw = gw
        self.cfg = gw.config
        self.admin = admin  # the --metrics-listen address: /metrics only
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.req: Request | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.url = b""
        self.busy = False
        self.queue: deque[Request] = deque()
        self.closed = False
        self.local = True
        self.exchange = None
        self.paused = False
        self.phase = HEAD  # a new connection owes its first head within header_timeout
        self.deadline = gw.now + gw.config.header_timeout
        self.head_bytes = 0  # of the head being received, counted as they arrive
        self.length = -1  # the Content-Length of the request being received
        self.refusal: tuple | None = None  # to answer once the answers owed before it are sent
        self.client: str | None = None  # its address, as its limits count it (edge_limits.client_of)
        self.answer_by = 0.0  # the request being answered must be answered by then (request_timeout)
        self.task: asyncio.Task | None = None  # the request being proxied
        self.late = False  # past request_timeout: its task was cancelled for it
        self.answered = 0  # requests answered: whether handling that raised had answered

    # ----------------------------------------------------------------- asyncio

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        host = peer[0] if peer else ""
        self.local = host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or not host
        gw = self.gw
        clients = gw.clients
        self.client = client_of(host)
        held = gw.per_client.opened(self.client)  # counted until connection_lost, refused or not
        cap = gw.config.max_connections
        if len(clients) >= cap:
            gw.metrics.edge("max_connections")
            if len(clients) >= cap + max(16, cap // 8):  # a flood: hold nothing
                self.closed = True
                transport.abort()
                return
            clients.add(self)
            self.refuse(503, f"this gateway holds {cap} connections already: retry later", b"Retry-After: 1\r\n")
            return
        per = gw.config.max_connections_per_client
        if held > per:
            # One client must not take every slot (issue 35: one client's 4,300 idle
            # connections did): refused as the cap above is, while others are served.
            gw.metrics.edge("max_connections_per_client")
            if held > per + max(16, per // 8):
                self.closed = True
                transport.abort()
                return
            clients.add(self)
            self.refuse(429, f"this client holds {per} connections to this gateway already: retry later", b"Retry-After: 1\r\n")
            return
        clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.refusal is not None:
            return  # lingering after a refusal (or before it): dropped
        if self.phase != BODY:  # a head (this one, or the next)
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as e:
            why = e.__context__
            if isinstance(why, Refused):
                self.gw.metrics.edge(_EDGE_WHY.get(why.status, str(why.status)))
                self.refuse(why.status, why.message)
            else:
                self.gw.metrics.edge("malformed")
                self.refuse(400, f"malformed HTTP request: {e}")
            return
        if self.phase == HEAD and self.head_bytes > self.cfg.max_header_bytes:
            self.gw.metrics.edge("max_header_bytes")
            self.refuse(431, f"the request's line and headers are larger than {self.cfg.max_header_bytes} bytes")

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.phase = LINGER
        self.deadline = 0.0
        self.gw.clients.discard(self)
        if self.client is not None:
            self.gw.per_client.closed(self.client)
            self.client = None
        ex = self.exchange
        if ex is not None:
            ex.client_gone()

    def pause_writing(self) -> None:
        self.paused = True
        ex = self.exchange
        if ex is not None and ex.upstream is not None:
            ex.upstream.pause()

    def resume_writing(self) -> None:
        self.paused = False
        ex = self.exchange
        if ex is not None and ex.upstream is not None:
            ex.upstream.resume()

    def expire(self) -> None:
        """Its deadline passed (the gateway's sweep)."""
        phase = self.phase
        self.deadline = 0.0
        if phase == LINGER or phase == IDLE or self.closed or (phase == HEAD and self.req is None):
            # No byte of a request: closed without an answer (one the client did not ask for).
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            return
        cfg = self.cfg
        self.gw.metrics.edge("header_timeout" if phase == HEAD else "body_timeout")
        if phase == HEAD:
            why = f"the request's head did not arrive within {cfg.header_timeout:g}s"
        else:
            why = f"the request's body did not arrive within {cfg.body_timeout:g}s"
        self.refuse(408, why)

    # ----------------------------------------------------------------- httptools

    def on_message_begin(self) -> None:
        self.req = Request()
        self.parts = []
        self.size = 0
        self.url = b""
        self.length = -1
        if self.phase != HEAD:  # from idle (or the answer): this head's time starts now
            self.phase = HEAD
            self.deadline = self.gw.now + self.cfg.header_timeout

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.cfg.max_request_line:
            raise Refused(414, f"the request's URL is longer than {self.cfg.max_request_line} bytes")
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"authorization":
            self.req.auth = value
        elif n == b"x-api-key":  # Anthropic's clients send the key so; Authorization wins when both come
            if not self.req.auth:
                self.req.auth = value
        elif n == b"x-session-id":
            self.req.session = value[:256]
        elif n == b"content-length":
            try:
                self.length = int(value)
            except ValueError:
                raise Refused(400, "Content-Length is not a number") from None
        elif n == b"expect" and value.lower() == b"100-continue":
            self.req.expect = True

    def on_headers_complete(self) -> None:
        req = self.req
        cfg = self.cfg
        if self.length > cfg.max_body:
            raise Refused(413, f"the request body ({self.length} bytes) is larger than {cfg.max_body} bytes")
        self.phase = BODY
        self.head_bytes = 0
        self.deadline = self.gw.now + cfg.body_timeout
        req.method = self.parser.get_method()
        req.path = self.url.split(b"?", 1)[0]
        if req.expect and not self.busy and not self.closed:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.cfg.max_body:
            raise Refused(413, f"the request body is larger than {self.cfg.max_body} bytes")
        self.parts.append(body)

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or self.closed:
            return
        parts = self.parts
        req.body = parts[0] if len(parts) == 1 else b"".join(parts)
        req.keep_alive = self.parser.should_keep_alive()
        req.received = time.monotonic()
        self.req = None
        self.phase = ANSWER
        self.deadline = 0.0
        if self.busy:
            self.queue.append(req)
        else:
            self.busy = True
            self.start(req)

    # ----------------------------------------------------------------- answers

    def start(self, req: Request) -> None:
        """Handle `req`, within request_timeout. Whatever goes wrong in handling it
        is answered (500 in OpenAI's shape) rather than leaving it unanswered and
        the connection held: issue 35 found a RecursionError that nothing caught
        did that, for good."""
        self.answer_by = self.gw.now + self.cfg.request_timeout
        answered = self.answered
        try:
            self.gw.handle(self, req)
        except Exception as e:
            self.gw.internal_error(e)
            if self.answered == answered and self.busy:
                self.reply(req, 500, api.error_body(500, "internal error of the gateway", "internal_error"))

    def answer_late(self) -> None:
        """The request being handled is past request_timeout (the gateway's sweep):
        a proxied one's task is cancelled, and answers for itself (504, or its
        stream's error event); anything else is cut off."""
        self.answer_by = 0.0
        self.late = True
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            return
        self.gw.metrics.edge("request_timeout")
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def finished(self, keep_alive: bool) -> None:
        """The answer to the current request is complete."""
        self.exchange = None
        self.task = None
        self.answer_by = 0.0
        self.answered += 1
        if self.closed:
            return
        if not keep_alive:
            self.closed = True
            self.transport.close()
            return
        if self.queue:
            self.start(self.queue.popleft())
        elif self.refusal is not None:
            self.busy = False
            self.refuse(*self.refusal)
        else:
            self.busy = False
            if self.phase == ANSWER:  # no byte of a next request yet
                self.phase = IDLE
                self.deadline = self.gw.now + self.cfg.keepalive_timeout

    def reply(self, req: Request, status: int, body: bytes, content_type: bytes = b"application/json", headers: bytes = b"") -> None:
        if not self.closed:
            close = b"" if req.keep_alive else b"Connection: close\r\n"
            self.transport.write(
                b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n%s"
                % (_status_line(status), content_type, len(body), headers, close, body)
            )
        self.finished(req.keep_alive)

    def refuse(self, status: int, message: str, headers: bytes = b"") -> None:
        """Answer `status` and close: a request that cannot be parsed, or is past a limit.
        What the client still sends is read and dropped (up to linger_timeout, or
        its end) so that it reads the answer, not a reset."""
        if self.closed:
            return
        if self.busy:  # a pipelined request: refused after the answers owed before it
            if self.refusal is None:
                self.refusal = (status, message, headers)
                self.phase = ANSWER
                self.deadline = 0.0
            return
        self.closed = True
        self.refusal = None
        self.queue.clear()
        self.req = None
        self.parts = []
        url, self.url = self.url, b""
        if anthropic_api.serves(url.split(b"?", 1)[0]):  # its clients read Anthropic's shape
            body = anthropic_api.error_body(status, message)
        else:
            body = api.error_body(status, message, _EDGE_CODE.get(status))
        t = self.transport
        t.write(
            b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s"
            % (_status_line(status), len(body), headers, body)
        )
        linger_s = self.cfg.linger_timeout
        if linger_s > 0 and t.can_write_eof():
            t.write_eof()
            self.phase = LINGER
            self.deadline = self.gw.now + linger_s
        else:
            t.close()


# Edge refusals: the metric's `why`, and the error's code.
_EDGE_WHY = {413: "max_body", 414: "max_request_line", 400: "malformed"}
_EDGE_CODE = {
    408: "request_timeout", 413: "request_too_large", 414: "url_too_long", 431: "headers_too_large",
    429: "too_many_connections", 503: "too_many_connections",
}  # fmt: skip
