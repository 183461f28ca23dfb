"""The gateway's shell in one process: the log on an in-memory bus, stand-in
engines on 127.0.0.1, the official openai SDK (and raw sockets) as clients."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest

from llmgw.bus.memory import MemoryBus
from llmgw.core.contract import events as ev
from llmgw.gateway.config import GatewayConfig
from llmgw.gateway.server import Gateway

from .fake_openai import FakeEngine
from .conftest import sample
from .gateway_harness import Log, settle, spec

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(60)


class Setup:
    def __init__(self) -> None:
        self.bus = MemoryBus()
        self.log = Log(self.bus)
        self.engines: list[FakeEngine] = []
        self.gw: Gateway | None = None
        self.stop = asyncio.Event()
        self.reports: asyncio.Task | None = None

    async def engine(self, name: str, **kw) -> FakeEngine:
        e = await FakeEngine(name, **kw).start()
        self.engines.append(e)
        return e

    async def gateway(self, **kw) -> Gateway:
        kw.setdefault("wait_timeout", 3.0)
        self.gw = Gateway(self.bus, name="gw-test", config=GatewayConfig(port=0, **kw))
        await self.gw.start()
        self.reports = asyncio.get_running_loop().create_task(self.gw.report_loop(self.stop))
        return self.gw

    async def settle(self) -> None:
        await settle(self.gw, self.bus)

    @property
    def url(self) -> str:
        return f"http://{self.gw.listening_on}:{self.gw.port}/v1"

    def client(self, key: str = "none") -> "openai.AsyncOpenAI":
        return openai.AsyncOpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=20)

    async def raw(self, request: bytes, host: str | None = None) -> tuple[int, dict, bytes]:
        """One raw HTTP exchange (Connection: close); (status, headers, body)."""
        reader, writer = await asyncio.open_connection(host or self.gw.listening_on, self.gw.port)
        writer.write(request)
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        return int(lines[0].split()[1]), headers, body

    async def post(self, path: str, payload: dict, key: str = "", host: str | None = None) -> tuple[int, dict, bytes]:
        body = json.dumps(payload).encode()
        auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
        return await self.raw(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (path.encode(), auth, len(body), body),
            host,
        )

    def loads(self, model: str) -> list[ev.ModelLoad]:
        return [e for s, d in self.bus.log if s.startswith("llmgw.gw.") and (e := ev.decode(d)).model == model]

    async def close(self) -> None:
        self.stop.set()
        if self.reports is not None:
            self.reports.cancel()
        if self.gw is not None:
            await self.gw.close(grace=0.5)
        for e in self.engines:
            await e.stop()


@pytest.fixture
async def setup():
    s = Setup()
    try:
        yield s
    finally:
        await s.close()


CHAT = [{"role": "user", "content": "hi"}]


async def test_the_openai_sdk_sync_async_and_streaming_through_the_gateway(setup):
    a = await setup.engine("a")
    chat = spec("chat", aliases=["c", "gpt-x"])
    await setup.log.model(chat)
    rid = await setup.log.replica(chat, a.endpoint)
    await setup.gateway()
    assert setup.gw.listening_on == "127.0.0.1"  # no keys: this machine only
    client = setup.client()

    got = await client.chat.completions.create(model="chat", messages=CHAT, max_tokens=4)
    assert got.choices[0].message.content == "hello from a" and got.usage.completion_tokens == 3
    raw = await client.chat.completions.with_raw_response.create(model="c", messages=CHAT)
    assert raw.headers["llmgw-replica"] == rid
    assert a.requests[-1]["model"] == "chat"  # an alias reaches the engine as the model's name
    text = await client.completions.create(model="gpt-x", prompt="say", max_tokens=2)
    assert text.choices[0].text == "hello from a"
    emb = await client.embeddings.create(model="chat", input="x")
    assert emb.data[0].embedding == [0.1, 0.2]
    assert a.paths[-3:] == ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]

    stream = await client.chat.completions.create(model="chat", messages=CHAT, stream=True)
    words = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert words == ["w0 ", "w1 ", "w2 ", "w3 "]

    models = await client.models.list()
    assert sorted(m.id for m in models.data) == ["c", "chat", "gpt-x"]

    def sync() -> str:
        c = openai.OpenAI(base_url=setup.url, api_key="none", max_retries=0, timeout=20)
        out = c.chat.completions.create(model="chat", messages=CHAT).choices[0].message.content
        chunks = list(c.chat.completions.create(model="chat", messages=CHAT, stream=True))
        assert len(chunks) == 5
        return out

    assert await asyncio.to_thread(sync) == "hello from a"


async def test_errors_are_in_openais_format(setup):
    await setup.log.model(spec("chat"))
    await setup.gateway()
    client = setup.client()
    with pytest.raises(openai.NotFoundError) as e:
        await client.chat.completions.create(model="nope", messages=CHAT)
    assert e.value.body["code"] == "model_not_found" and "nope" in e.value.body["message"]
    status, _, body = await setup.post("/v1/chat/completions", {"messages": CHAT})
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, _, body = await setup.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{x]")
    assert status == 400 and "JSON" in json.loads(body)["error"]["message"]
    status, _, body = await setup.raw(b"GET /v2/nothing HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 404 and json.loads(body)["error"]["message"]
    status, _, body = await setup.raw(b"GET /v1/chat/completions HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 405


async def test_keep_alive_pipelining_and_expect_continue(setup):
    a = await setup.engine("a")
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway()
    body = b'{"model":"m","prompt":"x"}'
    one = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.gw.port)
    writer.write(one + one + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 10)
    assert data.count(b"HTTP/1.1 200 OK") == 3 and data.count(b"hello from a") == 2
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.gw.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n" % len(body))
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100 Continue")
    writer.write(body)
    assert b"hello from a" in await asyncio.wait_for(reader.read(), 10)
    writer.close()


async def test_least_outstanding_spreads_the_load_by_weight(setup):
    heavy = await setup.engine("heavy", delay=0.3)
    light = await setup.engine("light", delay=0.3)
    s = ev.ModelSpec(
        name="m", profiles=[ev.ProfileSpec(name="big", gpus=0, weight=3.0), ev.ProfileSpec(name="small", gpus=0)], routing="least-load"
    )  # the same prompt each time: `prefix` would keep it where it is warm
    await setup.log.model(s)
    await setup.log.replica(s, heavy.endpoint)
    small = msgspec.structs.replace(s, profiles=[s.profiles[1]])
    await setup.log.replica(small, light.endpoint)  # placed on profile "small" (weight 1)
    await setup.gateway()
    client = setup.client()
    await asyncio.gather(*(client.completions.create(model="m", prompt="x") for _ in range(8)))
    assert (len(heavy.requests), len(light.requests)) == (6, 2)


async def test_a_failure_before_the_first_byte_goes_to_another_replica_and_opens_the_breaker(setup):
    dead = await setup.engine("dead")
    busy = await setup.engine("busy")
    good = await setup.engine("good")
    m = spec("m", routing="least-load")  # each replica in turn: `prefix` would keep "x" where it hashes
    await setup.log.model(m)
    r_dead = await setup.log.replica(m, dead.endpoint)
    r_busy = await setup.log.replica(m, busy.endpoint)
    await setup.log.replica(m, good.endpoint)
    await dead.stop()  # no one listens there any more
    busy.mode = "503"
    await setup.gateway()
    client = setup.client()
    for _ in range(6):
        got = await client.completions.create(model="m", prompt="x")
        assert got.choices[0].text == "hello from good"
    backends = {b.replica: b for b in setup.gw.backends.values()}
    assert backends[r_dead].breaker.state == "open" and backends[r_busy].breaker.state == "open"
    assert len(busy.requests) == 3  # and no more once its breaker opened
    metrics = (await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))[2].decode()
    assert sample(metrics, "llmgw_gateway_breaker_open", model="m", replica=r_dead) == 1
    assert sample(metrics, "llmgw_gateway_retries_total", model="m") is not None

    # The half-open probe closes the breaker once the replica answers again.
    busy.mode = "ok"
    backends[r_busy].breaker.opened_at -= 60
    for _ in range(4):
        await client.completions.create(model="m", prompt="x")
    assert backends[r_busy].breaker.state == "closed" and len(busy.requests) > 3


async def test_all_replicas_failing_is_a_clean_502(setup):
    a = await setup.engine("a")
    a.mode = "hang-up"
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway(failover_timeout=0.2)  # nothing is coming: no longer than this for the log to say otherwise
    with pytest.raises(openai.APIStatusError) as e:
        await setup.client().completions.create(model="m", prompt="x")
    assert e.value.status_code == 502 and "m-1" in e.value.body["message"]


async def test_an_engine_that_is_not_the_replicas_is_refused_with_the_reason_never_a_200(setup):
    m = spec("m")
    await setup.log.model(m)
    mine = await setup.engine("mine", identity="m@m-1.0/1")
    # What answers on the port the second replica advertises: another replica's engine, then a stranger.
    other = await setup.engine("other", identity="m@m-9.0/4")
    mine.model = other.model = "m"
    r_mine = await setup.log.replica(m, mine.endpoint, identity="m@m-1.0/1")
    r_2 = await setup.log.replica(m, other.endpoint, identity=f"m@m-2.0/{9}")
    await setup.gateway(failover_timeout=0.2)
    client = setup.client()
    for _ in range(6):
        raw = await client.completions.with_raw_response.create(model="m", prompt="x")
        assert raw.headers["llmgw-replica"] == r_mine and raw.parse().choices[0].text == "hello from mine"
    assert not [p for p in other.paths if p != "/v1/models"]  # never sent a request
    # Verified once per new connection: the reused ones are not asked again.
    assert mine.paths.count("/v1/models") == 1 and len(mine.paths) == 7

    # The only replica left is the impostor's: a failed attempt with the reason, never its 200.
    await setup.log.drain(r_mine)
    await setup.settle()
    with pytest.raises(openai.APIStatusError) as e:
        await client.completions.create(model="m", prompt="x")
    message = e.value.body["message"]
    assert e.value.status_code == 502 and r_2 in message, message
    assert f"{other.endpoint.split('//')[1]} is not the engine started for this replica" in message
    assert "lists m, m@m-9.0/4, not m@m-2.0/9" in message
    stranger = await setup.engine("stranger")  # an OpenAI server of no identity at all
    stranger.identity, stranger.model = "", "llama-70b"
    await setup.log.status(r_2, "ready", stranger.endpoint, "m@m-2.0/9")
    await setup.settle()
    with pytest.raises(openai.APIStatusError) as e:
        await client.completions.create(model="m", prompt="x")
    assert e.value.status_code == 502 and "lists llama-70b, not m@m-2.0/9" in e.value.body["message"]
    assert stranger.paths == ["/v1/models"]


class LlamaLike(FakeEngine):
    """Owned by llamacpp, so the gateway asks its /props on a new connection."""

    def model_card(self) -> dict:
        return {**super().model_card(), "owned_by": "llamacpp"}

    async def answer(self, writer, method: str, path: str, req: dict) -> bool:
        if method == "GET" and path == "/props":
            self.paths.append(path)
            self.send_json(writer, 200, {"chat_template_caps": {"supports_tools": True}})
            return True
        return await super().answer(writer, method, path, req)


async def test_concurrent_requests_to_one_replica_each_have_their_own_connection(setup):
    # Once routing sent two identical prompts at once to the replica they were
    # warm on, the connection verified with /v1/models and /props went back to
    # the pool while the first request used it, and again when that answer
    # ended: pooled twice, the next two requests both took it, and one never
    # had its answer.
    m = spec("m")
    await setup.log.model(m)
    e = LlamaLike("e", identity="m@m-1.0/1", delay=0.3)
    await e.start()
    setup.engines.append(e)
    e.model = "m"
    await setup.log.replica(m, e.endpoint, identity="m@m-1.0/1")
    await setup.gateway()
    client = setup.client()
    first = await client.chat.completions.create(model="m", messages=CHAT)  # the connection made, verified, pooled
    assert first.choices[0].message.content == "hello from e" and e.paths == ["/v1/models", "/props", "/v1/chat/completions"]
    got = await asyncio.wait_for(
        asyncio.gather(*(client.chat.completions.create(model="m", messages=CHAT) for _ in range(3))), 10
    )
    assert [g.choices[0].message.content for g in got] == ["hello from e"] * 3
    assert e.paths.count("/v1/chat/completions") == 4 and e.paths.count("/props") == 1


async def test_a_request_whose_only_replica_fails_waits_for_its_replacement(setup):
    m = spec("m")
    await setup.log.model(m)
    a = await setup.engine("a", identity="m@m-1.0/1")
    r_a = await setup.log.replica(m, a.endpoint, identity="m@m-1.0/1")
    await setup.gateway(wait_timeout=10.0)
    client = setup.client()
    assert (await client.completions.create(model="m", prompt="x")).choices[0].text == "hello from a"
    await a.stop()  # crashed: its port closed, and the log does not know yet
    asked = asyncio.get_running_loop().create_task(client.completions.with_raw_response.create(model="m", prompt="x"))
    deadline = time.monotonic() + 5
    while not any(e.queued for e in setup.loads("m")):  # it failed on m-1, and waits
        assert time.monotonic() < deadline and not asked.done(), "the request did not wait"
        await asyncio.sleep(0.02)
    await setup.log.status(r_a, "failed")
    b = await setup.engine("b", identity="m@m-2.0/1")
    r_b = await setup.log.replica(m, b.endpoint, identity="m@m-2.0/1")
    raw = await asked
    assert raw.headers["llmgw-replica"] == r_b and raw.parse().choices[0].text == "hello from b"


async def test_a_request_waiting_for_a_replica_that_never_comes_is_503_with_retry_after(setup):
    m = spec("m")
    await setup.log.model(m)
    a = await setup.engine("a")
    r_a = await setup.log.replica(m, a.endpoint)
    await setup.gateway(wait_timeout=0.5, failover_timeout=0.1)
    await a.stop()
    await setup.log.status(r_a, "failed")  # after the gateway's own failure: its replacement is due
    status, headers, body = await setup.post("/v1/completions", {"model": "m", "prompt": "x"})
    error = json.loads(body)["error"]
    assert status == 503 and int(headers["retry-after"]) >= 1 and error["code"] == "model_unavailable", body
    assert "no replica of m became ready within 0.5s" in error["message"]


async def test_a_replica_dying_mid_stream_is_a_clean_error_and_the_next_request_goes_to_another(setup):
    a = await setup.engine("a", chunks=6, delay=0.05)
    m = spec("m")
    await setup.log.model(m)
    r_a = await setup.log.replica(m, a.endpoint)
    await setup.gateway()
    client = setup.client()
    a.mode = "die-after:2"
    stream = await client.chat.completions.create(model="m", messages=CHAT, stream=True)
    got = []
    with pytest.raises(openai.APIError) as e:
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == ["w0 ", "w1 "] and f"replica {r_a} failed mid-answer" in e.value.message

    # It is gone for good (killed); another replica comes; the next request lands there.
    await a.stop()
    b = await setup.engine("b")
    r_b = await setup.log.replica(m, b.endpoint)
    await setup.settle()
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=CHAT)
    assert raw.headers["llmgw-replica"] == r_b
    status = (await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))[2].decode()
    assert sample(status, "llmgw_gateway_requests_total", model="m", replica=r_a, code="502") == 1


async def test_a_draining_replica_gets_no_new_requests(setup):
    a, b = await setup.engine("a"), await setup.engine("b")
    m = spec("m", min_replicas=2)
    await setup.log.model(m)
    r_a = await setup.log.replica(m, a.endpoint)
    await setup.log.replica(m, b.endpoint)
    await setup.gateway()
    await setup.log.drain(r_a)
    await setup.settle()
    client = setup.client()
    for _ in range(4):
        await client.completions.create(model="m", prompt="x")
    assert len(a.requests) == 0 and len(b.requests) == 4


async def test_an_on_demand_model_is_woken_by_its_first_request(setup):
    od = spec("od", min_replicas=0, on_demand=True, idle_s=60)
    await setup.log.model(od)
    await setup.gateway(wait_timeout=10.0)
    client = setup.client()
    asked = asyncio.get_running_loop().create_task(client.completions.create(model="od", prompt="x"))
    # The waiting request is load: queued, reported at once (the wake-up).
    deadline = time.monotonic() + 5
    while not any(e.queued for e in setup.loads("od")):
        assert time.monotonic() < deadline, "no wake-up was published"
        await asyncio.sleep(0.02)
    assert not asked.done()
    e = await setup.engine("od-engine")
    await setup.log.replica(od, e.endpoint)
    got = await asked
    assert got.choices[0].text == "hello from od-engine"
    # Once answered, the load falls to zero and says so, with the tokens used.
    deadline = time.monotonic() + 5
    while not (setup.loads("od") and setup.loads("od")[-1].queued == 0 and setup.loads("od")[-1].in_flight == 0):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    loads = setup.loads("od")
    assert sum(x.tokens_in for x in loads) == 7 and sum(x.tokens_out for x in loads) == 3
    assert loads[-1].last_used > 0


async def test_no_replica_in_time_is_503_with_retry_after(setup):
    await setup.log.model(spec("od", min_replicas=0, on_demand=True))
    await setup.log.model(spec("off", min_replicas=0))
    await setup.gateway(wait_timeout=0.5)
    started = time.monotonic()
    status, headers, body = await setup.post("/v1/completions", {"model": "od", "prompt": "x"})
    assert status == 503 and int(headers["retry-after"]) >= 1 and time.monotonic() - started >= 0.5
    assert json.loads(body)["error"]["code"] == "model_unavailable"
    # A model that nothing will bring up is refused at once.
    status, _, body = await setup.post("/v1/completions", {"model": "off", "prompt": "x"})
    assert status == 503 and "runs no replica" in json.loads(body)["error"]["message"]


async def test_api_keys_owners_and_limits(setup):
    a = await setup.engine("a")
    for name, owner in (("shared", ""), ("org-model", "org"), ("team-model", "org/team"), ("other-model", "org/other")):
        await setup.log.model(spec(name, owner=owner))
        await setup.log.replica(spec(name, owner=owner), a.endpoint)
    await setup.gateway(listen="127.0.0.2")
    assert setup.gw.listening_on == "127.0.0.2"
    await setup.log.key("team", "org/team", "sk-team-0123456789abcdef")
    await setup.log.key("slow", "org/team", "sk-slow-0123456789abcdef", rpm=2)
    await setup.log.key("thrifty", "org", "sk-thrifty-0123456789abcd", tpm=5)
    await setup.settle()

    ask = {"model": "team-model", "prompt": "x"}
    assert (await setup.post("/v1/completions", ask))[0] == 401
    status, _, body = await setup.post("/v1/completions", ask, key="sk-wrong-0123456789abcdef")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"

    team = setup.client("sk-team-0123456789abcdef")
    for model in ("shared", "org-model", "team-model"):
        assert (await team.completions.create(model=model, prompt="x")).choices[0].text
    with pytest.raises(openai.NotFoundError):
        await team.completions.create(model="other-model", prompt="x")
    assert sorted(m.id for m in (await team.models.list()).data) == ["org-model", "shared", "team-model"]

    slow = setup.client("sk-slow-0123456789abcdef")
    await slow.completions.create(model="shared", prompt="x")
    await slow.completions.create(model="shared", prompt="x")
    with pytest.raises(openai.RateLimitError) as e:
        await slow.completions.create(model="shared", prompt="x")
    assert int(e.value.response.headers["retry-after"]) >= 1

    thrifty = setup.client("sk-thrifty-0123456789abcd")
    await thrifty.completions.create(model="org-model", prompt="x")  # 10 tokens: past its 5 a minute
    with pytest.raises(openai.RateLimitError) as e:
        await thrifty.completions.create(model="org-model", prompt="x")
    assert "tokens" in e.value.message and int(e.value.response.headers["retry-after"]) >= 1


async def test_metrics_count_requests_latency_first_tokens_and_tokens(setup):
    a = await setup.engine("a")
    await setup.log.model(spec("m"))
    rid = await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway()
    client = setup.client()
    await client.completions.create(model="m", prompt="x")
    stream = await client.chat.completions.create(model="m", messages=CHAT, stream=True)
    async for _ in stream:
        pass
    status, headers, body = await setup.raw(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    labels = {"model": "m", "replica": rid}
    assert sample(text, "llmgw_gateway_requests_total", **labels, code="200") == 2
    assert sample(text, "llmgw_gateway_request_seconds_count", **labels) == 2
    assert sample(text, "llmgw_gateway_time_to_first_token_seconds_count", **labels) == 1
    assert sample(text, "llmgw_gateway_tokens_total", **labels, kind="prompt") == 14
    assert sample(text, "llmgw_gateway_tokens_total", **labels, kind="completion") == 7
