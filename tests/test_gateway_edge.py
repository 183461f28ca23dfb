"""The gateway's HTTP edge: a test per limit (config.py), each over a real
loopback socket, as an attacker would send it (raw sockets) or as a client
would (the official openai SDK); the listen address and /metrics.

Small and bounded: megabytes, not the benchmark's sizes; 200 slow
connections, not 2,000 (benchmarks/edge.py has those figures). No timing is
asserted: a timeout's test waits (bounded) for the cut, whenever it comes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from llmgw.bus.server import free_port
from llmgw.gateway.config import GatewayConfig, add_arguments, from_args

from .test_gateway_server import CHAT, Setup, setup, spec  # noqa: F401 (setup: the fixture)

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(60)

KEY = "sk-team-0123456789abcdef"


async def served(setup: Setup, **config) -> None:
    """A gateway with these limits and model `m` on a stand-in engine."""
    e = await setup.engine("a")
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), e.endpoint)
    await setup.gateway(**config)


async def answer_of(reader: asyncio.StreamReader, limit: float = 20) -> tuple[int, dict, bytes]:
    """One answer read off a raw connection: (status, headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limit)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), limit)
    return int(lines[0].split()[1]), headers, body


async def closed(reader: asyncio.StreamReader, limit: float = 20) -> bool:
    """Whether the gateway closes the connection (EOF or a reset) within `limit`, sending nothing more."""
    try:
        return await asyncio.wait_for(reader.read(1), limit) == b""
    except ConnectionResetError:
        return True


def an_error(body: bytes, code: str) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


async def connect(setup: Setup, port: int | None = None):
    return await asyncio.open_connection(setup.gw.listening_on, port or setup.gw.port)


# --------------------------------------------------------------------------- sizes


async def test_a_url_past_max_request_line_is_414_not_echoed_and_the_connection_closed(setup):
    await served(setup, max_request_line=4096)
    reader, writer = await connect(setup)
    sender = asyncio.get_running_loop().create_task(_send(writer, [b"GET /" + b"a" * (1 << 20)] * 4))  # 4 MB, no end of line
    status, headers, body = await answer_of(reader)
    assert status == 414 and headers["connection"] == "close"
    assert "4096" in an_error(body, "url_too_long")["message"] and len(body) < 512
    assert await closed(reader)
    sender.cancel()
    writer.close()
    # A URL within the limit is served; an unknown path's 404 does not echo it whole.
    reader, writer = await connect(setup)
    writer.write(b"GET /" + b"b" * 4000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await answer_of(reader)
    assert status == 404 and len(body) < 512 and "/" + "b" * 99 + "…" in json.loads(body)["error"]["message"]
    writer.close()


async def test_headers_past_max_header_bytes_are_431(setup):
    await served(setup, max_header_bytes=16384)
    reader, writer = await connect(setup)
    sender = asyncio.get_running_loop().create_task(
        _send(writer, [b"GET /health HTTP/1.1\r\nHost: x\r\n"] + [b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(1000)])
    )  # 1 MB of headers
    status, _, body = await answer_of(reader)
    assert status == 431 and "16384" in an_error(body, "headers_too_large")["message"]
    assert await closed(reader)
    sender.cancel()
    writer.close()
    # The same limit on a kept-alive connection's second request.
    reader, writer = await connect(setup)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await answer_of(reader))[0] == 200
    sender = asyncio.get_running_loop().create_task(_send(writer, [b"GET /health HTTP/1.1\r\n"] + [b"X-Pad: %s\r\n" % (b"q" * 4000)] * 10))
    assert (await answer_of(reader))[0] == 431
    sender.cancel()
    writer.close()
    # Within it: served.
    status, _, _ = await setup.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 8000 + b"\r\nConnection: close\r\n\r\n")
    assert status == 200


async def _send(writer: asyncio.StreamWriter, pieces: list[bytes]) -> None:
    try:
        for p in pieces:
            writer.write(p)
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # cut off: what the test is about


async def test_a_body_past_max_body_is_413_before_any_of_it_is_read(setup):
    await served(setup, max_body=65536)
    # Content-Length says too much: answered from the head alone (no byte of the body is sent).
    for expect in (b"", b"Expect: 100-continue\r\n"):
        reader, writer = await connect(setup)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: 52428800\r\n\r\n" % expect)
        status, _, body = await answer_of(reader)  # never a 100 Continue first
        assert status == 413 and "52428800" in an_error(body, "request_too_large")["message"]
        assert await closed(reader)
        writer.close()
    # The openai SDK sending a body past it reads the 413 (not a reset): what it sends is read and dropped.
    client = setup.client()
    with pytest.raises(openai.APIStatusError) as e:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 200_000}])
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"
    # Within it: served.
    assert (await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 30_000}])).choices


async def test_a_chunked_body_is_counted_as_it_arrives(setup):
    await served(setup, max_body=65536)
    reader, writer = await connect(setup)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(17):  # 68 KiB in chunks of 4 KiB, and no last chunk: the 413 comes on the way
        writer.write(b"1000\r\n" + b"x" * 4096 + b"\r\n")
    status, _, body = await answer_of(reader)
    assert status == 413 and an_error(body, "request_too_large")
    assert await closed(reader)
    writer.close()
    # A chunked body within the limit is served.
    payload = json.dumps({"model": "m", "messages": CHAT}).encode()
    reader, writer = await connect(setup)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    )
    assert (await answer_of(reader))[0] == 200
    writer.close()


async def test_a_pipelined_request_past_a_limit_is_refused_after_the_answers_owed_before_it(setup):
    e = await setup.engine("slow", delay=0.3)
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), e.endpoint)
    await setup.gateway(max_body=65536)
    ok = json.dumps({"model": "m", "messages": CHAT}).encode()
    reader, writer = await connect(setup)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)
        + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 52428800\r\n\r\n"
    )
    assert [(await answer_of(reader))[0] for _ in range(3)] == [200, 200, 413]
    assert await closed(reader)
    writer.close()


# --------------------------------------------------------------------------- time


async def test_a_slow_head_is_cut_by_header_timeout_on_a_new_and_a_kept_alive_connection(setup):
    await served(setup, header_timeout=0.5)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 1000

    async def trickle(writer) -> None:
        try:
            for b in head:
                writer.write(bytes([b]))
                await asyncio.sleep(0.05)
        except (ConnectionError, OSError):
            pass

    for kept_alive in (False, True):
        reader, writer = await connect(setup)
        if kept_alive:  # one request at once, then the next one's head a byte at a time
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer_of(reader))[0] == 200
        slow = asyncio.get_running_loop().create_task(trickle(writer))
        status, headers, body = await answer_of(reader)
        assert status == 408 and headers["connection"] == "close" and an_error(body, "request_timeout")
        assert await closed(reader)
        assert not slow.done()  # cut before it had sent its head
        slow.cancel()
        writer.close()
    # A connection that sends nothing at all is cut too: closed without an answer it did not ask for.
    reader, writer = await connect(setup)
    assert await closed(reader)
    writer.close()


async def test_a_slow_body_is_cut_by_body_timeout(setup):
    await served(setup, body_timeout=0.5)
    reader, writer = await connect(setup)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    status, _, body = await answer_of(reader)
    assert status == 408 and "body" in an_error(body, "request_timeout")["message"]
    writer.close()


async def test_an_idle_kept_alive_connection_is_closed_after_keepalive_timeout(setup):
    await served(setup, keepalive_timeout=0.3)
    reader, writer = await connect(setup)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await answer_of(reader))[0] == 200
    assert await closed(reader)  # nothing sent: closed without an answer
    writer.close()
    # The openai SDK's pool reconnects: requests a while apart are all answered.
    client = setup.client()
    for _ in range(2):
        assert (await client.chat.completions.create(model="m", messages=CHAT)).choices
        await asyncio.sleep(0.6)
    assert (await client.chat.completions.create(model="m", messages=CHAT)).choices


# --------------------------------------------------------------------------- connections


async def test_connections_past_max_connections_are_answered_503_and_closed(setup):
    await served(setup, max_connections=10)
    held = [await connect(setup) for _ in range(10)]
    while len(setup.gw.clients) < 10:
        await asyncio.sleep(0.01)
    reader, writer = await connect(setup)
    status, headers, body = await answer_of(reader)
    assert status == 503 and headers["retry-after"] == "1" and an_error(body, "too_many_connections")
    assert await closed(reader)
    writer.close()
    # The held ones still serve; once one is let go, a new connection is served.
    r, w = held[0]
    w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await answer_of(r))[0] == 200
    for r, w in held:
        w.close()
    while len(setup.gw.clients) > 0:
        await asyncio.sleep(0.01)
    assert (await setup.client().chat.completions.create(model="m", messages=CHAT)).choices


async def test_200_slow_clients_are_held_at_most_to_the_cap_and_all_cut(setup):
    await served(setup, max_connections=100, header_timeout=2.0)
    loop = asyncio.get_running_loop()
    answers: list[int] = []

    async def slowloris() -> None:
        slow = writer = None
        try:
            reader, writer = await connect(setup)
            slow = loop.create_task(_trickle(writer, b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 200))
            answers.append((await answer_of(reader))[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            answers.append(0)  # past the cap by more than an eighth: closed at once, unanswered
        finally:
            if slow is not None:
                slow.cancel()
            if writer is not None:
                writer.close()

    clients = [loop.create_task(slowloris()) for _ in range(200)]
    most = 0
    while not all(c.done() for c in clients):
        most = max(most, len(setup.gw.clients))
        await asyncio.sleep(0.02)
    for c in clients:
        c.result()
    # None past the cap at once (a refused one lingers: at most an eighth more); every one cut:
    # 408 (held, too slow), 503 (past the cap), or closed unanswered (past it by more than an eighth).
    assert most <= 100 + 16 and len(answers) == 200 and set(answers) <= {0, 408, 503}
    assert answers.count(408) >= 100 and answers.count(503) > 0  # the cap filled first, then refusals
    while setup.gw.clients:
        await asyncio.sleep(0.02)
    assert (await setup.client().chat.completions.create(model="m", messages=CHAT)).choices


async def _trickle(writer, data: bytes) -> None:
    try:
        for i in range(0, len(data)):
            writer.write(data[i : i + 1])
            await asyncio.sleep(0.1)
    except (ConnectionError, OSError):
        pass


# --------------------------------------------------------------------------- where


async def test_the_listen_address_is_the_flags_and_never_follows_the_catalog(setup):
    await served(setup, listen="127.0.0.2")
    server = setup.gw.server
    await setup.log.key("team", "org/team", KEY)  # keys defined: nothing moves
    await setup.settle()
    await asyncio.sleep(0.2)
    assert setup.gw.server is server and server.sockets[0].getsockname()[0] == "127.0.0.2"
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", setup.gw.port)
    assert (await setup.client(KEY).chat.completions.create(model="m", messages=CHAT)).choices


async def test_metrics_need_a_key_once_keys_exist_and_show_only_its_models(setup):
    e = await setup.engine("a")
    for name, owner in (("ours", "org/team"), ("theirs", "org/other")):
        await setup.log.model(spec(name, owner=owner))
        await setup.log.replica(spec(name, owner=owner), e.endpoint)
    await setup.gateway()
    await setup.log.key("team", "org/team", KEY)
    await setup.log.key("other", "org/other", "sk-other-0123456789abcdef")
    await setup.settle()
    for key, model in ((KEY, "ours"), ("sk-other-0123456789abcdef", "theirs")):
        await setup.client(key).chat.completions.create(model=model, messages=CHAT)
    status, _, body = await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 401 and an_error(body, "invalid_api_key")
    status, _, body = await setup.raw(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % KEY.encode())
    text = body.decode()
    assert status == 200 and 'model="ours"' in text and "theirs" not in text
    assert "llmgw_gateway_connections" not in text  # the whole gateway's figures: the operator's


async def test_metrics_listen_serves_every_models_metrics_on_an_address_of_its_own(setup):
    port = free_port()
    await served(setup, metrics_listen=f"127.0.0.1:{port}")
    await setup.log.key("team", "", KEY)
    await setup.settle()
    await setup.client(KEY).chat.completions.create(model="m", messages=CHAT)
    reader, writer = await connect(setup, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await answer_of(reader)
    assert status == 200 and 'model="m"' in body.decode() and "llmgw_gateway_connections " in body.decode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert (await answer_of(reader))[0] == 404  # the metrics address serves nothing else
    writer.close()
    status, _, _ = await setup.raw(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % KEY.encode())
    assert status == 404  # and the API port no /metrics


def test_every_limit_is_a_flag_with_its_default():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert from_args(p.parse_args([])) == GatewayConfig()
    got = from_args(p.parse_args(["--listen", "0.0.0.0", "--max-body", "1024", "--header-timeout", "2.5", "--metrics-listen", "127.0.0.1:9100"]))
    assert (got.listen, got.max_body, got.header_timeout, got.metrics_address) == ("0.0.0.0", 1024, 2.5, ("127.0.0.1", 9100))
    for bad in ({"max_body": -1}, {"header_timeout": 0}, {"metrics_listen": "9100"}):
        with pytest.raises(ValueError):
            GatewayConfig(**bad)


# --------------------------------------------------------------------------- a real process


def _rss_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


@pytest.mark.nats
def test_a_64_mb_url_does_not_grow_the_gateway_process(nats_server, processes):
    from llmgw.bus.nats import NatsBus

    async def streams() -> None:
        bus = await NatsBus.connect(nats_server.url)
        await bus.ensure_streams()
        await bus.close()

    asyncio.run(streams())
    port = free_port()
    gw = processes.start("gateway", "gateway", "--nats", nats_server.url, "--port", str(port), "--name", "edge")
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert gw.poll() is None and time.monotonic() < deadline, processes.log("gateway")
        time.sleep(0.1)
    before = _rss_kib(gw.pid, "VmRSS")
    s = socket.create_connection(("127.0.0.1", port))

    def send() -> None:
        try:
            s.sendall(b"GET /" + b"a" * (64 << 20))
        except OSError:
            pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    s.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got:
        piece = s.recv(65536)
        assert piece, got
        got += piece
    assert got.startswith(b"HTTP/1.1 414 ")
    t.join(30)
    s.close()
    peak = _rss_kib(gw.pid, "VmHWM")
    print("rss before, peak (KiB):", before, peak)
    assert peak - before < 16 * 1024, (before, peak)  # not the URL's 64 MB (nor twice that, echoed)


# --------------------------------------------------------------------------- against one client (edge_limits.py)


def test_json_depth_counts_structure_not_text():
    from llmgw.gateway.edge_limits import nests_deeper

    def nested(n: int) -> bytes:
        return b'{"a": ' + b"[" * n + b"]" * n + b"}"

    assert not nests_deeper(nested(63), 64) and nests_deeper(nested(64), 64) and nests_deeper(nested(100_000), 64)
    shallow = b'{"a": [{"b": [1, {"c": 2}]}], "d": [[], {}]}' * 40  # 5 deep, 320 brackets
    assert not nests_deeper(shallow, 5) and nests_deeper(shallow, 4)
    text = json.dumps({"messages": [{"content": "[" * 500 + '\\" {' * 100 + "\\\\"}]}).encode()
    assert not nests_deeper(text, 4)  # brackets, escaped quotes and backslashes in strings are text
    assert nests_deeper(b"[" * 70, 64)  # brackets that do not match: not JSON either


def test_json_depth_agrees_with_the_decoded_documents_depth():
    import random

    from llmgw.gateway.edge_limits import nests_deeper

    rng = random.Random(35)

    def document(levels: int):
        if levels == 0 or rng.random() < 0.2:
            return "".join(rng.choice('[]{}"\\ a,:') for _ in range(rng.randrange(6)))  # text that looks like structure
        if rng.random() < 0.5:
            return [document(levels - 1) for _ in range(rng.randrange(4))]
        return {f"k{i}[": document(levels - 1) for i in range(rng.randrange(4))}

    def depth(o) -> int:
        children = o if isinstance(o, list) else list(o.values()) if isinstance(o, dict) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)

    for _ in range(400):
        o = document(rng.randrange(1, 10))
        text = json.dumps(o, separators=rng.choice(((",", ":"), (", ", ": ")))).encode()
        for limit in range(1, 10):
            assert nests_deeper(text, limit) == (depth(o) > limit), (text, limit, depth(o))


def test_a_client_is_its_address_and_an_ipv6_one_its_64():
    from llmgw.gateway.edge_limits import KeyFailures, client_of

    assert client_of("10.0.0.7") == "10.0.0.7" and client_of("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_of("2001:db8:1:2:aaaa::1") == client_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::1") != client_of("2001:db8:1:2::1")
    # Wrong keys: a burst of `allowed`, then one every window/allowed; a full bucket is forgotten.
    k = KeyFailures(3, 60.0)
    for _ in range(3):
        assert k.wait("a", 0.0) == 0
        k.failed("a", 0.0)
    assert k.wait("a", 0.0) == pytest.approx(20.0) and k.wait("b", 0.0) == 0 and k.wait("a", 20.0) == 0
    k.sweep(60.0)
    assert k.levels == {}


async def test_an_error_in_handling_is_answered_500_in_openais_shape_and_logged_once(setup, monkeypatch, caplog):
    from llmgw.gateway import api

    await served(setup)

    def broken(body: bytes):
        raise KeyError("a bug")

    monkeypatch.setattr(api, "request_head", broken)  # a fault injected where a bug would be
    reader, writer = await connect(setup)
    for _ in range(3):  # on one kept-alive connection: each answered, the connection still serves
        payload = json.dumps({"model": "m", "messages": CHAT}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        status, _, body = await answer_of(reader)
        assert status == 500 and an_error(body, "internal_error")["type"] == "server_error"
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await answer_of(reader))[0] == 200
    writer.close()
    assert sum("logged once" in r.getMessage() for r in caplog.records) == 1
    assert setup.gw.metrics.refused["internal_error"] == 3


def test_the_limits_against_one_client_are_flags():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    got = from_args(p.parse_args(["--max-connections-per-client", "8", "--max-json-depth", "16", "--request-timeout", "30",
                                  "--max-key-failures", "0", "--key-failure-window", "10"]))  # fmt: skip
    assert (got.max_connections_per_client, got.max_json_depth, got.request_timeout, got.max_key_failures, got.key_failure_window) == (
        8, 16, 30.0, 0, 10.0,
    )
    d = GatewayConfig()
    assert (d.max_connections_per_client, d.max_json_depth, d.request_timeout, d.max_key_failures) == (256, 64, 3600.0, 20)
    for bad in ({"max_json_depth": 0}, {"max_connections_per_client": 0}, {"request_timeout": 0}):
        with pytest.raises(ValueError):
            GatewayConfig(**bad)
