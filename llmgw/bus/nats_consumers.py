"""Following a stream on NATS: an ordered consumer kept alive by us as
well as by nats-py (`_Kept`), and a plain subscription (`_Sub`)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from nats.js.api import ConsumerConfig, DeliverPolicy

from .nats_trouble import describe_trouble

if TYPE_CHECKING:
    from .nats import NatsBus

log = logging.getLogger("llmgw.bus")

FOLLOW_CHECK_S = 2.0  # how often a follower looks whether its consumer stalled (_Kept)


class _Sub:
    """A plain subscription (an agent's commands: see follow_commands)."""

    def __init__(self, sub) -> None:
        self._sub = sub

    async def stop(self) -> None:
        try:
            await self._sub.unsubscribe()
        except Exception:  # the connection may be gone already
            pass


class _Kept:
    """An ordered consumer kept alive by us as well as by nats-py.

    nats-py resets an ordered consumer after two missed idle heartbeats
    (10 s), once: when its stream had no leader then (the stream leader's
    server killed, an election under way) the new consumer is not made, and
    the follower stays silent for good while the stream moves on. So every
    FOLLOW_CHECK_S this asks where the stream stands; when it is past what
    was delivered and nothing came since the last look, the consumer is made
    again from the next sequence. Messages are handed on once each, in
    order: a sequence at or below the last delivered is dropped (the two
    resets may overlap).
    """

    def __init__(self, bus: "NatsBus", what: str, subscribe, last_seq, on_msg, start_seq: int) -> None:
        self.bus, self.what = bus, what
        self._subscribe, self._last_seq, self._on_msg = subscribe, last_seq, on_msg
        self.delivered = start_seq - 1  # the last sequence handed on
        self._sub = None
        self._task: asyncio.Task | None = None
        self.restarts = 0

    async def start(self) -> "_Kept":
        self._sub = await self._subscribe(self.delivered + 1, self._deliver)
        self._task = asyncio.create_task(self._watch())
        return self

    def _deliver(self, seq: int, msg) -> None:
        if seq <= self.delivered:
            return
        self.delivered = seq
        self._on_msg(seq, msg)

    async def _watch(self) -> None:
        seen = self.delivered
        while True:
            await asyncio.sleep(FOLLOW_CHECK_S)
            if self.delivered != seen:
                seen = self.delivered
                continue
            try:
                last = await asyncio.wait_for(self._last_seq(), FOLLOW_CHECK_S)
            except Exception:
                continue  # the bus in trouble: look again later
            if last <= self.delivered:
                continue
            log.warning(
                "%s: nothing delivered past %d while the stream is at %d; following again from %d",
                self.what, self.delivered, last, self.delivered + 1,
            )  # fmt: skip
            await self._follow_again()

    async def _follow_again(self) -> None:
        old, self._sub = self._sub, None
        try:
            await old.unsubscribe()
        except Exception:
            pass
        try:
            self._sub = await self._subscribe(self.delivered + 1, self._deliver)
            self.restarts += 1
        except Exception as e:
            log.warning("%s: could not follow again yet (%s)", self.what, describe_trouble(e))
            self._sub = old  # try again at the next look

    async def follow_anew(self) -> None:
        """Its stream was made again (a memory bucket after its server's
        restart): its sequences begin again at 1, so all are followed from
        there, where the old last delivered would drop every one as seen."""
        self.delivered = 0
        await self._follow_again()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass


def _from(start_seq: int) -> ConsumerConfig:
    if start_seq <= 1:
        return ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)

