"""The gateways' prefix hints on core NATS (gateway/hints.py says what they
are): published without an ack and not kept, since a hint lost costs a cold
prefill at worst, and one kept would be replayed to no one."""

from __future__ import annotations

from typing import Callable

from . import HINTS_PREFIX


class Hints:
    async def hint(self, gateway: str, data: bytes) -> None:
        await self.nc.publish(f"{HINTS_PREFIX}.{gateway}", data)

    async def follow_hints(self, on_hint: Callable[[str, bytes], None]):
        """`on_hint(gateway, data)` for each hint of any gateway (this one's too:
        the caller skips its own). nats-py subscribes again after a reconnect."""
        skip = len(HINTS_PREFIX) + 1

        async def cb(msg) -> None:
            on_hint(msg.subject[skip:], msg.data)

        return await self.nc.subscribe(f"{HINTS_PREFIX}.*", cb=cb)
