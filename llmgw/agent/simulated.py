"""A simulated node agent: the fleet simulator for tests and benchmarks.

It speaks the real agent's protocol, through the same module (protocol.py:
registration, signatures, term fencing, each command once, generations,
restarts in place), heartbeats and reports shard states, but runs no model:
a shard is "loading" after `loading_after` seconds and "ready" `ready_after`
seconds later, or "failed" when its model is in `fail_models` or a test asks
(`fail`). What it has acted on is kept in memory (protocol.InMemory): a
simulated node that restarts has no engines left to find again.

A ready shard of rank 0 serves a real HTTP engine (`sim_engine.SimEngine`)
on the port it reports as its endpoint; its answers name the
replica, the model and the node. It is given an identity as a real engine
is (`engines.identity`), reported with the shard, and a key of its own,
put in the engine keys bucket before it is reported ready and deleted when
it stops, as a real agent does. A shard that fails or stops closes its
port, as a crashed engine's would be.

Which port: given `engine_ports` (`llmgw agent --simulate --engine-ports`),
the node registers that range, as a real agent does, and each engine listens
on the port its placement gave it, so the replica's port is the one it
really listens on (`llmgw ctl describe`); one another program holds is said
in a NodePorts and the shard fails, as a real agent's start would. Without
it, the engine binds a port the system picks (ephemeral, outside the default
engine range): several simulated nodes on one host would otherwise be given
the same ports, and one once answered on the port a real engine was given.
It registers as `simulated`, so no real engine's profile is placed on it
(core/scheduling/fit.py) unless the catalog lets that profile run simulated.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from typing import Callable

import msgspec

from ..bus import Bus, engine_key_name, publish_fact
from ..bus.signing import Verifier
from ..bus.msgids import MsgIds
from ..core.folding import commands as cmds
from ..core.contract import events as ev
from . import power
from .agentfile import PortRange
from .engines import identity
from .protocol import MAX_TERM_JUMP, CommandProtocol, InMemory, replaced_reason, start_plan, stop_plan, wait_after
from .sim_engine import SimEngine

log = logging.getLogger("llmgw.agent")


class SimulatedAgent:
    def __init__(
        self,
        bus: Bus,
        name: str,
        gpus: int,
        *,
        gpu_memory_gb: float = 80.0,
        gpu_model: str = "SIM-80GB",
        memory_gb: float = 0.0,
        cpu_cores: int = 0,
        labels: dict[str, str] | None = None,
        loading_after: float = 0.1,
        ready_after: float = 0.5,
        fail_models: frozenset[str] = frozenset(),
        never_start: bool = False,
        heartbeat: float = 1.0,
        clock: Callable[[], float] = time.time,
        serve: bool = True,
        register_on_reconnect: bool = True,
        beats: bool = True,
        watts_per_gpu: float = 0.0,
        power_limit_w: float = 0.0,
        power_interval_s: float = power.MIN_INTERVAL_S,
        command_key: Verifier | None = None,
        max_term_jump: int = MAX_TERM_JUMP,
        engine_ports: PortRange | None = None,
    ) -> None:
        self.bus = bus
        self.name = name
        self.gpus = [
            ev.Gpu(index=i, model=gpu_model, memory_gb=gpu_memory_gb, power_w=power_limit_w) for i in range(gpus)
        ]
        # What it draws, measured as NVML would: watts_per_gpu for each GPU
        # of a ready shard (0: it measures nothing and sends no NodePower).
        self.watts_per_gpu = watts_per_gpu
        self.power = power.Coalescer(min_interval_s=power_interval_s)
        # 0: not said, which placement takes as no limit. Labels such as
        # llmgw.io/pool and llmgw.io/fabric (needed for multi-node profiles) come from the caller.
        self.memory_gb = memory_gb
        self.cpu_cores = cpu_cores
        self.labels = {"llmgw.io/simulated": "true", **(labels or {})}
        self.loading_after = loading_after
        self.ready_after = ready_after
        self.fail_models = fail_models
        # A node that takes what it is given and never starts it nor says so
        # (issue 35, finding 5: those replicas stayed "placing" for ever),
        # for the tests of the start deadline (core/rules/admission.py).
        self.never_start = never_start
        self.heartbeat = heartbeat
        self.clock = clock
        self.instance = uuid.uuid4().hex[:8]
        self.running: dict[str, ev.RunningShard] = {}
        self._tasks: dict[tuple[str, int], asyncio.Task] = {}  # by (shard, generation): its start, until done
        self._registering: set[asyncio.Task] = set()
        self.engines: dict[str, SimEngine] = {}  # by shard: those serving
        self.generations: dict[str, int] = {}  # by shard: the generation of the engine serving
        self._msg_ids = MsgIds(f"{self.name}-{self.instance}")  # unpredictable: see bus/msgids.py
        self.registered = asyncio.Event()
        # False: a ready shard serves no HTTP engine and reports no endpoint
        # (a fleet of thousands in one process, where nothing asks them).
        self.serve = serve
        # A fleet sharing one connection registers its nodes itself, all at once, on a reconnect.
        self.register_on_reconnect = register_on_reconnect
        self.beats = beats  # False: its fleet sends its heartbeats (llmgw/agent/fleet.py)
        self.silent = False  # as a machine that died: no heartbeat, no command heard (`silence`)
        # Whose commands it obeys, and once each, as a real agent (protocol.py); a fleet says so once for all.
        self.protocol = CommandProtocol(name, command_key, InMemory(), self, max_term_jump=max_term_jump)
        self.gate = self.protocol.gate
        # The engine ports it registers and listens on (None: none said; see the module's doc),
        # and those of them another program held when a start met them.
        self.engine_ports = engine_ports
        self.taken: set[int] = set()

    @property
    def stale_commands(self) -> int:
        """Commands of an older term, ignored."""
        return self.gate.refused["stale term"]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.bus.ensure_streams()
        if self.register_on_reconnect:  # alone (a fleet says it once for all its nodes)
            self.gate.say_how()
        # Commands, then the registration; again on a reconnect unless its fleet does that.
        follower = await self.protocol.listen(self.bus, on_reconnect=self.register_on_reconnect)
        await self.registered.wait()
        # (said once per node alone; a fleet's thousands say it once for all)
        log.log(logging.INFO if self.register_on_reconnect else logging.DEBUG, "node %s registered with %d GPUs", self.name, len(self.gpus))
        try:
            while not stop.is_set():
                try:
                    if self.beats and not self.silent:
                        await self.bus.beat(self.name, self.beat_body())
                except Exception as e:
                    log.warning("heartbeat failed: %s", e)
                if not self.silent:  # (a machine lost measures nothing either)
                    await self._measure()
                try:
                    await asyncio.wait_for(stop.wait(), self.heartbeat)
                except asyncio.TimeoutError:
                    pass
        finally:
            await follower.stop()
            for t in [*self._tasks.values(), *self._registering]:
                t.cancel()
            for engine in self.engines.values():
                await engine.stop()
            self.engines.clear()

    def beat_body(self) -> bytes:
        return msgspec.json.encode({"at": self.clock(), "agent": self.instance})

    async def silence(self, on: bool) -> None:
        """Fall silent as a machine that died (no heartbeat, commands unheard:
        the control plane declares the node lost after its grace), or speak
        again, registering anew with what still runs."""
        was, self.silent = self.silent, on
        if was and not on:
            await self._register()

    def drawn(self) -> dict[int, float]:
        """Watts per GPU index, as measured: watts_per_gpu on the GPUs of ready shards, 0 elsewhere."""
        busy = {g for s in self.running.values() if s.state == "ready" for g in s.gpus}
        return {g.index: self.watts_per_gpu if g.index in busy else 0.0 for g in self.gpus}

    async def _measure(self) -> None:
        """A NodePower when the draw changed by enough (power.Coalescer)."""
        if not self.watts_per_gpu:
            return
        gpus = self.drawn()
        watts = sum(gpus.values())
        if self.power.due(watts, self.clock()):
            await self._emit(ev.NodePower(at=self.clock(), node=self.name, watts=watts, gpus=gpus))

    async def _register(self) -> None:
        """Publish its registration (what runs now), and say it registered."""
        self.power.reset()
        await self._emit(
            ev.NodeRegistered(
                at=self.clock(),
                node=self.name,
                gpus=self.gpus,
                running=list(self.running.values()),
                agent=f"simulated/{self.instance}",
                memory_gb=self.memory_gb,
                cpu_cores=self.cpu_cores,
                labels=dict(self.labels),
                simulated=True,
                port_first=self.engine_ports.first if self.engine_ports else 0,
                port_last=self.engine_ports.last if self.engine_ports else 0,
                ports_taken=sorted(self.taken),
            )
        )
        self.registered.set()

    def _on_command(self, data: bytes) -> None:
        if not self.silent:  # (a machine lost hears nothing)
            self.protocol.on_command(data)

    @property
    def duplicates(self) -> int:
        """Commands ignored as acted on already."""
        return self.protocol.duplicates

    # What the protocol asks of it (protocol.Actions), each admitted once.

    def start_shard(self, cmd: cmds.StartShard) -> None:
        key = (cmd.shard, cmd.generation)
        task = self._tasks[key] = asyncio.create_task(self._start(cmd))
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)

    def stop_shard(self, cmd: cmds.StopShard) -> None:
        task = self._tasks.pop((cmd.shard, cmd.generation), None)  # its start, if under way: no further
        if task is not None:
            task.cancel()
        asyncio.create_task(self._stop(cmd))

    def register(self, why: str) -> None:
        task = asyncio.create_task(self._register())
        self._registering.add(task)
        task.add_done_callback(self._registering.discard)

    def _cancel_starts(self, shard: str, below: int) -> None:
        """Stop the starts of `shard` under way of a generation below `below`."""
        for (s, g), task in list(self._tasks.items()):
            if s == shard and g < below:
                del self._tasks[(s, g)]
                task.cancel()

    async def _start(self, cmd: cmds.StartShard) -> None:
        if self.never_start:
            return
        await wait_after(cmd, self.running.__contains__, poll=0.02)  # in place of others: until they have exited
        if self.protocol.stopped_since(cmd):
            return  # stopped before it started
        current = self.running.get(cmd.shard)
        plan = start_plan(current.generation if current else None, cmd)
        if plan == "runs already":
            return
        if current is not None:  # replaced: the older generation stops first, and says so
            self._cancel_starts(cmd.shard, cmd.generation)
            del self.running[cmd.shard]
            await self._close(cmd.shard)
            await self._status(current.replica, cmd.shard, current.generation, "stopped", reason=replaced_reason(cmd))
        shard = ev.RunningShard(
            shard=cmd.shard,
            replica=cmd.replica,
            model=cmd.model,
            profile=cmd.profile.name,
            generation=cmd.generation,
            rank=cmd.rank,
            gpus=cmd.gpus,
            port=cmd.port,
            state="starting",
            fingerprint=cmd.fingerprint,
        )
        self.running[cmd.shard] = shard
        await self._status(cmd.replica, cmd.shard, cmd.generation, "starting")
        await asyncio.sleep(self.loading_after)
        shard.state = "loading"
        await self._status(cmd.replica, cmd.shard, cmd.generation, "loading")
        await asyncio.sleep(self.ready_after)
        if cmd.model in self.fail_models:
            self.running.pop(cmd.shard, None)
            await self._status(cmd.replica, cmd.shard, cmd.generation, "failed", reason="simulated failure")
            return
        endpoint = me = ""
        if cmd.rank == 0 and self.serve:  # the replica's endpoint; the other ranks answer no one, as real ones
            me = identity(cmd.model, cmd.shard, cmd.generation)
            says = f"simulated replica {cmd.replica} of {cmd.model} on node {self.name}"
            key = secrets.token_hex(32)
            engine = SimEngine(cmd.model, identity=me, says=says, key=key)
            try:
                await engine.start(cmd.port if self.engine_ports else 0)
            except OSError as e:  # its port is another program's: said, then failed, as a real agent does
                self.taken.add(cmd.port)
                await self._emit(ev.NodePorts(at=self.clock(), node=self.name, taken=sorted(self.taken)))
                self.running.pop(cmd.shard, None)
                await self._status(cmd.replica, cmd.shard, cmd.generation, "failed",
                                   reason=f"port {cmd.port} on 127.0.0.1 is taken by another process ({e.strerror})")
                return
            self.engines[cmd.shard] = engine
            self.generations[cmd.shard] = cmd.generation
            await self.bus.put_engine_key(engine_key_name(self.name, cmd.shard, cmd.generation), key)
            endpoint = engine.endpoint
        shard.state, shard.endpoint, shard.identity = "ready", endpoint, me
        await self._status(cmd.replica, cmd.shard, cmd.generation, "ready", endpoint=endpoint, identity=me)
        await self._measure()  # after the report: a measurement covers the shards ready when it is folded

    async def _close(self, shard_id: str) -> None:
        engine = self.engines.pop(shard_id, None)
        if engine is not None:
            await engine.stop()
            name = engine_key_name(self.name, shard_id, self.generations.pop(shard_id, 0))
            try:
                await self.bus.delete_engine_key(name)
            except Exception as e:  # the engine is gone: its key opens nothing
                log.warning("deleting the key of %s failed: %s", name, e)

    async def _stop(self, cmd: cmds.StopShard) -> None:
        shard = self.running.get(cmd.shard)
        if stop_plan(shard.generation if shard else None, cmd) == "not here":
            # Nothing of that generation runs here (what does is not touched): it is stopped.
            await self._status(cmd.shard.rpartition(".")[0], cmd.shard, cmd.generation, "stopped", reason=cmd.reason)
            return
        if cmd.grace_s:
            # Draining: a simulated engine finishes what it has at once, nearly.
            await asyncio.sleep(min(cmd.grace_s, 0.05))
        if self.running.get(cmd.shard) is shard:
            del self.running[cmd.shard]
            await self._close(cmd.shard)
        await self._status(shard.replica, cmd.shard, cmd.generation, "stopped", reason=cmd.reason)  # type: ignore[union-attr]

    async def fail(self, shard_id: str, reason: str = "failed on request") -> bool:
        """Make a running shard fail, as a crashed engine would."""
        shard = self.running.pop(shard_id, None)
        if shard is None:
            return False
        self._cancel_starts(shard_id, shard.generation + 1)
        await self._close(shard_id)
        await self._status(shard.replica, shard.shard, shard.generation, "failed", reason=reason)
        return True

    async def _status(self, replica: str, shard: str, generation: int, state: str, **kw) -> None:
        await self._emit(
            ev.ShardStatus(
                at=self.clock(), node=self.name, replica=replica, shard=shard, generation=generation, state=state, **kw
            )
        )

    async def _emit(self, event: ev.Event) -> None:
        """Publish a fact, retrying (same Msg-Id) until the bus takes it."""
        await publish_fact(self.bus, event, next(self._msg_ids))
