"""One error shape from the gateway, whoever failed: a real llama.cpp engine
(the demo model, through xllamacpp) behind the gateway, the official openai
SDK as the client. The engine's errors come back in the OpenAI shape with the
engine's words (without llama.cpp's internals); embeddings asked of a model
that does not serve them say which catalog field to change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from llmgw.bus.memory import MemoryBus
from llmgw.bus.server import free_port
from llmgw.gateway.engine_errors import openai_error
from llmgw.gateway.config import GatewayConfig
from llmgw.gateway.server import Gateway

from .conftest import demo_gguf
from .gateway_harness import Log, settle, spec

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The demo model on a real llama.cpp server, as the agent starts it."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("engine") / "engine.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.agent.llamacpp_server", "--model", str(demo_gguf()), "--port", str(port),
         "--alias", "smollm2", "--threads", "1", "--ctx-size", "512", "--parallel", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the engine exited"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the engine did not come up"
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


async def _gateway(endpoint: str):
    bus = MemoryBus()
    log = Log(bus)
    s = spec("smollm2")
    await log.model(s)
    await log.replica(s, endpoint)
    gw = Gateway(bus, name="gw-errors", config=GatewayConfig(port=0, wait_timeout=3.0))
    await gw.start()
    await settle(gw, bus)
    client = openai.AsyncOpenAI(base_url=f"http://{gw.listening_on}:{gw.port}/v1", api_key="none", max_retries=0, timeout=60)
    return gw, client


async def test_an_engines_errors_come_in_the_openai_shape_with_its_words(llama):
    gw, client = await _gateway(llama)
    try:
        # llama.cpp's own answer: {"error": {"code": 400, "message": "Field 'n': Value must be ...", ...}}
        # (what OpenAI takes and llama.cpp does not: the gateway's checks pass it)
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2)
        body = e.value.body
        assert set(body) == {"message", "type", "param", "code"}, body
        assert body["type"] == "invalid_request_error" and not isinstance(body["code"], int)
        assert "json.exception" not in body["message"] and body["message"]
        # A model that serves no embeddings: which profile field to change.
        with pytest.raises(openai.APIStatusError) as e:
            await client.embeddings.create(model="smollm2", input="hello")
        body = e.value.body
        assert body["code"] == "embeddings_not_served"
        assert "args: [--embeddings, --pooling, mean]" in body["message"] and "chat and completions as well" in body["message"]
        assert e.value.response.headers["llmgw-replica"] == "smollm2-1"
        # The success path is untouched: the same connection answers the next request.
        ok = await client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert ok.choices[0].message.content is not None
    finally:
        await client.close()
        await gw.close(grace=0.5)


@pytest.mark.parametrize(
    "status, body, message, code",
    [
        (400, b'{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}',
         "max_tokens is too large", None),  # vLLM's
        (422, b'{"detail":[{"loc":["body","messages"],"msg":"field required"}]}', "field required", None),  # FastAPI's
        (500, b"engine exploded", "engine exploded", None),  # plain text
        (404, b'{"error":{"message":"no such route","type":"invalid_request_error","code":"nope"}}', "no such route", "nope"),
    ],
)
def test_every_engines_shape_becomes_the_openai_one(status, body, message, code):
    import json

    got = json.loads(openai_error(status, body, "m"))["error"]
    assert set(got) == {"message", "type", "param", "code"}
    assert message in got["message"] and got["code"] == code
    assert isinstance(got["type"], str)
