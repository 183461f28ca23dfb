"""The node agent: runs the inference engines the control plane asks this node for.

It speaks the protocol the simulated agent does (`simulated.py`), for real:

The command protocol (registration, term fencing, signatures, at most
once, generations) is protocol.py's, shared with the simulated agent; this
module does what it decides, for real.

- Registration. When it starts, and after every reconnect or when asked
  (`Reregister`), it publishes `NodeRegistered` with its inventory and every
  shard it runs, complete: the control plane adopts what is listed and fails
  what it believed ran here and is not. The list is built when the event is
  published, not when it was asked for, after every event said before.
- Adoption. Before registering, it reads its state file (`statefile.py`) and
  keeps each engine whose runner is still alive with the recorded command
  line; it never starts a second copy of one. An engine that ended while the
  agent was away is reported failed with its exit code or signal and its last
  log lines (the runner recorded them), or stopped if it was being stopped.
- Commands come only on its node's subject, and it acts only on those the
  control plane signed for this node, in a term it may act in, each
  (shard, generation, kind) once (protocol.py). The highest term and the
  commands acted on are kept in the state file (statefile.StateMemory),
  written before acting: across a restart too.
- Shard states: `starting` once the engine process is started, `loading` once
  it answers HTTP but is not healthy yet, `ready` once its health check
  answers 200 (llama.cpp, vLLM, SGLang: `/health`; a command: `/v1/models`),
  `failed` with a reason (it could not be started: no program, no model
  file, port taken; it exited, with the code or signal and its last log
  lines; not healthy within `start_timeout_s`; or no longer answering for
  `unhealthy_after` seconds, after which it is stopped), and `stopped`.
- Stop: with a grace (`StopShard.grace_s`) it drains first (the engine's
  in-flight gauges reach 0, or the grace runs out; the whole grace for an
  engine without metrics), then SIGTERM, then SIGKILL after the agent file's
  `stop_timeout_s`. The gateway stops routing to a draining replica.
- Ports. It tells the control plane its engine port range (the agent
  file's `engine_ports`) and which ports of it another program holds (in the
  registration, in a `NodePorts` before the failure of a start refused for
  it, and again once a heartbeat finds one of them free; `ports.py`), so
  that they are not handed out again.
- Engine keys. Each start makes its engine a key (`secrets.token_hex`: never a leading "-", which a template's `--key {key}` read as a flag),
  kept in the state file (an adopting agent keeps it) and put in the bus's
  engine keys bucket before the shard can be reported ready (the outbox
  keeps the order), under `engine_key_name(node, shard, generation)`; it is
  deleted there when the engine has exited. The agent's own health checks
  and drains send it too. Never in the log.
- Liveness goes to the heartbeat bucket (latest only), never to the log; the
  log gets state changes only.
- Events are published in the order they happened, each retried with its own
  `Nats-Msg-Id` until NATS takes it, so a NATS outage delays the story but
  does not reorder or repeat it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import msgspec

from ..bus import Bus, engine_key_name, publish_fact, until_taken
from ..bus.signing import Verifier
from ..bus.msgids import MsgIds
from ..core.folding import commands as cmds
from ..core.contract import events as ev
from . import logs as engine_logs
from . import power
from . import ports as engine_ports
from . import supervisor as sv
from .agentfile import AgentFile
from .engines import EngineError, build
from .inventory import Inventory, discover
from .protocol import CommandProtocol, replaced_reason, start_plan, stop_plan, wait_after
from .statefile import AgentState, ShardRecord, StateFile, StateMemory
from .weights import resolve

log = logging.getLogger("llmgw.agent")

_REGISTER = object()  # an outbox item: the registration, built when it is published


class _Key(msgspec.Struct, frozen=True):
    """An outbox item: an engine's key to put in the engine keys bucket ("" : to delete)."""

    name: str
    key: str = ""


class StateDirTaken(RuntimeError):
    pass


class NodeAgent:
    def __init__(
        self,
        bus: Bus,
        name: str,
        *,
        state_dir: str | Path,
        agent_file: AgentFile | None = None,
        inventory: Inventory | None = None,
        heartbeat: float = 1.0,
        check_interval: float = 0.1,
        ready_interval: float = 1.0,
        unhealthy_after: float = 30.0,
        stop_engines_on_exit: bool = False,
        model_dirs: tuple[Path, ...] = (),
        python: str = sys.executable,
        clock: Callable[[], float] = time.time,
        command_key: Verifier | None = None,
    ) -> None:
        self.bus = bus
        self.name = name
        self.agent_file = agent_file or AgentFile()
        self.inventory = inventory or discover(self.agent_file)
        self.state_dir = Path(state_dir).resolve()
        self.statefile = StateFile(self.state_dir)
        self.state = AgentState(node=name)
        # Whose commands it obeys (those the control plane signed with this key; None: any, unsigned),
        # and what it remembers of them (its state file, once adopt() has read it).
        self.protocol = CommandProtocol(
            name, command_key, StateMemory(self.statefile, self.state), self, max_term_jump=self.agent_file.max_term_jump
        )
        self.gate = self.protocol.gate
        self.heartbeat = heartbeat
        self.check_interval = check_interval
        self.ready_interval = ready_interval
        self.unhealthy_after = unhealthy_after
        self.stop_engines_on_exit = stop_engines_on_exit
        self.model_dirs = model_dirs
        self.python = python
        self.clock = clock
        self.instance = uuid.uuid4().hex[:8]
        self.procs: dict[str, sv.Proc] = {}
        self.adopted: list[str] = []
        self.times: dict[str, dict[str, float]] = {}  # shard -> moment (monotonic) of each step, for benchmarks
        self.registered = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        self._watchers: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._msg_ids = MsgIds(f"{self.name}-{self.instance}")  # unpredictable: see bus/msgids.py
        # The ports of its range another program holds, as last said (ports.py).
        self.taken_ports = engine_ports.TakenPorts(
            name, self.agent_file.address, self.agent_file.engine_ports, self._own_ports, self._outbox.put_nowait, clock
        )
        self.power = power.Coalescer()  # which power readings become NodePower events

    # ----------------------------------------------------------------- the service

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        self.adopt()
        publisher = asyncio.create_task(self._publish_loop())
        follower = logs_sub = None
        try:
            await self.bus.ensure_streams()
            logs_sub = await self._serve_logs()
            self.gate.say_how()
            follower = await self.protocol.listen(self.bus)  # commands, then the registration
            for shard in self.adopted:
                self._watch(shard)
                if self.state.shards[shard].stopping:
                    # The previous run was stopping it when it went: finish the stop.
                    self._spawn_task(self._terminate(shard))
            log.info(
                "node %s: %s; adopted %d running engine(s)%s",
                self.name, self.inventory.describe(), len(self.adopted),
                f" ({', '.join(self.adopted)})" if self.adopted else "",
            )  # fmt: skip
            while not stop.is_set():
                try:
                    beat = {"at": self.clock(), "agent": self.instance, "shards": len(self.procs)}
                    await self.bus.beat(self.name, msgspec.json.encode(beat))
                except Exception as e:
                    log.warning("heartbeat failed: %s", e)
                self.taken_ports.heartbeat()
                self._power()
                try:
                    await asyncio.wait_for(stop.wait(), self.heartbeat)
                except asyncio.TimeoutError:
                    pass
        finally:
            if follower is not None:
                await follower.stop()
            if logs_sub is not None:
                try:
                    await logs_sub.unsubscribe()
                except Exception:
                    pass
            if self.stop_engines_on_exit and stop.is_set():
                # Asked to stop (not an error on the way out: an agent that
                # crashed is started again and adopts its engines).
                await self.stop_all("the agent stopped, and stops its engines with it")
            for task in list(self._watchers.values()) + list(self._tasks):
                task.cancel()
            await self._flush(5.0)
            publisher.cancel()
            self._save()

    async def _flush(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._outbox.join(), timeout)
        except asyncio.TimeoutError:
            log.warning("%d event(s) not published before stopping", self._outbox.qsize())

    async def stop_all(self, reason: str) -> None:
        """Stop every engine (Ctrl-C of `llmgw up`) and report them stopped."""
        for rec in self.state.shards.values():
            rec.stopping, rec.stop_reason = True, rec.stop_reason or reason
        self._save()
        await asyncio.gather(*(self._terminate(s) for s in list(self.procs)), return_exceptions=True)
        watchers = [t for t in self._watchers.values() if not t.done()]
        if watchers:
            await asyncio.wait(watchers, timeout=5.0)

    # ----------------------------------------------------------------- adoption

    def adopt(self) -> None:
        """Find again the engines a previous run of this agent started."""
        saved = self.statefile.load()
        if saved.node and saved.node != self.name:
            raise StateDirTaken(
                f"{self.statefile.path} belongs to node {saved.node}, not {self.name}: give each agent its own --state-dir"
            )
        saved.node = self.name
        self.state = saved
        self.protocol.memory = StateMemory(self.statefile, saved)
        for shard, rec in list(saved.shards.items()):
            proc = sv.Proc(pid=rec.pid, argv=rec.argv, log=Path(rec.log), status=Path(rec.status))
            if rec.pid and sv.is_ours(rec.pid, rec.argv):
                self.procs[shard] = proc
                self.adopted.append(shard)
                if rec.key:  # again: the previous run may have gone before it was put
                    self._outbox.put_nowait(_Key(self._key_name(rec), rec.key))
                continue
            del saved.shards[shard]
            if rec.key:
                self._outbox.put_nowait(_Key(self._key_name(rec)))
            if rec.pid == 0:
                state, reason = "failed", "the agent stopped before it started the engine"
            elif rec.stopping and not rec.failure:
                state, reason = "stopped", rec.stop_reason
            else:
                state, reason = "failed", rec.failure or sv.exit_reason(proc, while_away=True)
            log.warning("shard %s (generation %d) is no longer running: %s", shard, rec.generation, reason)
            self._status(rec, state, reason)
            proc.status.unlink(missing_ok=True)
        self._save()

    def _save(self) -> None:
        self.statefile.save(self.state)

    def _key_name(self, rec: ShardRecord) -> str:
        return engine_key_name(self.name, rec.shard, rec.generation)

    # ----------------------------------------------------------------- commands

    @property
    def duplicates(self) -> int:
        """Commands ignored as acted on already."""
        return self.protocol.duplicates

    def _on_command(self, data: bytes) -> None:
        self.protocol.on_command(data)

    # What the protocol asks of it (protocol.Actions), each admitted once.

    def start_shard(self, cmd: cmds.StartShard) -> None:
        self.times[cmd.shard] = {"command": time.monotonic()}
        self._spawn_task(self._start(cmd))

    def stop_shard(self, cmd: cmds.StopShard) -> None:
        self._spawn_task(self._stop(cmd))

    def register(self, why: str) -> None:
        self._outbox.put_nowait(_REGISTER)  # built when published, after all said before

    def _spawn_task(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lock(self, shard: str) -> asyncio.Lock:
        # Start and stop of one shard take turns, in the order they came.
        return self._locks.setdefault(shard, asyncio.Lock())

    async def _start(self, cmd: cmds.StartShard) -> None:
        await wait_after(cmd, self.state.shards.__contains__)  # in place of others: until they have exited
        async with self._lock(cmd.shard):
            if self.protocol.stopped_since(cmd):
                return  # stopped before it started
            current = self.state.shards.get(cmd.shard)
            plan = start_plan(current.generation if current else None, cmd)
            if plan == "runs already":
                log.info("%s generation %d runs already: not starting generation %d",
                         cmd.shard, current.generation, cmd.generation)  # type: ignore[union-attr]  # fmt: skip
                return
            if plan == "replace":
                current.stopping, current.stop_reason = True, replaced_reason(cmd)  # type: ignore[union-attr]
                self._save()
                await self._terminate(cmd.shard)
                watcher = self._watchers.get(cmd.shard)
                if watcher is not None:
                    await asyncio.wait({watcher}, timeout=10.0)
            rec = ShardRecord(
                shard=cmd.shard, replica=cmd.replica, model=cmd.model, profile=cmd.profile.name,
                generation=cmd.generation, rank=cmd.rank, gpus=list(cmd.gpus), port=cmd.port,
                host=self.agent_file.address, endpoint=f"http://{self.agent_file.address}:{cmd.port}",
                fingerprint=cmd.fingerprint, key=secrets.token_hex(32),
            )  # fmt: skip
            try:
                weights = resolve(cmd.profile.model or cmd.model, self.agent_file.models, self.model_dirs)
                launch = build(
                    cmd, host=rec.host, model=weights, engines=self.agent_file.engines,
                    templates=self.agent_file.templates, python=self.python, key=rec.key,
                )
            except EngineError as e:
                self._fail_at_start(rec, str(e))
                return
            if sv.port_taken(rec.host, cmd.port):
                self.taken_ports.refused(cmd.port)
                self._fail_at_start(rec, f"port {cmd.port} on {rec.host} is taken by another process")
                return
            run_dir = self.state_dir / "run"
            rec.log = str(engine_logs.log_path(self.state_dir, cmd.shard))
            rec.status = str(run_dir / f"{engine_logs.file_name(cmd.shard)[:-4]}.g{cmd.generation}.json")
            rec.health, rec.metrics, rec.inflight = launch.health, launch.metrics, list(launch.inflight)
            rec.identity = launch.identity
            rec.started_at = self.clock()
            # Recorded before it exists: a crash now leaves a record without a
            # pid, reported as never started when the agent comes back.
            self.state.shards[cmd.shard] = rec
            self._save()
            self._outbox.put_nowait(_Key(self._key_name(rec), rec.key))  # before any state it reports
            try:
                proc = sv.spawn(
                    launch, log=Path(rec.log), status=Path(rec.status), shard=cmd.shard, generation=cmd.generation,
                    python=self.python,
                )  # fmt: skip
            except OSError as e:
                del self.state.shards[cmd.shard]
                self._save()
                self._outbox.put_nowait(_Key(self._key_name(rec)))
                self._fail_at_start(rec, f"could not start the engine: {e}")
                return
            rec.pid, rec.argv = proc.pid, proc.argv
            self._save()
            self.procs[cmd.shard] = proc
            self.times.setdefault(cmd.shard, {})["spawned"] = time.monotonic()
            log.info(
                "started %s (generation %d) on port %d: pid %d, log %s", cmd.shard, cmd.generation, cmd.port, proc.pid, rec.log
            )
            self._status(rec, "starting")
            self._watch(cmd.shard)

    # ----------------------------------------------------------------- its ports and its power, once a heartbeat

    def _own_ports(self) -> set[int]:
        return {r.port for r in self.state.shards.values() if r.port}

    def _power(self) -> None:
        """Once a heartbeat: what the GPUs draw, as a NodePower when it
        changed by enough (power.Coalescer); only where NVML found the GPUs."""
        if self.inventory.gpu_source != "nvml":
            return
        gpus = power.nvml_power()
        if gpus is None:
            return
        watts = round(sum(gpus.values()), 1)
        if self.power.due(watts, self.clock()):
            self._outbox.put_nowait(ev.NodePower(at=self.clock(), node=self.name, watts=watts, gpus=gpus))

    def _fail_at_start(self, rec: ShardRecord, reason: str) -> None:
        log.warning("%s (generation %d) cannot start: %s", rec.shard, rec.generation, reason)
        self._status(rec, "failed", reason)

    async def _stop(self, cmd: cmds.StopShard) -> None:
        async with self._lock(cmd.shard):
            rec = self.state.shards.get(cmd.shard)
            running = rec.generation if rec is not None and cmd.shard in self.procs else None
            if stop_plan(running, cmd) == "not here":
                # Nothing of that incarnation runs here: it is stopped.
                replica = cmd.shard.rpartition(".")[0]
                self._outbox.put_nowait(
                    ev.ShardStatus(
                        at=self.clock(), node=self.name, replica=replica, shard=cmd.shard,
                        generation=cmd.generation, state="stopped", reason=cmd.reason,
                    )
                )  # fmt: skip
                return
            if rec.stopping:
                return
            rec.stopping, rec.stop_reason = True, cmd.reason
            self._save()
            log.info("stopping %s (generation %d), grace %gs: %s", cmd.shard, cmd.generation, cmd.grace_s, cmd.reason)
            await self._drain(rec, cmd.grace_s)
            await self._terminate(cmd.shard)

    async def _drain(self, rec: ShardRecord, grace: float) -> None:
        """Let the requests in flight finish: until the engine's gauges say none, or the grace is over."""
        if grace <= 0:
            return
        proc = self.procs.get(rec.shard)
        deadline = time.monotonic() + grace
        if rec.metrics and rec.inflight:
            names = tuple(rec.inflight)
            while time.monotonic() < deadline and proc is not None and sv.alive(proc):
                got = await sv.http_get(rec.host, rec.port, rec.metrics, timeout=2.0, key=rec.key)
                n = sv.inflight(got[1], names) if got is not None and got[0] == 200 else None
                if n is None:
                    break  # no metrics after all: the whole grace
                if n == 0:
                    log.info("%s drained", rec.shard)
                    return
                await asyncio.sleep(0.25)
        while time.monotonic() < deadline and proc is not None and sv.alive(proc):
            await asyncio.sleep(0.1)

    async def _terminate(self, shard: str) -> None:
        proc = self.procs.get(shard)
        if proc is not None:
            await sv.terminate(proc, self.agent_file.stop_timeout_s)

    # ----------------------------------------------------------------- watching an engine

    def _watch(self, shard: str) -> None:
        task = asyncio.create_task(self._watch_loop(shard))
        self._watchers[shard] = task

    async def _watch_loop(self, shard: str) -> None:
        rec = self.state.shards[shard]
        proc = self.procs[shard]
        times = self.times.setdefault(shard, {})
        unhealthy_since = 0.0
        last_answer = "no answer"
        while sv.alive(proc):
            if rec.stopping:
                await asyncio.sleep(0.05)
                continue
            got = await sv.http_get(rec.host, rec.port, rec.health, timeout=5.0, key=rec.key)
            now = time.monotonic()
            if got is not None and "answering" not in times:
                times["answering"] = now
            if got is not None and got[0] == 200:
                unhealthy_since = 0.0
                if rec.state != "ready":
                    times["ready"] = now
                    rec.state = "ready"
                    self._save()
                    log.info("%s is ready at %s", shard, rec.endpoint)
                    self._status(rec, "ready")
            else:
                last_answer = f"HTTP {got[0]}" if got is not None else "no answer"
                if got is not None and rec.state == "starting":
                    rec.state = "loading"
                    self._save()
                    self._status(rec, "loading")
                if rec.state == "ready":
                    unhealthy_since = unhealthy_since or now
                    if now - unhealthy_since >= self.unhealthy_after:
                        await self._stop_failed(
                            rec, f"engine stopped answering {rec.health} for {self.unhealthy_after:g}s ({last_answer})"
                        )
                elif self.clock() - rec.started_at >= self.agent_file.start_timeout_s:
                    limit = self.agent_file.start_timeout_s
                    await self._stop_failed(
                        rec, f"engine not healthy {limit:g}s after it started ({rec.health}: {last_answer})"
                    )
            if sv.alive(proc):
                await asyncio.sleep(self.ready_interval if rec.state == "ready" else self.check_interval)
        sv.reap(proc)
        if self.procs.get(shard) is proc:
            del self.procs[shard]
        if self.state.shards.get(shard) is rec:
            del self.state.shards[shard]
        self._save()
        if rec.key:
            self._outbox.put_nowait(_Key(self._key_name(rec)))
        if rec.stopping and not rec.failure:
            log.info("%s (generation %d) stopped", shard, rec.generation)
            self._status(rec, "stopped", rec.stop_reason)
        else:
            reason = rec.failure or sv.exit_reason(proc)
            log.warning("%s (generation %d) failed: %s", shard, rec.generation, reason)
            self._status(rec, "failed", reason)
        proc.status.unlink(missing_ok=True)
        if self._watchers.get(shard) is asyncio.current_task():
            del self._watchers[shard]

    async def _stop_failed(self, rec: ShardRecord, reason: str) -> None:
        rec.stopping, rec.failure = True, reason
        self._save()
        self._spawn_task(self._terminate(rec.shard))

    # ----------------------------------------------------------------- publishing

    def _status(self, rec: ShardRecord, state: str, reason: str = "") -> None:
        self._outbox.put_nowait(
            ev.ShardStatus(
                at=self.clock(), node=self.name, replica=rec.replica, shard=rec.shard, generation=rec.generation,
                state=state, reason=reason, endpoint=rec.endpoint if state == "ready" else "",
                identity=rec.identity if state == "ready" else "",
            )
        )  # fmt: skip

    def registration(self) -> ev.NodeRegistered:
        inv = self.inventory
        self.power.reset()  # a registration forgets what was measured: the next reading is sent
        running = [
            ev.RunningShard(
                shard=r.shard, replica=r.replica, model=r.model, profile=r.profile, generation=r.generation,
                rank=r.rank, gpus=list(r.gpus), port=r.port, state=r.state,
                endpoint=r.endpoint if r.state == "ready" else "", fingerprint=r.fingerprint,
                identity=r.identity if r.state == "ready" else "",
            )
            for r in self.state.shards.values()
            if r.pid
        ]  # fmt: skip
        return ev.NodeRegistered(
            at=self.clock(), node=self.name, gpus=list(inv.gpus), memory_gb=inv.memory_gb, cpu_cores=inv.cpu_cores,
            labels=dict(inv.labels), running=running, agent=f"llmgw-agent/{self.instance}",
            port_first=self.agent_file.engine_ports.first, port_last=self.agent_file.engine_ports.last,
            ports_taken=list(self.taken_ports.taken),
        )  # fmt: skip

    async def _publish_loop(self) -> None:
        while True:
            item = await self._outbox.get()
            try:
                if isinstance(item, _Key):
                    await self._key(item)
                    continue
                try:
                    if item is _REGISTER:
                        await self.taken_ports.scan()
                    event = self.registration() if item is _REGISTER else item
                except Exception:  # never the end of the publisher: the next registration may do
                    log.exception("could not build the registration")
                    continue
                await publish_fact(self.bus, event, next(self._msg_ids))
                if item is _REGISTER:
                    log.info("registered with %d running shard(s)", len(event.running))  # type: ignore[attr-defined]
                    self.registered.set()
            finally:
                self._outbox.task_done()

    async def _key(self, item: _Key) -> None:
        """Put (or delete) an engine's key, retrying until the bus takes it, as a fact is."""
        if item.key:
            await until_taken(f"putting the key of {item.name}", lambda: self.bus.put_engine_key(item.name, item.key))
        else:
            await until_taken(f"deleting the key of {item.name}", lambda: self.bus.delete_engine_key(item.name))

    # ----------------------------------------------------------------- logs over NATS

    async def _serve_logs(self):
        nc = getattr(self.bus, "nc", None)
        if nc is None:
            return None

        async def on_request(msg) -> None:
            try:
                data = engine_logs.answer(self.state_dir, msg.data)
                for rec in self.state.shards.values():  # an engine that prints its key (SGLang) does not give it away
                    if rec.key:
                        data = data.replace(rec.key.encode(), b"<engine key>")
                await msg.respond(data)
            except Exception as e:
                log.debug("logs request: %s", e)

        return await nc.subscribe(engine_logs.subject(self.name), cb=on_request)
