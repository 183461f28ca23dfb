"""What the gateway adds: latency and throughput through `llmgw gateway`
against straight to the same upstream, side by side in one run.

    python benchmarks/gateway.py [--seconds S] [--rate R] [--connections C] [--json FILE] [--auth] [--prefixes N]

With --auth the nats-server runs as `llmgw up` runs it (bus/auth.py) and the
gateway connects with a gateway's credential.

The upstream is fast so that what is measured is the gateway: nginx (Debian's,
`apt-get install nginx-light`) answering every POST with one fixed chat
completion; without nginx, a small uvloop server of this file does. Streams
come from this file's streaming server: `--chunks` SSE events per answer,
each written on its own.

The gateway is the real one, a process of its own (`llmgw gateway`) on a real
nats-server, its routing table folded from a log that says one replica of
model `bench` is ready at the upstream (no control plane or agent needed),
with the identity an agent gives its engine: the upstreams list it in
GET /v1/models, and the gateway verifies each new connection with it. Each
upstream asks for an engine key, as an agent's engines do (401 without
it); the log's writer puts it in the engine keys bucket, where the gateway
reads it. The direct path sends the key too.

Measured, each straight to the upstream and then through the gateway:

    at R requests/s     an open-loop client (requests sent on a fixed schedule,
                        latency counted from when each was due, so a stall is
                        not hidden): p50, p99, max; the added latency is the
                        difference of the two
    at saturation       wrk (Debian's `wrk`) with C connections for S seconds:
                        requests/s; without wrk, a closed-loop client of this
                        file (itself then part of what limits)
    streaming           8 streams at a time of `--chunks` events: events/s

And what the translated APIs add (issue 31: /v1/responses and Anthropic's
/v1/messages, translated onto the engine's chat completions in the gateway):
the same fixed-rate rounds on each, beside the gateway's own chat path, the
added latency over the engine's chat API (direct) and over the gateway's chat
path; a stored response (`store`: a put into NATS KV, under way as the
answer's last byte leaves: its cost is the gateway's and the server's CPU,
not a wait) on its own row; each translated stream's events/s.
Before anything is measured, --prefixes unique prompts (100,000 by default)
go through the gateway, so that its prefix index (gateway/prefix.py) holds
that many when the figures are taken (its size is read from /metrics,
llmgw_gateway_prefix_index_blocks): the routing of a model's `routing:
prefix` (the default) costs what it costs with a full index.

Everything shares this machine's cores: the client, the upstream and the
gateway. The gateway is one process (one core at most).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import httptools  # noqa: E402

from llmgw.bus.server import free_port  # noqa: E402

MODEL = "bench"
STREAM_MODEL = "bench-stream"
REQUEST = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one word."}], "max_tokens": 8, "temperature": 0}
).encode()
ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 14, "completion_tokens": 3, "total_tokens": 17},
    }
).encode()  # fmt: skip


def identity(model: str) -> str:
    return f"{model}@{model}-1.0/bench"


# What the upstreams answer to GET /v1/models (both models: one list for either server).
MODELS = json.dumps(
    {"object": "list", "data": [{"id": m, "object": "model", "aliases": [m, identity(m)]} for m in (MODEL, STREAM_MODEL)]}
).encode()


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


# --------------------------------------------------------------------------- upstreams


KEY = os.environ.get("LLMGW_BENCH_KEY") or "bench-" + os.urandom(16).hex()  # the upstreams' engine key (the environment: not in ps)


def start_nginx(port: int, work: Path) -> subprocess.Popen:
    body = ANSWER.decode().replace("\\", "\\\\").replace("'", "\\'")
    models = MODELS.decode().replace("\\", "\\\\").replace("'", "\\'")
    conf = work / "nginx.conf"
    conf.write_text(
        f"""worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx.err warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 300;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi;
  uwsgi_temp_path {work}/uwsgi;
  scgi_temp_path {work}/scgi;
  server {{
    listen 127.0.0.1:{port};
    if ($http_authorization != "Bearer {KEY}") {{ return 401; }}
    location / {{ default_type application/json; return 200 '{body}'; }}
    location = /v1/models {{ default_type application/json; return 200 '{models}'; }}
  }}
}}
"""
    )
    return subprocess.Popen(["nginx", "-c", str(conf), "-e", str(work / "nginx.err")], start_new_session=True)


class UpstreamProtocol(asyncio.Protocol):
    """The fallback fixed-answer upstream, and the streaming one."""

    def __init__(self, chunks: int, key: bytes) -> None:
        self.chunks = chunks
        self.parser = httptools.HttpRequestParser(self)
        self.body = b""
        self.url = b""
        self.want = b"Bearer " + key
        self.auth = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.auth = value

    def on_url(self, url: bytes) -> None:
        self.url = url

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        body, self.body = self.body, b""
        auth, self.auth = self.auth, b""
        if auth != self.want:
            self.transport.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        elif self.url == b"/v1/models":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
        elif b'"stream":true' in body.replace(b" ", b""):
            asyncio.get_running_loop().create_task(self.stream())
        else:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))

    async def stream(self) -> None:
        t = self.transport
        t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(self.chunks):
            event = b'data: {"id":"s","object":"chat.completion.chunk","model":"bench-stream","choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n' % i
            t.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(0)
            if t.is_closing():
                return
        done = b"data: [DONE]\n\n"
        t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def serve(port: int, chunks: int, key: str) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: UpstreamProtocol(chunks, key.encode()), "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    uvloop.run(main())


# --------------------------------------------------------------------------- the fleet: a log and a gateway


async def write_log(url: str, endpoints: dict[str, str], creds: str | None = None, limits: bool = False) -> None:
    from llmgw.bus import engine_key_name
    from llmgw.bus.nats import NatsBus
    from llmgw.core.contract import events as ev
    from llmgw.core.contract.catalog import fingerprint

    bus = await NatsBus.connect(url, creds=creds)
    await bus.ensure_streams()
    now = time.time()
    n = 0

    async def publish(event) -> int:
        nonlocal n
        n += 1
        return await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"bench-{n}")

    await publish(ev.NodeRegistered(at=now, node="bench", gpus=[]))
    for i, (model, endpoint) in enumerate(endpoints.items()):
        profile = ev.ProfileSpec(name="p", gpus=0)
        await publish(ev.ModelApplied(at=now, model=ev.ModelSpec(name=model, profiles=[profile])))
        rid = f"{model}-1"
        seq = await publish(
            ev.Decided(at=now, basis=0, actions=[ev.PlaceReplica(
                replica=rid, model=model, profile="p", fingerprint=fingerprint(profile), reason="benchmark",
                shards=[ev.ShardPlacement(shard=f"{rid}.0", node="bench", rank=0, gpus=[], port=40000 + i)],
            )])
        )  # fmt: skip
        await bus.put_engine_key(engine_key_name("bench", f"{rid}.0", seq), KEY)
        for st in ("starting", "loading", "ready"):
            await publish(ev.ShardStatus(at=now, node="bench", replica=rid, shard=f"{rid}.0", generation=seq, state=st,
                                         endpoint=endpoint if st == "ready" else "",
                                         identity=identity(model) if st == "ready" else ""))  # fmt: skip
    if limits:  # the client's bearer is an API key with every limit (never reached), its owner's too
        import hashlib

        big = 10**12
        await publish(ev.OwnerApplied(at=now, name="bench", requests_per_minute=big, tokens_per_minute=big, tokens_per_day=big))
        await publish(ev.ApiKeyApplied(
            at=now, name="bench", owner="bench", key_sha256=hashlib.sha256(KEY.encode()).hexdigest(),
            requests_per_minute=big, tokens_per_minute=big, tokens_per_day=big, tokens_per_month=big,
        ))  # fmt: skip
    await bus.close()


# --------------------------------------------------------------------------- clients


class ClientConn(asyncio.Protocol):
    def __init__(self, on_done) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.on_done = on_done
        self.transport = None
        self.events = 0
        self.status = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.events += body.count(b"data: ")

    def on_message_complete(self) -> None:
        self.on_done(self)

    def connection_lost(self, exc) -> None:
        pass


def request_bytes(port: int, body: bytes = REQUEST, path: bytes = b"/v1/chat/completions") -> bytes:
    # The engine key goes to the gateway too, which has no keys of its own here and ignores it.
    return b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        path, port, KEY.encode(), len(body), body)  # fmt: skip


# The translated APIs (llmgw/gateway/translated.py): (path, body) asking what REQUEST asks.
_ASK = "Say hello in one word."
TRANSLATED = {
    "/v1/responses": (b"/v1/responses", json.dumps({"model": MODEL, "input": _ASK, "max_output_tokens": 8, "temperature": 0, "store": False}).encode()),
    "/v1/responses, stored": (b"/v1/responses", json.dumps({"model": MODEL, "input": _ASK, "max_output_tokens": 8, "temperature": 0}).encode()),
    "/v1/messages": (b"/v1/messages", json.dumps({"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": _ASK}]}).encode()),
}
TRANSLATED_STREAMS = {
    "/v1/responses": (b"/v1/responses", json.dumps({"model": STREAM_MODEL, "input": "Hi", "stream": True, "store": False}).encode()),
    "/v1/messages": (b"/v1/messages", json.dumps({"model": STREAM_MODEL, "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}).encode()),
}


async def open_loop(port: int, rate: float, seconds: float, path: bytes = b"/v1/chat/completions", body: bytes = REQUEST) -> dict:
    """Requests sent on a fixed schedule; latency from when each was due."""
    loop = asyncio.get_running_loop()
    data = request_bytes(port, body, path)
    idle: list[ClientConn] = []
    due: dict[ClientConn, float] = {}
    latencies: list[float] = []
    errors = 0

    def done(conn: ClientConn) -> None:
        nonlocal errors
        latencies.append(time.perf_counter() - due.pop(conn))
        if conn.status != 200:
            errors += 1
        idle.append(conn)

    async def conn() -> ClientConn:
        _, c = await loop.create_connection(lambda: ClientConn(done), "127.0.0.1", port)
        return c

    for _ in range(16):
        idle.append(await conn())
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05
    for i in range(total):
        at = start + i / rate
        wait = at - time.perf_counter()
        if wait > 0.0005:
            await asyncio.sleep(wait)
        c = idle.pop() if idle else None
        while c is not None and c.transport.is_closing():  # closed by the server while idle (a keep-alive timeout)
            c = idle.pop() if idle else None
        if c is None:
            c = await conn()
        due[c] = at
        c.transport.write(data)
    deadline = time.perf_counter() + 10
    while due and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    for c in idle:
        c.transport.close()
    latencies.sort()
    n = len(latencies)
    took = time.perf_counter() - start
    return {
        "offered_rps": rate, "answered": n, "errors": errors + len(due), "achieved_rps": round(n / took, 1),
        "p50_ms": round(latencies[n // 2] * 1e3, 3), "p90_ms": round(latencies[int(n * 0.9)] * 1e3, 3),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1e3, 3), "max_ms": round(latencies[-1] * 1e3, 3),
    }  # fmt: skip


def median_round(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds."""
    out = {}
    for k, v in rounds[0].items():
        values = sorted(r[k] for r in rounds)
        out[k] = values[len(values) // 2] if isinstance(v, (int, float)) else v
    return out


async def fill(port: int, prefixes: int, connections: int = 32) -> None:
    """`prefixes` requests, each with a prompt of its own, as fast as they go."""
    loop = asyncio.get_running_loop()
    sent = 0
    finished = asyncio.Event()
    answered = 0

    def body(i: int) -> bytes:
        return request_bytes(port, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"prompt number {i}"}]}).encode())

    def done(conn: ClientConn) -> None:
        nonlocal sent, answered
        answered += 1
        if sent < prefixes:
            conn.transport.write(body(sent))
            sent += 1
        elif answered >= prefixes:
            finished.set()

    conns = [(await loop.create_connection(lambda: ClientConn(done), "127.0.0.1", port))[1] for _ in range(min(connections, prefixes))]
    for c in conns:
        c.transport.write(body(sent))
        sent += 1
    await asyncio.wait_for(finished.wait(), 600)
    for c in conns:
        c.transport.close()


def index_blocks(port: int) -> int:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r"^llmgw_gateway_prefix_index_blocks (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else -1


async def closed_loop(port: int, connections: int, seconds: float) -> dict:
    """As fast as it goes: each connection sends its next request on the answer."""
    loop = asyncio.get_running_loop()
    data = request_bytes(port)
    count = 0
    stop_at = 0.0

    def done(conn: ClientConn) -> None:
        nonlocal count
        count += 1
        if time.perf_counter() < stop_at:
            conn.transport.write(data)

    conns = [(await loop.create_connection(lambda: ClientConn(done), "127.0.0.1", port))[1] for _ in range(connections)]
    start = time.perf_counter()
    stop_at = start + seconds
    for c in conns:
        c.transport.write(data)
    await asyncio.sleep(seconds + 0.2)
    for c in conns:
        c.transport.close()
    return {"rps": round(count / (time.perf_counter() - start - 0.2), 1), "tool": "python closed loop", "connections": connections}


def wrk(port: int, connections: int, seconds: float, work: Path) -> dict:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
        f"wrk.body = {json.dumps(REQUEST.decode())}\n"
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, text=True, timeout=seconds + 30,
    )  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out.stdout)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out.stdout)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out.stdout)
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    return {
        "rps": rps, "tool": "wrk", "connections": connections,
        "p50_ms": round(float(p50.group(1)) * unit[p50.group(2)], 3) if p50 else None,
        "p99_ms": round(float(p99.group(1)) * unit[p99.group(2)], 3) if p99 else None,
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }  # fmt: skip


async def streams(port: int, concurrent: int, seconds: float, path: bytes = b"/v1/chat/completions", body: bytes = b"") -> dict:
    loop = asyncio.get_running_loop()
    body = body or json.dumps({"model": STREAM_MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}).encode()
    data = request_bytes(port, body, path)
    events = 0
    answers = 0
    stop_at = 0.0

    def done(conn: ClientConn) -> None:
        nonlocal events, answers
        events += conn.events
        answers += 1
        conn.events = 0
        if time.perf_counter() < stop_at:
            conn.transport.write(data)

    conns = [(await loop.create_connection(lambda: ClientConn(done), "127.0.0.1", port))[1] for _ in range(concurrent)]
    start = time.perf_counter()
    stop_at = start + seconds
    for c in conns:
        c.transport.write(data)
    while answers < 1 or any(c.events for c in conns) or time.perf_counter() < stop_at:
        await asyncio.sleep(0.02)
        if time.perf_counter() > stop_at + 10:
            break
    took = time.perf_counter() - start
    for c in conns:
        c.transport.close()
    return {"events_per_s": round(events / took), "streams": answers, "concurrent": concurrent}


# --------------------------------------------------------------------------- the run


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Each process group: TERM, then KILL after 10 s."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the fixed-rate measurement (the median is shown)")
    p.add_argument("--rate", type=float, default=500.0, help="requests/s offered for the latency figures")
    p.add_argument("--connections", type=int, default=32, help="connections at saturation")
    p.add_argument("--chunks", type=int, default=200, help="events per streamed answer")
    p.add_argument("--upstream", choices=("auto", "nginx", "python"), default="auto")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument(
        "--limits", action="store_true",
        help="the client's bearer an API key with limits (requests, tokens per minute, per day, its owner's too: never "
        "reached), so that every request goes through the shared limits (gateway/shared_limits.py)",
    )
    p.add_argument("--auth", action="store_true", help="the server with auth on, the gateway with its credential (as llmgw up)")
    p.add_argument("--no-translated", dest="translated", action="store_false", help="skip /v1/responses and /v1/messages")
    p.add_argument("--prefixes", type=int, default=100_000, help="unique prompts sent through the gateway first: its prefix index holds them")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.chunks, KEY)
        return 0

    import uvloop

    from llmgw.bus.server import NatsServer

    load_before = os.getloadavg()[0]

    procs: list[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-gw-"))
    use_nginx = args.upstream == "nginx" or (args.upstream == "auto" and shutil.which("nginx"))
    up_port, stream_port, gw_port = free_port(), free_port(), free_port()
    keys = loader = None
    gateway_creds: list[str] = []
    if args.auth:
        import authbench

        keys = authbench.keystore(work / "creds")
        loader = authbench.loader_creds(keys)
        gateway_creds = ["--creds", str(keys.ensure("gateway", "bench"))]
    nats = NatsServer(work / "nats", free_port(), auth=keys).start()
    try:
        if use_nginx:
            procs.append(start_nginx(up_port, work))
        else:
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve", str(up_port)], start_new_session=True, env={**os.environ, "LLMGW_BENCH_KEY": KEY}))
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve", str(stream_port), "--chunks", str(args.chunks)], start_new_session=True, env={**os.environ, "LLMGW_BENCH_KEY": KEY}))
        wait_port(up_port)
        wait_port(stream_port)
        asyncio.run(write_log(nats.url, {MODEL: f"http://127.0.0.1:{up_port}", STREAM_MODEL: f"http://127.0.0.1:{stream_port}"}, loader, args.limits))
        metrics_port = free_port() if args.limits else gw_port  # with API keys, /metrics of every model is there
        metrics = ["--metrics-listen", f"127.0.0.1:{metrics_port}"] if args.limits else []
        gw = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "gateway", "--nats", nats.url, "--port", str(gw_port), "--name", "bench", *gateway_creds, *metrics],
            stdout=open(work / "gateway.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE.parent,
        )  # fmt: skip
        procs.append(gw)
        wait_port(gw_port)
        results: dict = {"upstream": "nginx " + subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1] if use_nginx else "python (uvloop)"}

        async def measure() -> None:
            if args.prefixes:
                await fill(gw_port, args.prefixes)
            results["index_blocks"] = index_blocks(metrics_port)
            # Warm both paths (connections, caches) before anything counts.
            for port in (up_port, gw_port):
                await open_loop(port, args.rate, 1.0)
            # Rounds, each path in turn, so that a neighbour's burst on the
            # shared cores lands on one round of both rather than on one path.
            rounds: dict[str, list[dict]] = {"direct": [], "gateway": []}
            for _ in range(args.rounds):
                for name, port in (("direct", up_port), ("gateway", gw_port)):
                    rounds[name].append(await open_loop(port, args.rate, args.seconds))
            for name, got in rounds.items():
                results.setdefault(name, {})["at_rate"] = median_round(got)
                results[name]["at_rate_rounds"] = got
            results["added_rounds"] = [
                {k: round(g[k] - d[k], 3) for k in ("p50_ms", "p99_ms")} for d, g in zip(rounds["direct"], rounds["gateway"])
            ]
            for name, port in (("direct", stream_port), ("gateway", gw_port)):
                results.setdefault(name, {})["streaming"] = await streams(port, 8, args.seconds)
            if args.translated:
                await translated(results)

        async def translated(results: dict) -> None:
            """Each translated path beside the gateway's chat path and the engine's, round by round."""
            for path, body in TRANSLATED.values():
                await open_loop(gw_port, args.rate, 1.0, path, body)  # warm
            rounds: dict[str, list[dict]] = {"direct": [], "gateway": [], **{name: [] for name in TRANSLATED}}
            for _ in range(args.rounds):
                rounds["direct"].append(await open_loop(up_port, args.rate, args.seconds))
                rounds["gateway"].append(await open_loop(gw_port, args.rate, args.seconds))
                for name, (path, body) in TRANSLATED.items():
                    rounds[name].append(await open_loop(gw_port, args.rate, args.seconds, path, body))
            out = results["translated"] = {}
            for name in TRANSLATED:
                got = rounds[name]
                over = {base: [round(t["p50_ms"] - b["p50_ms"], 3) for t, b in zip(got, rounds[base])] for base in ("direct", "gateway")}
                out[name] = {
                    "at_rate": median_round(got), "at_rate_rounds": got,
                    "added_p50_ms_over_engine": sorted(over["direct"])[len(got) // 2],
                    "added_p50_ms_over_gateway_chat": sorted(over["gateway"])[len(got) // 2],
                    "added_p50_ms_over_engine_rounds": over["direct"],
                }  # fmt: skip
            for name, (path, body) in TRANSLATED_STREAMS.items():
                out[name]["streaming"] = await streams(gw_port, 8, args.seconds, path, body)

        uvloop.run(measure())
        for name, port in (("direct", up_port), ("gateway", gw_port)):
            if shutil.which("wrk"):
                results[name]["saturation"] = wrk(port, args.connections, args.seconds, work)
            else:
                results[name]["saturation"] = uvloop.run(closed_loop(port, args.connections, args.seconds))
        added = results["added_rounds"]
        results["added"] = {k: sorted(a[k] for a in added)[len(added) // 2] for k in ("p50_ms", "p99_ms")}
        results["load_average_before"] = load_before
        report(results, args)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        stop_all(procs)
        nats.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(r: dict, args) -> None:
    d, g = r["direct"], r["gateway"]
    sat_d, sat_g = d["saturation"], g["saturation"]
    rows = [
        (f"p50 at {args.rate:g} req/s (ms)", d["at_rate"]["p50_ms"], g["at_rate"]["p50_ms"], r["added"]["p50_ms"]),
        (f"p99 at {args.rate:g} req/s (ms)", d["at_rate"]["p99_ms"], g["at_rate"]["p99_ms"], r["added"]["p99_ms"]),
        ("max there (ms)", d["at_rate"]["max_ms"], g["at_rate"]["max_ms"], None),
        ("achieved req/s there", d["at_rate"]["achieved_rps"], g["at_rate"]["achieved_rps"], None),
        ("errors there", d["at_rate"]["errors"], g["at_rate"]["errors"], None),
        (f"saturation req/s ({sat_d['tool']})", sat_d["rps"], sat_g["rps"], None),
    ]
    if "errors" in sat_d:
        rows.append(("  non-2xx answers there", sat_d["errors"], sat_g["errors"], None))
    if sat_d.get("p50_ms") is not None:
        rows.append(("  p50 at saturation (ms)", sat_d["p50_ms"], sat_g["p50_ms"], None))
        rows.append(("  p99 at saturation (ms)", sat_d["p99_ms"], sat_g["p99_ms"], None))
    rows.append(("streaming events/s (8 at once)", d["streaming"]["events_per_s"], g["streaming"]["events_per_s"], None))
    print(f"upstream: {r['upstream']}; {os.cpu_count()} cores shared by the client, the upstream and the gateway "
          f"(load average {r['load_average_before']:.2f} before the run); {args.seconds:g}s a measurement; "
          f"at {args.rate:g} req/s: the median of {args.rounds} rounds; {sat_d['connections']} connections at saturation; "
          f"the gateway's prefix index held {r['index_blocks']} blocks ({args.prefixes} unique prompts sent first)")
    print("added latency by round (p50, p99 ms): " + ", ".join(f"({a['p50_ms']}, {a['p99_ms']})" for a in r["added_rounds"]))
    print(f"{'':34}{'direct':>12}{'gateway':>12}{'added':>10}")
    for name, a, b, added in rows:
        print(f"{name:34}{a:>12}{b:>12}{'' if added is None else added:>10}")
    if "translated" in r:
        print(f"\ntranslated onto chat completions, at {args.rate:g} req/s (median of {args.rounds} rounds):")
        print(f"{'':34}{'p50 ms':>10}{'p99 ms':>10}{'+engine':>10}{'+gw chat':>10}{'events/s':>10}")
        for name, t in r["translated"].items():
            ev = t.get("streaming", {}).get("events_per_s", "")
            print(f"{name:34}{t['at_rate']['p50_ms']:>10}{t['at_rate']['p99_ms']:>10}{t['added_p50_ms_over_engine']:>10}"
                  f"{t['added_p50_ms_over_gateway_chat']:>10}{ev:>10}")
        print("(+engine: p50 added over the engine's own chat API, direct; +gw chat: over the gateway's chat path)")


if __name__ == "__main__":
    sys.exit(main())
