"""The queue discipline of a saturated model (fairqueue.py, pure): classes
first, owners' fair shares within a class, bounded in size and in wait; and
a property: no owner within its share is starved, no queue passes its bound.
Then through a real gateway: a noisy neighbour's burst does not hold up a
steady tenant."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.core.folding.state import Owner
from llmgw.core.contract.events import Resources
from llmgw.gateway.fairqueue import FairQueue, weight_of

from .gateway_harness import spec
from .test_gateway_server import Setup, openai, setup  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


def drain(q: FairQueue) -> list:
    out = []
    while (e := q.pop()) is not None:
        out.append(e.item)
    return out


def test_a_burst_does_not_go_before_a_neighbour_who_came_after_it():
    q = FairQueue(100, 30.0)
    for i in range(6):
        q.push(f"a{i}", "a", 1.0, 0.0)
    q.push("b0", "b", 1.0, 0.1)
    q.push("b1", "b", 1.0, 0.2)
    assert drain(q) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]


def test_shares_follow_weights_and_critical_goes_first():
    q = FairQueue(100, 30.0)
    for i in range(6):
        q.push(f"a{i}", "a", 1.0, 0.0)
        q.push(f"g{i}", "g", 2.0, 0.0)
    q.push("c", "a", 1.0, 0.0, rank=0)
    got = drain(q)
    assert got[0] == "c"
    assert sum(x.startswith("g") for x in got[1:7]) == 4  # twice a's share: its weight


def test_the_queue_is_bounded_in_size_and_in_wait():
    q = FairQueue(2, 5.0)
    e1, _ = q.push(1, "a", 1.0, 0.0)
    q.push(2, "b", 1.0, 3.0)
    assert q.push(3, "c", 1.0, 3.0) == (None, None) and len(q) == 2  # none has more than c would
    assert [e.item for e in q.expired(5.5)] == [1] and len(q) == 1 and e1.gone
    q.remove(e1)  # twice: nothing more
    assert len(q) == 1 and drain(q) == [2] and len(q) == 0


def test_a_full_queue_pushes_out_the_last_of_the_longest_owner():
    q = FairQueue(4, 30.0)
    for i in range(4):
        q.push(f"a{i}", "a", 1.0, 0.0)
    entry, out = q.push("b0", "b", 1.0, 0.0)
    assert entry is not None and out.item == "a3" and len(q) == 4
    assert drain(q) == ["a0", "b0", "a1", "a2"]


def test_an_owners_weight_is_its_guarantee_up_the_tree():
    owners = {"org": Owner(guarantee=Resources(gpus=3)), "org/team": Owner()}
    assert weight_of("org/team", owners) == 4.0 and weight_of("other", owners) == 1.0 and weight_of("", owners) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    burst=st.integers(1, 60),
    others=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    bound=st.integers(8, 40),  # room for a round of the four owners, twice
)
def test_no_owner_within_its_share_is_starved_and_no_queue_passes_its_bound(burst, others, bound):
    """Unit service: one request a step. Owner `a` bursts; owners b, c, d each
    send at most one request every 4 steps (within their share: a quarter
    each of four equal owners): each of theirs is queued (a full queue pushes
    out a's) and served within 4 steps of coming, whatever a's burst."""
    q = FairQueue(bound, 1e9)
    for i in range(burst):
        q.push(("a", i, 0), "a", 1.0, 0.0)
    last = {"b": -10, "c": -10, "d": -10}
    for step, sent in enumerate(others):
        if sent and step - last["bcd"[sent - 1]] >= 4:  # within its share: else it does not send
            owner = "bcd"[sent - 1]
            last[owner] = step
            q.push((owner, step, step), owner, 1.0, float(step))  # past the bound: a's pushed out
        assert len(q) <= bound
        if sent and last["bcd"[sent - 1]] == step:
            assert any(not x.gone and x.item == (owner, step, step) for c in q.classes.values() for x in c.heap)
        e = q.pop()
        if e is not None and e.owner != "a":
            assert step - e.item[2] <= 4


async def test_a_noisy_neighbours_burst_does_not_hold_up_a_steady_tenant(setup):  # noqa: F811
    a = await setup.engine("a", delay=0.05)
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway(replica_slots=1, max_queue=100)
    await setup.log.key("noisy", "org-a", "sk-noisy-0123456789abcdef")
    await setup.log.key("steady", "org-b", "sk-steady-0123456789abcde")
    await setup.settle()
    noisy, steady = setup.client("sk-noisy-0123456789abcdef"), setup.client("sk-steady-0123456789abcde")
    ask = dict(model="m", messages=[{"role": "user", "content": "hi"}])
    burst = [asyncio.ensure_future(noisy.chat.completions.create(**ask)) for _ in range(30)]
    await asyncio.sleep(0.2)  # the burst queued
    assert setup.gw.waiting.queued("m") >= 20
    began = time.monotonic()
    await steady.chat.completions.create(**ask)
    waited = time.monotonic() - began
    done = sum(f.done() for f in burst)
    assert done < 15, f"the steady tenant waited behind {done} of the burst ({waited:.2f}s)"
    await asyncio.gather(*burst)
    assert setup.gw.waiting.queued("m") == 0


async def test_a_full_queue_is_429_and_a_long_wait_503_each_with_retry_after(setup):  # noqa: F811
    a = await setup.engine("a", delay=1.5)
    await setup.log.model(spec("m"))
    await setup.log.replica(spec("m"), a.endpoint)
    await setup.gateway(replica_slots=1, max_queue=1, max_queue_wait=0.5)
    await setup.settle()
    client = setup.client()
    ask = dict(model="m", messages=[{"role": "user", "content": "hi"}])
    first = asyncio.ensure_future(client.chat.completions.create(**ask))
    await asyncio.sleep(0.1)
    second = asyncio.ensure_future(client.chat.completions.create(**ask))  # queued
    await asyncio.sleep(0.1)
    with pytest.raises(openai.RateLimitError) as full:
        await client.chat.completions.create(**ask)
    assert full.value.code == "queue_full" and int(full.value.response.headers["retry-after"]) >= 1
    with pytest.raises(openai.InternalServerError) as late:
        await second
    assert late.value.status_code == 503 and late.value.code == "model_saturated"
    assert int(late.value.response.headers["retry-after"]) >= 1
    await first


async def test_a_slot_handed_to_a_waiter_is_not_handed_out_again_before_it_is_sent():
    """The woken waiter is not yet counted by its replica's outstanding: the
    slot it was given must not look free to the next waiter's tick (which
    once sent twice the engine's slots, and the engine queued a neighbour
    behind the burst)."""
    from types import SimpleNamespace

    from llmgw.core.folding.state import State
    from llmgw.gateway.config import GatewayConfig
    from llmgw.gateway.waiting import Waiting

    replica = SimpleNamespace(outstanding=1, weight=1.0)
    waiting = Waiting(GatewayConfig(replica_slots=1), lambda model: [replica], State())
    client = SimpleNamespace(closed=False)
    meter = SimpleNamespace(change=lambda *a, **k: None)
    waiters = [asyncio.ensure_future(waiting.turn("m", f"org-{i}", client, meter)) for i in range(3)]
    await asyncio.sleep(0)
    assert waiting.queued("m") == 3 and waiting.saturated("m")

    replica.outstanding = 0  # an answer ended: its slot freed...
    waiting.released("m")  # ...and handed to the first waiter, which has not run yet
    assert waiting.saturated("m"), "the handed slot looked free"
    if not waiting.saturated("m"):  # a waiter's tick, looking for room come otherwise, finds none...
        waiting.released("m")
    for _ in range(5):
        await asyncio.sleep(0)
    done = [w for w in waiters if w.done()]
    assert len(done) == 1 and done[0].result() is None
    replica.outstanding = 1  # ...the woken one sent: counted by its replica now
    assert waiting.saturated("m") and waiting.queued("m") == 2 and not waiting.granted
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert waiting.queued("m") == 0
