"""A budget holds under concurrency and cut streams (issue 32, part 4): a key
allowed 100 tokens a minute, through a real gateway in front of a stand-in
engine, the official openai SDK as the client."""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest

from llmgw.core.contract import events as ev
from llmgw.gateway import quota

from .gateway_harness import spec
from .test_gateway_server import Setup, openai, setup  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)

KEY = "sk-thrifty-0123456789abcdef"


async def keyed(setup, delay: float = 0.0, **limits) -> None:  # noqa: F811
    a = await setup.engine("a", delay=delay)
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway()
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    await setup.log.publish(ev.ApiKeyApplied(at=1.0, name="thrifty", owner="org", key_sha256=digest, **limits))
    await setup.settle()


async def test_ten_concurrent_requests_get_no_more_than_the_minutes_tokens(setup):  # noqa: F811
    await keyed(setup, delay=1.0, tokens_per_minute=100)  # all ten in flight at once
    client = setup.client(KEY)

    async def one():
        try:
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=20)
            return r.usage.total_tokens
        except openai.RateLimitError as e:
            assert "tokens per minute of this API key (100)" in e.message
            assert int(e.response.headers["retry-after"]) >= 1
            return None

    got = await asyncio.gather(*(one() for _ in range(10)))
    served = [t for t in got if t is not None]
    # each reserved its prompt's estimate (a few) and 20: at most five fit in 100, the rest are told to wait
    assert 4 <= len(served) <= 5
    assert sum(served) <= 100 and len(setup.engines[0].requests) == len(served)


async def test_a_prompt_past_the_limit_never_reaches_an_engine(setup):  # noqa: F811
    await keyed(setup, tokens_per_minute=100)
    client = setup.client(KEY)
    with pytest.raises(openai.RateLimitError) as e:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 5000}])
    assert e.value.code == "request_too_large" and "tokens per minute of this API key (100)" in e.value.message
    assert "retry-after" not in e.value.response.headers  # it never fits: nothing to come back after
    assert setup.engines[0].requests == []


async def test_a_stream_cut_after_its_first_bytes_is_charged_its_prompt(setup):  # noqa: F811
    await keyed(setup, tokens_per_day=100_000)
    setup.engines[0].mode = "die-after:1"
    content = "word " * 400
    client = setup.client(KEY)
    with pytest.raises(Exception):
        async for _ in await client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], stream=True):
            pass
    body_len = len(setup.engines[0].requests[0]["messages"][0]["content"])
    gw = setup.gw
    for lease in gw.quotas.leases.values():
        lease.used_at = -math.inf  # idle: given back, what was used charged
    await gw.quotas.upkeep()
    (counter,) = [k for k in setup.bus.quotas if "tokens_per_day" in k]
    used = quota.decode(setup.bus.quotas[counter][0])
    assert used >= body_len // quota.BYTES_PER_TOKEN - quota.ENVELOPE_BYTES  # its prompt, estimated
    assert used < body_len  # and not its whole reservation
