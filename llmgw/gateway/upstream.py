"""Keep-alive HTTP/1.1 connections to the engines, pooled per replica.

Raw asyncio protocols with httptools parsing the answers: a connection hands
each part of an answer (head, body pieces, end, loss) to the `Exchange`
that sent the request, as it arrives, so streamed answers pass through
chunk by chunk, nothing buffered.

A pooled connection the engine has closed meanwhile (llama.cpp drops idle
ones after 5 s, and after 100 requests) fails before any answer; that is
the connection's fault, not the engine's, and the request is sent again on
a fresh one (`Lost.stale`).

A pool for an engine given an identity verifies each new connection before
it carries a request: GET /v1/models must list the identity
(routing.identity_mismatch), else `NotTheEngine` and the connection is
dropped. Only verified connections are pooled, so a reused one costs
nothing more; a stranger that took the port after the engine died is met on
the new connection it takes to reach it.

Every engine answers only with its key (engines.py): a pool reads it from
the engine keys bucket (the bus's `engine_key`, under the target's
`key_name`) before its first connection, keeps it, and sends
`Authorization: Bearer <key>` on every request, GET /v1/models included. A
key that cannot be had (the bucket unreachable, or no key there) is
`NoKey`: a failed attempt with that reason, and nothing is sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httptools

from .routing import identity_mismatch

IDLE_S = 4.0  # a pooled connection idle longer is closed rather than reused
MAX_IDLE = 64  # idle connections kept per replica
VERIFY_TIMEOUT_S = 5.0  # for an engine's answer to GET /v1/models on a new connection
VERIFY_MAX_BODY = 1 << 20  # more than any list of models: a stranger streaming something else is cut


_LLAMACPP = re.compile(rb'"owned_by"\s*:\s*"llamacpp"')  # in GET /v1/models, however spaced


class NotTheEngine(Exception):
    """A new connection's engine is not the one the replica's agent started."""


class NoKey(NotTheEngine):
    """The engine's key cannot be had: nothing is sent to it (never a request without its key)."""


class Lost(Exception):
    """The connection ended before the answer did."""

    def __init__(self, why: str, stale: bool = False, answered: bool = False) -> None:
        super().__init__(why)
        self.stale = stale  # a reused connection that was already closed: try a fresh one
        self.answered = answered  # some of the answer had come


class Sink:
    """What a connection tells about the answer to the request it carries."""

    def head(self, status: int, content_type: bytes, length: int | None, keep_alive: bool) -> None: ...
    def body(self, data: bytes) -> None: ...
    def end(self) -> None: ...
    def lost(self, error: Lost) -> None: ...
    def flush(self) -> None:
        """The end of one read from the engine: what was gathered may be written."""


class Connection(asyncio.Protocol):
    __slots__ = (
        "pool", "transport", "parser", "sink", "reused", "idle_since", "closed", "got_any",
        "content_type", "length", "_answered", "_until_close", "verified",
    )  # fmt: skip

    def __init__(self, pool: "Pool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.reused = False
        self.idle_since = 0.0
        self.closed = False
        self.got_any = False
        self.content_type = b""
        self.length: int | None = None
        self._answered = False
        self._until_close = False
        self.verified = not pool.identity  # pooled only once verified

    # ----------------------------------------------------------------- asyncio

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(Lost(f"the engine's answer is not HTTP: {e}", answered=self._answered))
            self.abort()
            return
        sink = self.sink
        if sink is not None:
            sink.flush()

    def eof_received(self):
        return False  # close

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.forget(self)
        sink = self.sink
        if sink is not None:
            self.sink = None
            if self._answered and self._until_close:
                sink.end()
                sink.flush()
                return
            stale = self.reused and not self.got_any
            sink.lost(Lost("the engine closed the connection" if exc is None else f"connection lost: {exc}", stale, self._answered))

    # ----------------------------------------------------------------- httptools

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-type":
            self.content_type = value
        elif n == b"content-length":
            try:
                self.length = int(value)
            except ValueError:
                pass

    def on_headers_complete(self) -> None:
        self._answered = True
        parser = self.parser
        status = parser.get_status_code()
        # Neither a length nor chunked: the body ends when the engine closes.
        self._until_close = self.length is None and not parser.should_keep_alive() and status not in (204, 304)
        if self.sink is not None:
            self.sink.head(status, self.content_type, self.length, parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.body(body)

    def on_message_complete(self) -> None:
        sink = self.sink
        keep = self.parser.should_keep_alive()
        self.sink = None
        self._answered = False
        self.content_type, self.length, self._until_close = b"", None, False
        if not keep or self.closed:
            self.abort()
        elif self.verified:
            self.pool.release(self)
        if sink is not None:
            sink.end()

    # ----------------------------------------------------------------- use

    def send(self, data: bytes, sink: Sink) -> None:
        self.sink = sink
        self.got_any = False
        self.transport.write(data)

    def _fail(self, error: Lost) -> None:
        sink = self.sink
        self.sink = None
        if sink is not None:
            sink.lost(error)

    def abort(self) -> None:
        """Drop the connection (a client gone: the engine stops generating)."""
        self.sink = None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()


class _Probe(Sink):
    """The answer to the GET /v1/models that verifies a connection: (status, body)."""

    __slots__ = ("done", "status", "parts", "size")

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done
        self.status = 0
        self.parts: list[bytes] = []
        self.size = 0

    def head(self, status: int, content_type: bytes, length: int | None, keep_alive: bool) -> None:
        self.status = status

    def body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size <= VERIFY_MAX_BODY:
            self.parts.append(data)

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result((self.status, b"".join(self.parts)))

    def lost(self, error: Lost) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def flush(self) -> None:
        pass


class Pool:
    """Idle keep-alive connections to one endpoint."""

    __slots__ = (
        "host", "port", "idle", "open", "host_header", "connect_timeout", "closed", "identity", "verify_timeout",
        "keys", "key_name", "key_timeout", "head", "_fetching", "tools",
    )  # fmt: skip

    def __init__(
        self, host: str, port: int, connect_timeout: float = 3.0, identity: str = "", verify_timeout: float = VERIFY_TIMEOUT_S,
        keys=None, key_name: str = "", key_timeout: float = 3.0,
    ) -> None:  # fmt: skip
        self.host, self.port = host, port
        self.idle: list[Connection] = []
        self.open = 0
        self.host_header = f"{host}:{port}".encode() if ":" not in host else f"[{host}]:{port}".encode()
        self.connect_timeout = connect_timeout
        self.closed = False  # the replica left the table: connections are not kept
        self.identity = identity  # what a new connection's engine must list ("" : not checked)
        self.verify_timeout = verify_timeout
        self.keys = keys  # where engine keys are read: the bus (`engine_key(name)`)
        self.key_name = key_name  # its engine's key's name there ("" : an engine that takes no key)
        self.key_timeout = key_timeout
        # The request head's lines after the request line: Host, and
        # Authorization once the key is known (b"" until then).
        self.head = b"" if key_name else b"Host: %s" % self.host_header
        self._fetching: asyncio.Future | None = None
        # Whether its engine takes tools: llama.cpp's /props says whether its
        # chat template does (llama.cpp answers tools with prose where it does
        # not), asked once, on the first verified connection (None: none yet).
        self.tools: bool | None = None

    def take_idle(self) -> Connection | None:
        idle = self.idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > IDLE_S:
                conn.abort()
                continue
            conn.reused = True
            return conn
        return None

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        if not self.head:
            await self._key()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(self), self.host, self.port), self.connect_timeout
        )
        sock = conn.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.open += 1
        if not conn.verified:
            await self._verify(conn)
        return conn

    async def _key(self) -> None:
        """Read the engine's key (one read at a time per pool); NoKey when it cannot be had."""
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._read_key())
        fetching = self._fetching
        try:
            key = await asyncio.shield(fetching)
        finally:
            if self._fetching is fetching and fetching.done():
                self._fetching = None
        if not self.head:
            self.head = b"Host: %s\r\nAuthorization: Bearer %s" % (self.host_header, key.encode())

    async def _read_key(self) -> str:
        where = f"the engine at {self.host}:{self.port}"
        if self.keys is None:
            raise NoKey(f"this gateway cannot read engine keys: nothing sent to {where}")
        try:
            key = await asyncio.wait_for(self.keys.engine_key(self.key_name), self.key_timeout)
        except asyncio.TimeoutError:
            raise NoKey(
                f"the key of {where} ({self.key_name}) did not come from the engine keys bucket within {self.key_timeout:g}s: "
                "nothing sent to it"
            ) from None
        except Exception as e:
            raise NoKey(f"the key of {where} ({self.key_name}) cannot be read from the engine keys bucket ({e}): nothing sent to it") from None
        if not key:
            raise NoKey(f"the engine keys bucket has no key {self.key_name} for {where}: nothing sent to it")
        return key

    async def _verify(self, conn: Connection) -> None:
        """Ask the engine on `conn` its models; NotTheEngine unless it lists the identity."""
        where = f"the engine at {self.host}:{self.port}"
        probe = _Probe(asyncio.get_running_loop().create_future())
        conn.send(b"GET /v1/models HTTP/1.1\r\n%s\r\nAccept: application/json\r\n\r\n" % self.head, probe)
        try:
            status, body = await asyncio.wait_for(probe.done, self.verify_timeout)
        except asyncio.TimeoutError:
            conn.abort()
            raise NotTheEngine(f"{where} did not answer GET /v1/models within {self.verify_timeout:g}s: cannot tell it is {self.identity}") from None
        except Lost as e:
            conn.abort()
            raise NotTheEngine(f"{where} was asked GET /v1/models and {e}: cannot tell it is {self.identity}") from None
        why = identity_mismatch(status, body, self.identity)
        if why:
            conn.abort()
            if status == 401 and self.key_name:
                self.head = b""  # read again next time, in case it was not the engine's
                why += " (refused the engine's key)"
            raise NotTheEngine(f"{where} is not the engine started for this replica: {why}")
        if conn.closed:
            raise NotTheEngine(f"{where} closed the connection after GET /v1/models (an engine must keep connections alive)")
        if self.tools is None:
            # Other engines refuse tools they cannot serve themselves: taken as they say.
            self.tools = await self._props(conn) if _LLAMACPP.search(body) else True
        # Verified only now: a verified connection goes back to the pool when an
        # answer on it completes, and /props's answer would have put it there
        # while connect() also hands it to a request. Two concurrent requests
        # to one replica then shared it, and one never had its answer (seen
        # once routing sent identical prompts to the replica they were warm on).
        conn.verified = True

    async def _props(self, conn: Connection) -> bool:
        """llama.cpp's /props on a verified connection: whether its template
        takes tools (True where it cannot be told: refused only on its word)."""
        probe = _Probe(asyncio.get_running_loop().create_future())
        conn.send(b"GET /props HTTP/1.1\r\n%s\r\nAccept: application/json\r\n\r\n" % self.head, probe)
        try:
            status, body = await asyncio.wait_for(probe.done, self.verify_timeout)
            caps = json.loads(body).get("chat_template_caps") if status == 200 else None
        except (asyncio.TimeoutError, Lost, ValueError, AttributeError):
            caps = None
        if conn.closed:
            raise NotTheEngine(f"the engine at {self.host}:{self.port} closed the connection after GET /props")
        return caps.get("supports_tools") is not False if isinstance(caps, dict) else True

    async def probe(self) -> None:
        """A verified connection made now (and kept idle): what its engine serves is then known."""
        try:
            conn = await self.connect()
        except (OSError, asyncio.TimeoutError, NotTheEngine, NoKey):
            return  # the attempt meets it again, and says so
        if conn.closed:
            return
        self.release(conn)

    def release(self, conn: Connection) -> None:
        if self.closed or len(self.idle) >= MAX_IDLE:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.open -= 1

    def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            conn.abort()
        self.idle.clear()
