"""The limits every gateway holds together: the arithmetic (quota.py, pure),
the leases over a shared bucket (shared_limits.py, two of them on one
in-memory bus standing for two gateways), and a key allowed 100 tokens a
minute through a real gateway (issue 32, part 4)."""

from __future__ import annotations

import asyncio
import calendar
import json

import pytest

from llmgw.bus.memory import MemoryBus
from llmgw.core.folding.state import ApiKey, Owner
from llmgw.gateway import quota
from llmgw.gateway.config import GatewayConfig
from llmgw.gateway.quota import Kind, Limit, Refused
from llmgw.gateway.shared_limits import Grant, SharedLimits

pytestmark = pytest.mark.timeout(60)

NOON = calendar.timegm((2026, 12, 5, 12, 0, 0))


# ----------------------------------------------------------------- arithmetic


def test_a_rate_lets_a_minutes_burst_through_then_its_rate():
    tat = 0.0
    for _ in range(60):
        tat = quota.rate_take(tat, 1, 60, NOON)
        assert tat is not None
    assert quota.rate_take(tat, 1, 60, NOON) is None
    assert quota.rate_wait(tat, 1, 60, NOON) == pytest.approx(1.0)
    assert quota.rate_take(tat, 1, 60, NOON + 1.0) is not None  # one a second after
    assert quota.rate_give(tat, 60, 60, NOON) == NOON  # all given back: full, no fuller
    debt = quota.rate_charge(tat, 1000, 60, NOON)
    assert debt == NOON + 120  # a debt of at most a minute's worth


def test_budgets_count_in_their_utc_window():
    assert quota.window(Kind.TOKENS_PER_DAY, NOON) == ("2026-12-05", calendar.timegm((2026, 12, 6, 0, 0, 0)))
    assert quota.window(Kind.TOKENS_PER_MONTH, NOON) == ("2026-12", calendar.timegm((2027, 1, 1, 0, 0, 0)))
    assert quota.budget_take(90, 10, 100) == 100 and quota.budget_take(91, 10, 100) is None
    assert quota.budget_wait(Kind.TOKENS_PER_DAY, NOON) == 12 * 3600
    lim = Limit("key", "k.1", Kind.TOKENS_PER_DAY, 100)
    assert lim.counter(NOON) == "key.k=2E1.tokens_per_day.2026-12-05"
    assert lim.counter(NOON + 12 * 3600) == "key.k=2E1.tokens_per_day.2026-12-06"


def test_limits_count_up_the_owner_tree():
    key = ApiKey(owner="org/team", key_sha256="ab" * 32, requests_per_minute=10)
    owners = {"org": Owner(tokens_per_day=1000), "org/team": Owner(requests_per_minute=5), "other": Owner(requests_per_minute=1)}
    assert [(l.scope, l.name, l.kind, l.amount) for l in quota.limits_of("k", key, owners)] == [
        ("key", "k", Kind.REQUESTS_PER_MINUTE, 10),
        ("owner", "org/team", Kind.REQUESTS_PER_MINUTE, 5),
        ("owner", "org", Kind.TOKENS_PER_DAY, 1000),
    ]


def test_a_reservation_is_the_prompts_estimate_and_max_tokens():
    limits = (Limit("key", "k", Kind.TOKENS_PER_MINUTE, 100),)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "w " * 400}], "max_tokens": 20}).encode()
    prompt, tokens, given = quota.reservation(body, 256, limits)
    assert given and 180 < prompt < 230 and tokens == prompt + 20
    assert quota.too_large(limits, tokens) == limits[0]
    small = json.dumps({"model": "m", "prompt": "hi"}).encode()
    assert quota.reservation(small, 256, limits) == (0, 100, False)  # no max_tokens: at most the limit
    assert quota.decode(b"garbage") == 0.0 and quota.decode(quota.encode(12.5)) == 12.5


# ----------------------------------------------------------------- leases


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def gateways(n: int = 2, **kw) -> tuple[MemoryBus, Clock, list[SharedLimits]]:
    bus, clock = MemoryBus(), Clock(NOON)
    config = GatewayConfig(quota_lease=0.1, **kw)
    return bus, clock, [SharedLimits(bus, config, clock=clock) for _ in range(n)]


async def test_gateways_together_never_let_in_more_than_the_limit():
    bus, clock, gws = gateways(3)
    limits = (Limit("key", "k", Kind.REQUESTS_PER_MINUTE, 30),)
    served = 0
    for i in range(90):
        got = await gws[i % 3].reserve(limits, b"{}")
        served += isinstance(got, Grant)
    assert served == 30
    refused = await gws[0].reserve(limits, b"{}")
    assert isinstance(refused, Refused) and refused.status == 429 and refused.wait_s > 0
    assert "requests per minute of this API key (30)" in refused.message()
    clock.t += 10  # 5 more come back in 10 s, whoever asks
    for g in gws:
        await g.upkeep()
    served = sum([isinstance(await gws[i % 3].reserve(limits, b"{}"), Grant) for i in range(30)])
    assert served == 5


async def test_idle_leases_are_given_back_to_the_others():
    bus, clock, (a, b) = gateways(2, quota_lease_idle=1.0)
    limits = (Limit("key", "k", Kind.REQUESTS_PER_MINUTE, 100),)
    assert isinstance(await a.reserve(limits, b"{}"), Grant)
    await asyncio.sleep(0)  # a's top-up
    held = a.leases[limits[0].counter(NOON)].have
    assert held > 0
    clock.t += 0.001
    served_b = sum([isinstance(await b.reserve(limits, b"{}"), Grant) for _ in range(100)])
    assert served_b == 99 - held
    clock.t += 2.0  # a's lease idle: given back
    await a.upkeep()
    assert a.leases[limits[0].counter(NOON)].have == 0


async def test_tokens_are_settled_and_an_answer_past_its_reservation_is_charged():
    bus, clock, (a, b) = gateways(2)
    limits = (Limit("key", "k", Kind.TOKENS_PER_MINUTE, 100),)
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 30}).encode()
    g1 = await a.reserve(limits, body)
    assert isinstance(g1, Grant) and g1.tokens == 30
    a.settle(g1, 10, 0)  # 20 back into a's lease
    g2 = await a.reserve(limits, body)
    a.settle(g2, 200, 0)  # far past: a debt
    await a.upkeep()
    refused = await b.reserve(limits, body)
    assert isinstance(refused, Refused) and refused.limit == limits[0] and refused.wait_s > 60


async def test_a_spend_budget_counts_tokens_at_the_models_price():
    bus, clock, (a, b) = gateways(2)
    limits = (Limit("owner", "org", Kind.SPEND_PER_DAY, 1_000_000),)  # 1.00 a day
    assert quota.limits_of("k", ApiKey(owner="org", key_sha256="ab" * 32), {"org": Owner(spend_per_day=1.0)}) == limits
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 1000}).encode()
    price = (0.1, 0.3)  # per 1,000 tokens in and out: 1,000 out reserve 0.30
    for g in (a, b, a):
        got = await g.reserve(limits, body, price)
        assert isinstance(got, Grant)
        g.settle(got, 0, 1000)
    refused = await b.reserve(limits, body, price)  # 0.90 spent: 0.30 more would pass 1.00
    assert isinstance(refused, Refused) and "spend per day of owner org (1.00) budget" in refused.message()
    assert isinstance(await b.reserve(limits, body, (0.0, 0.0)), Grant)  # a model with no price costs nothing
    big = await a.reserve(limits, json.dumps({"model": "m", "prompt": "x", "max_tokens": 10_000}).encode(), price)
    assert isinstance(big, Refused) and big.too_large and "requested 3.0000" in big.message()


async def test_budgets_hold_until_the_next_utc_day():
    bus, clock, (a, b) = gateways(2)
    clock.t = calendar.timegm((2026, 12, 5, 23, 59, 0))
    limits = (Limit("owner", "org", Kind.TOKENS_PER_DAY, 1000),)
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 400}).encode()
    for g in (a, b):
        got = await g.reserve(limits, body)
        assert isinstance(got, Grant)
        g.settle(got, 400, 0)
    refused = await a.reserve(limits, body)
    assert isinstance(refused, Refused) and refused.wait_s == pytest.approx(60) and "budget" in refused.message()
    clock.t += 61  # a new day
    assert isinstance(await b.reserve(limits, body), Grant)


async def test_nats_not_answering_fails_open_under_the_local_count_or_closed():
    bus, clock, (a,) = gateways(1)
    limits = (Limit("key", "k", Kind.REQUESTS_PER_MINUTE, 10),)
    bus.quotas_down = True
    served = sum([isinstance(await a.reserve(limits, b"{}"), Grant) for _ in range(20)])
    assert served == 10  # open: this gateway's own count
    bus.quotas_down = False
    clock.t += a.config.quota_retry + 0.1
    await a.upkeep()  # what was let in meanwhile is charged to the shared counter
    value, _ = bus.quotas[limits[0].counter(clock.t)]
    assert quota.decode(value) >= clock.t + 60 - 5

    bus, clock, (c,) = gateways(1, quota_failure="closed")
    bus.quotas_down = True
    refused = await c.reserve(limits, b"{}")
    assert isinstance(refused, Refused) and refused.status == 503 and refused.code == "limits_unavailable"
