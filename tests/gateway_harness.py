"""A log for gateway tests: models, replicas made ready at given endpoints,
drained or failed, API keys, published on a bus the gateway follows."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import secrets
import time

from llmgw.bus import engine_key_name
from llmgw.bus.memory import MemoryBus
from llmgw.core.contract import events as ev
from llmgw.core.contract.catalog import fingerprint
from llmgw.gateway.server import Gateway

_ids = itertools.count(1)


def spec(name: str, min_replicas: int = 1, weight: float = 1.0, **kw) -> ev.ModelSpec:
    return ev.ModelSpec(
        name=name, min_replicas=min_replicas, profiles=[ev.ProfileSpec(name="p", gpus=0, weight=weight)], **kw
    )


class Log:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.numbers: dict[str, int] = {}
        self.ports = itertools.count(30000)
        self.generations: dict[str, int] = {}
        self.registered = False

    async def publish(self, event: ev.Event) -> int:
        return await self.bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"t-{next(_ids)}")

    async def model(self, s: ev.ModelSpec) -> None:
        await self.publish(ev.ModelApplied(at=time.time(), model=s))

    async def remove(self, name: str) -> None:
        await self.publish(ev.ModelRemoved(at=time.time(), name=name))

    async def replica(self, s: ev.ModelSpec, endpoint: str, state: str = "ready", identity: str = "", key: str = "") -> str:
        """Place a replica of `s` on node n1 and have it report `state` at `endpoint` (its engine given
        `identity`, and `key`, put in the engine keys bucket as an agent does; a random one when not said)."""
        if not self.registered:
            await self.publish(ev.NodeRegistered(at=time.time(), node="n1", gpus=[]))
            self.registered = True
        n = self.numbers[s.name] = self.numbers.get(s.name, 0) + 1
        rid = f"{s.name}-{n}"
        p = s.profiles[0]
        place = ev.PlaceReplica(
            replica=rid, model=s.name, profile=p.name, fingerprint=fingerprint(p), reason="test",
            shards=[ev.ShardPlacement(shard=f"{rid}.0", node="n1", rank=0, gpus=[], port=next(self.ports))],
        )  # fmt: skip
        seq = await self.publish(ev.Decided(at=time.time(), basis=0, actions=[place]))
        self.generations[rid] = seq
        await self.bus.put_engine_key(engine_key_name("n1", f"{rid}.0", seq), key or secrets.token_urlsafe(16))
        for st in ("starting", "loading", state):
            await self.status(rid, st, endpoint if st == "ready" else "", identity if st == "ready" else "")
        return rid

    async def status(self, rid: str, state: str, endpoint: str = "", identity: str = "") -> None:
        await self.publish(
            ev.ShardStatus(
                at=time.time(), node="n1", replica=rid, shard=f"{rid}.0", generation=self.generations[rid],
                state=state, endpoint=endpoint, identity=identity,
            )
        )  # fmt: skip

    async def drain(self, rid: str) -> None:
        await self.publish(ev.Decided(at=time.time(), basis=0, actions=[ev.StopReplica(replica=rid, reason="test", drain_s=30)]))

    async def key(self, name: str, owner: str, key: str, rpm: int = 0, tpm: int = 0) -> None:
        await self.publish(
            ev.ApiKeyApplied(
                at=time.time(), name=name, owner=owner, key_sha256=hashlib.sha256(key.encode()).hexdigest(),
                requests_per_minute=rpm, tokens_per_minute=tpm,
            )
        )  # fmt: skip


async def settle(gw: Gateway, bus: MemoryBus, timeout: float = 5.0) -> None:
    """Until the gateway has folded the whole log and rebuilt its table."""
    deadline = time.monotonic() + timeout
    while gw.state.seq < len(bus.log) or gw._dirty:
        if time.monotonic() > deadline:
            raise AssertionError("the gateway did not fold the log in time")
        await asyncio.sleep(0.005)
