"""The gateway's edge against one client (issue 35, finding 7), each attack
tried over a real `llmgw gateway` process on a real nats-server with JWT auth
(as `llmgw up` runs them), and seen refused or contained while another client
is still served:

- JSON nested 1,000 deep raised a RecursionError nothing caught: never
  answered, the connection never freed; 4,100 such requests from one key left
  every client with 503.
- One client's 4,300 idle connections took every slot.
- 500 wrong API keys at 8,590/s never met a 429.
- (and no request was bounded in time while it was handled)

Clients come from different loopback addresses (127.0.0.2, 127.0.0.3: the
gateway counts per address). Bounded: tens to a few hundred connections,
each test a few seconds; ports free, loopback only; the processes started
are stopped by the `processes` fixture.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from llmgw.bus.server import free_port

from .fake_openai import FakeEngine
from .gateway_harness import Log, spec

pytestmark = [pytest.mark.nats, pytest.mark.timeout(90)]

KEY = "sk-team-0123456789abcdef"
ONE, OTHER = "127.0.0.2", "127.0.0.3"  # two clients, by address
CHAT = [{"role": "user", "content": "hi"}]


class Edge:
    """A real gateway process, its log written by the test, stand-in engines in the test's loop."""

    def __init__(self, bus, url: str, processes) -> None:
        self.bus = bus
        self.url = url
        self.processes = processes
        self.log = Log(bus)
        self.engines: list[FakeEngine] = []
        self.port = 0
        self.metrics_port = 0

    async def model(self, name: str, **engine) -> None:
        e = await FakeEngine(name, **engine).start()
        self.engines.append(e)
        await self.log.model(spec(name))
        await self.log.replica(spec(name), e.endpoint)

    async def start(self, *flags: str) -> None:
        """The gateway, once the log says everything (it folds the log before it listens)."""
        self.port, self.metrics_port = free_port(), free_port()
        gw = self.processes.start(
            "gateway", "gateway", "--nats", self.url, "--port", str(self.port), "--name", "edge",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *flags,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert gw.poll() is None and time.monotonic() < deadline, self.processes.log("gateway")
            await asyncio.sleep(0.1)

    async def connect(self, source: str = ONE):
        return await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))

    async def exchange(self, request: bytes, source: str = ONE, limit: float = 10) -> tuple[int, dict, bytes]:
        reader, writer = await self.connect(source)
        try:
            writer.write(request)
            return await answer_of(reader, limit)
        finally:
            writer.close()

    async def chat(self, payload: dict | bytes, key: str = KEY, source: str = ONE, limit: float = 10) -> tuple[int, dict, bytes]:
        return await self.exchange(post(payload, key), source, limit)

    async def refused(self, why: str) -> float:
        """llmgw_gateway_edge_refused_total{why} from the --metrics-listen address."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.metrics_port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        _, _, body = await answer_of(reader)
        writer.close()
        for line in body.decode().splitlines():
            if line.startswith(f'llmgw_gateway_edge_refused_total{{why="{why}"}}'):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture
async def edge(nats_server, processes):
    from llmgw.bus.nats import NatsBus

    bus = await NatsBus.connect(nats_server.url)
    await bus.ensure_streams()
    e = Edge(bus, nats_server.url, processes)
    await e.log.key("team", "", KEY)
    try:
        yield e
    finally:
        for engine in e.engines:
            await engine.stop()
        await bus.close()


def post(payload: dict | bytes, key: str = KEY, keep_alive: bool = False) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (key.encode(), len(body), b"" if keep_alive else b"Connection: close\r\n", body)
    )


async def answer_of(reader: asyncio.StreamReader, limit: float = 10) -> tuple[int, dict, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limit)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), limit)
    return int(lines[0].split()[1]), headers, body


def an_error(body: bytes, code: str | None, type_: str = "invalid_request_error") -> dict:
    """OpenAI's error shape, exactly."""
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["type"] == type_, err
    return err


def deep(levels: int) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * levels + b"]" * levels + b"}"


# --------------------------------------------------------------------------- JSON


async def test_json_nested_1000_deep_is_answered_400_at_once_and_every_parse_error_is_400(edge):
    await edge.model("m")
    await edge.start("--max-json-depth", "64")
    started = time.monotonic()
    status, _, body = await edge.chat(deep(1000))
    assert status == 400 and "64" in an_error(body, "json_too_deep")["message"]
    assert time.monotonic() - started < 5
    # Brackets inside strings are text, not depth: a prompt full of them is served.
    assert (await edge.chat({"model": "m", "messages": [{"role": "user", "content": "[" * 500 + "{" * 500}]}))[0] == 200
    assert b"json_too_deep" not in (await edge.chat(deep(60)))[2]  # within the limit: passed on
    # Every other parse error: 400 in OpenAI's shape, never a hang or a 500.
    for bad in (b"{", b"[1, 2]", b'"text"', b'{"model": 5}', b'{"model": "m", "stream": "yes"}', b"\xff\xfe", deep(65)):
        status, _, body = await edge.chat(bad)
        assert status == 400, (bad, status, body)
        an_error(body, json.loads(body)["error"]["code"])
    # The gateway still serves.
    status, _, body = await edge.chat({"model": "m", "messages": CHAT}, source=OTHER)
    assert status == 200 and json.loads(body)["choices"]
    assert await edge.refused("max_json_depth") >= 2


async def test_many_deep_requests_from_one_client_lock_no_other_client(edge):
    await edge.model("m")
    await edge.start("--max-connections", "200", "--max-connections-per-client", "50")
    answers: list[int] = []
    held = []

    async def attacker() -> None:
        try:
            reader, writer = await edge.connect(ONE)
        except OSError:
            answers.append(0)
            return
        held.append(writer)  # kept open after its answer, as the attack's were
        try:
            writer.write(post(deep(1000), keep_alive=True))
            answers.append((await answer_of(reader))[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            answers.append(0)  # past the client's cap by more than an eighth: closed unanswered

    await asyncio.gather(*(attacker() for _ in range(300)))
    # Each answered (400) or refused as past its client's cap (429, or closed): none left hanging.
    assert len(answers) == 300 and set(answers) <= {400, 429, 0} and answers.count(400) >= 40, sorted(set(answers))
    # With the attacker's connections still open, another client is served.
    status, _, body = await edge.chat({"model": "m", "messages": CHAT}, source=OTHER)
    assert status == 200 and json.loads(body)["choices"]
    for w in held:
        w.close()


# --------------------------------------------------------------------------- connections


async def test_a_client_past_its_connection_cap_is_refused_while_another_is_served(edge):
    await edge.model("m")
    await edge.start("--max-connections-per-client", "10")
    held = [await edge.connect(ONE) for _ in range(10)]
    reader, writer = await edge.connect(ONE)
    status, headers, body = await answer_of(reader)
    assert status == 429 and headers["retry-after"] == "1" and headers["connection"] == "close"
    an_error(body, "too_many_connections", "rate_limit_error")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # and closed
    writer.close()
    # Another client is served, as is each of the first one's held connections.
    assert (await edge.chat({"model": "m", "messages": CHAT}, source=OTHER))[0] == 200
    r, w = held[0]
    w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await answer_of(r))[0] == 200
    # Once it lets one go, it may open another.
    for r, w in held:
        w.close()
    deadline = time.monotonic() + 10
    while True:
        status, _, _ = await edge.exchange(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", ONE)
        if status == 200:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert await edge.refused("max_connections_per_client") >= 1


# --------------------------------------------------------------------------- keys


async def test_wrong_keys_from_one_address_meet_429_while_a_right_key_elsewhere_works(edge):
    await edge.model("m")
    await edge.start("--max-key-failures", "5", "--key-failure-window", "60")
    payload = {"model": "m", "messages": CHAT}
    got = [(await edge.chat(payload, key=f"sk-guess-{i:04d}", source=ONE))[0] for i in range(100)]
    assert got[:5] == [401] * 5 and got[5:] == [429] * 95, got
    status, headers, body = await edge.chat(payload, key="sk-guess-x", source=ONE)
    assert status == 429 and 1 <= int(headers["retry-after"]) <= 12
    an_error(body, "too_many_key_failures", "rate_limit_error")
    # Throttled, the address's key is not even looked up: the right one is refused from there too.
    assert (await edge.chat(payload, key=KEY, source=ONE))[0] == 429
    # A right key from another address works; so does a wrong one there, answered 401.
    status, _, body = await edge.chat(payload, key=KEY, source=OTHER)
    assert status == 200 and json.loads(body)["choices"]
    assert (await edge.chat(payload, key="sk-guess-y", source=OTHER))[0] == 401
    assert await edge.refused("max_key_failures") >= 96


# --------------------------------------------------------------------------- time


async def test_a_request_past_request_timeout_gets_504_and_a_stream_an_error_event(edge):
    await edge.model("m")
    await edge.model("slow", delay=5.0)  # answers after 5 s
    await edge.model("dribble", chunks=100, delay=0.1)  # streams for 10 s
    await edge.start("--request-timeout", "1")
    started = time.monotonic()
    status, headers, body = await edge.chat({"model": "slow", "messages": CHAT}, limit=10)
    assert status == 504 and headers["connection"] == "close"
    assert "1s" in an_error(body, "request_timeout", "server_error")["message"]
    assert time.monotonic() - started < 4
    # A stream already under way ends with an error event, properly framed, and the connection is closed.
    reader, writer = await edge.connect(ONE)
    writer.write(post({"model": "dribble", "messages": CHAT, "stream": True}, keep_alive=True))
    data = await asyncio.wait_for(reader.read(), 10)  # to the close
    writer.close()
    assert data.startswith(b"HTTP/1.1 200 ") and b"data: " in data
    assert b'"code":"request_timeout"' in data and data.endswith(b"0\r\n\r\n"), repr(data[-120:])
    # A request within the deadline is served.
    assert (await edge.chat({"model": "m", "messages": CHAT}, source=OTHER))[0] == 200
    assert await edge.refused("request_timeout") >= 2
