"""A tiny harness for scenario tests of the pure core: events in, state and
decisions out, with the log kept exactly as the shell would write it."""

from __future__ import annotations

import asyncio
import itertools

from llmgw.core.contract import events as ev
from llmgw.core.rules.decide import decide
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State


def model(name: str, min_replicas: int = 1, gpus: int = 1, mem: float = 0.0, **kw) -> ev.ModelSpec:
    profiles = kw.pop("profiles", None) or [ev.ProfileSpec(name="default", gpus=gpus, gpu_memory_gb=mem)]
    return ev.ModelSpec(name=name, min_replicas=min_replicas, profiles=profiles, **kw)


class Fleet:
    def __init__(self) -> None:
        self.state = State()
        self.log: list[tuple[int, str, bytes]] = []
        self.now = 1000.0

    def publish(self, event: ev.Event, subject: str | None = None) -> int:
        seq = len(self.log) + 1
        subject = subject or ev.subject_for(event)
        data = ev.encode(event)
        self.log.append((seq, subject, data))
        apply(self.state, seq, subject, data)
        return seq

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    def apply(self, spec: ev.ModelSpec) -> None:
        self.publish(ev.ModelApplied(at=self.tick(), model=spec))

    def remove(self, name: str) -> None:
        self.publish(ev.ModelRemoved(at=self.tick(), name=name))

    def register(
        self,
        node: str,
        gpus: int = 8,
        mem: float = 80.0,
        running: list[ev.RunningShard] | None = None,
        *,
        gpu_model: str = "",
        memory_gb: float = 0.0,
        cpu_cores: int = 0,
        labels: dict[str, str] | None = None,
        power_w: float = 0.0,
        simulated: bool = False,
    ) -> None:
        self.publish(
            ev.NodeRegistered(
                at=self.tick(),
                node=node,
                gpus=[ev.Gpu(index=i, model=gpu_model, memory_gb=mem, power_w=power_w) for i in range(gpus)],
                memory_gb=memory_gb,
                cpu_cores=cpu_cores,
                labels=labels or {},
                running=running or [],
                simulated=simulated,
            )
        )

    def admit(self, node: str, **labels: str) -> None:
        """An operator sets a node's labels (`llmgw ctl label`, `ctl node
        admit`): the pool counts only this way (core/rules/admission.py)."""
        self.publish(ev.NodeLabeled(at=self.tick(), node=node, set=labels))

    def lose(self, node: str, reason: str = "no heartbeat") -> None:
        self.publish(ev.NodeLost(at=self.tick(), node=node, reason=reason))

    def decide(self) -> list[ev.Action]:
        """One control-plane pass: decide, publish, fold it back."""
        now = self.tick()
        actions = decide(self.state, now)
        if actions:
            self.publish(ev.Decided(at=now, basis=self.state.seq, actions=actions))
        return actions

    def report(self, shard_id: str, state: str, reason: str = "", generation: int | None = None) -> None:
        rep_id = shard_id.rpartition(".")[0]
        shard = next(s for s in self.state.replicas[rep_id].shards if s.id == shard_id)
        self.publish(
            ev.ShardStatus(
                at=self.tick(),
                node=shard.node,
                replica=rep_id,
                shard=shard_id,
                generation=shard.generation if generation is None else generation,
                state=state,
                reason=reason,
            )
        )

    def make_ready(self) -> None:
        """Every placed shard reports starting, loading, ready."""
        for rep in list(self.state.replicas.values()):
            for sh in rep.shards:
                if sh.state == "placing":
                    for st in ("starting", "loading", "ready"):
                        self.report(sh.id, st)

    def running_on(self, node: str) -> list[ev.RunningShard]:
        """What an agent on `node` would report running, from the state (a
        shard being stopped runs until it has exited: its drain)."""
        out = []
        for rep in self.state.replicas.values():
            for sh in rep.shards:
                if sh.node == node and sh.state in ("starting", "loading", "ready", "stopping"):
                    out.append(
                        ev.RunningShard(
                            shard=sh.id,
                            replica=rep.id,
                            model=rep.model,
                            profile=rep.profile,
                            generation=sh.generation,
                            rank=sh.rank,
                            gpus=sh.gpus,
                            port=sh.port,
                            state="ready" if sh.state == "stopping" else sh.state,
                            endpoint=sh.endpoint,
                            fingerprint=rep.fingerprint,
                        )
                    )
        return out

    def states(self) -> dict[str, str]:
        return {r.id: r.state for r in self.state.replicas.values()}

    # ------------------------------------------------------------------ the reconciler's inputs

    def load(self, model: str, in_flight: int = 0, queued: int = 0, gateway: str = "gw-1") -> None:
        """A gateway's load on a model (ModelLoad), now; busy means just used."""
        at = self.tick()
        last = at if in_flight or queued else 0.0
        self.publish(
            ev.ModelLoad(at=at, gateway=gateway, model=model, in_flight=in_flight, queued=queued, last_used=last)
        )

    def restart(self, *replicas: str, in_place: bool = False, max_surge: int = 0, max_unavailable: int = 0) -> None:
        """An operator's `llmgw ctl restart`."""
        self.publish(
            ev.ReplicasRestart(
                at=self.tick(),
                replicas=list(replicas),
                in_place=in_place,
                max_surge=max_surge,
                max_unavailable=max_unavailable,
            )
        )

    def retry(self, name: str) -> None:
        """An operator's `llmgw ctl retry`."""
        self.publish(ev.ModelRetry(at=self.tick(), name=name))

    def stopped(self, replica: str) -> None:
        """Every live shard of a replica reports it exited (the agent obeyed a stop)."""
        for sh in list(self.state.replicas[replica].shards):
            if sh.state not in ("failed", "stopped"):
                self.report(sh.id, "stopped")

    def ready(self, model: str) -> list[str]:
        """The model's replicas that serve: ready, not stopping."""
        return sorted(r.id for r in self.state.replicas.values() if r.model == model and r.state == "ready")


# --------------------------------------------------------------------------- for tests of the shell

_ids = itertools.count(1)


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait, within a bound, for a condition the shell brings about."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def publish(bus, event: ev.Event, subject: str | None = None) -> int:
    """Publish an event on a bus as its speaker would (or on `subject`)."""
    return await bus.publish(subject or ev.subject_for(event), ev.encode(event), msg_id=f"test-{next(_ids)}")
