"""Following the log over a real nats-server: a long stretch through the fast
reader, the rest and the live tail through nats-py, with nothing lost,
repeated or reordered at the handover, and a reader failing half-way."""

import asyncio

import pytest

from llmgw.bus import catchup
from llmgw.bus.nats import NatsBus
from llmgw.bus.nats_log import CATCHUP_MIN
from llmgw.core.contract import events as ev

pytestmark = pytest.mark.nats

N = CATCHUP_MIN * 3


async def fill(bus: NatsBus, n: int, first: int = 0) -> None:
    for start in range(first, first + n, 500):
        acks = []
        for i in range(start, min(start + 500, first + n)):
            e = ev.ModelRemoved(at=float(i), name=f"m{i}")
            acks.append(await bus.js.publish_async(ev.subject_for(e), ev.encode(e), headers={"Nats-Msg-Id": f"f{i}"}))
        await asyncio.gather(*acks)


async def collect(bus: NatsBus, start: int, until: int) -> list[tuple[int, str, bytes]]:
    got: list[tuple[int, str, bytes]] = []
    done = asyncio.Event()

    def on(seq, subject, data):
        got.append((seq, subject, data))
        if seq >= until:
            done.set()

    follower = await bus.follow(start, on)
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await follower.stop()
    return got


async def test_a_long_log_is_read_whole_in_order_and_the_live_tail_follows(nats_server):
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        await fill(bus, N)
        got: list[int] = []
        done = asyncio.Event()

        def on(seq, subject, data):
            got.append(seq)
            assert ev.decode(data).name == f"m{seq - 1}"
            if seq == N + 10:
                done.set()

        follower = await bus.follow(1, on)
        assert got == list(range(1, N + 1))  # caught up before follow returns
        await fill(bus, 10, first=N)  # the live tail, through nats-py
        await asyncio.wait_for(done.wait(), 30)
        await follower.stop()
        assert got == list(range(1, N + 11))
    finally:
        await bus.close()


async def test_following_from_the_middle_starts_there(nats_server):
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        await fill(bus, N)
        got = await collect(bus, 1200, N)
        assert [s for s, _, _ in got] == list(range(1200, N + 1))
        assert got[0][1] == "llmgw.ctl.model.removed"
    finally:
        await bus.close()


async def test_a_reader_that_fails_half_way_hands_over_without_a_gap(nats_server, monkeypatch):
    real = catchup.read_range

    async def failing(url, stream, start, last, on_message, timeout=30.0, **signed_in):
        def until_half(seq, subject, data):
            if seq > start + 700:
                raise ConnectionError("cut")
            on_message(seq, subject, data)

        return await real(url, stream, start, last, until_half, timeout, **signed_in)

    monkeypatch.setattr(catchup, "read_range", failing)
    bus = await NatsBus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        await fill(bus, N)
        got = await collect(bus, 1, N)
        assert [s for s, _, _ in got] == list(range(1, N + 1))
    finally:
        await bus.close()
