"""The control plane's shell: consume, evolve, decide, publish, repeat.

All policy is in `llmgw.core`; this module only waits. Its one rule of its
own is that it never acts on a state it has not folded: a decision is
published with the last control sequence it was taken on, and if the server
refuses it (another writer, or our own previous decision not yet folded) we
fold what we missed and decide again. Decisions are never applied locally:
they take effect when they come back from the log, exactly as in a replay.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Callable

from ..bus import Bus, Fenced
from ..core import commands as cmds
from ..core import events as ev
from ..core.decide import decide
from ..core.decisions import describe_action
from ..core.fold import apply
from ..core.history import action_about
from ..core.liveness import lost_nodes
from ..core.state import State
from ..telemetry import tracer
from .snapshots import SnapshotStore

log = logging.getLogger("llmgw.control")
_tracer = tracer("llmgw.control")


class ControlPlane:
    def __init__(
        self,
        bus: Bus,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
        node_grace: float = 10.0,
        resend_after: float = 5.0,
        tick: float = 1.0,
        snapshot_every: int = 50_000,
        snapshot_interval: float = 30.0,
    ) -> None:
        self.bus = bus
        self.snapshots = snapshots
        self.clock = clock
        self.node_grace = node_grace
        self.resend_after = resend_after
        self.tick = tick
        self.snapshot_every = snapshot_every
        self.snapshot_interval = snapshot_interval
        self.leader = uuid.uuid4().hex[:12]
        self.state = State()
        self.passes = 0
        self.fenced = 0
        self._changed = asyncio.Event()
        self._folded = asyncio.Event()
        self._last_seen: dict[str, float] = {}
        self._watching_since = 0.0
        self._sent: dict[tuple, float] = {}
        self._asked_to_register: dict[str, float] = {}
        self._resend_nodes: set[str] = set()
        self._snapshot_seq = 0
        self._snapshot_time = 0.0
        self._log_id = ""
        self._msg_numbers = itertools.count(1)
        self.ready = asyncio.Event()  # set once caught up with the log

    # ----------------------------------------------------------------- folding

    def _on_message(self, seq: int, subject: str, data: bytes) -> None:
        if seq <= self.state.seq:
            return  # redelivered after a reconnect
        apply(self.state, seq, subject, data)
        if subject.endswith(".node.registered"):
            # A registration follows a fresh connection: whatever we sent that
            # node before may be lost, so everything outstanding goes again.
            self._resend_nodes.add(subject.split(".")[2])
        self._changed.set()
        self._folded.set()

    async def _folded_to(self, seq: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.state.seq < seq:
            self._folded.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._folded.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    # ----------------------------------------------------------------- the loop

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.bus.ensure_streams()
        last = await self.bus.last_seq()
        self._log_id = await self.bus.log_id()
        if self.snapshots is not None:
            restored = self.snapshots.load(self._log_id, last)
            if restored is not None:
                self.state = restored
                self._snapshot_seq = restored.seq
                log.info("restored a snapshot at sequence %d; folding %d more", restored.seq, last - restored.seq)
        follower = await self.bus.follow(self.state.seq + 1, self._on_message)
        beats = await self.bus.follow_heartbeats(self._on_beat)
        self._watching_since = self.clock()
        try:
            while not await self._folded_to(last, timeout=60.0):
                log.warning("still catching up with the log: at %d of %d", self.state.seq, last)
            self.ready.set()
            log.info("caught up at sequence %d; leader %s deciding", self.state.seq, self.leader)
            while not stop.is_set():
                try:
                    await self.step()
                except (asyncio.CancelledError, KeyboardInterrupt):
                    raise
                except Exception as e:
                    # NATS away, a publish timing out: nothing was decided that
                    # is not in the log, so the next pass simply tries again.
                    log.warning("pass failed (%s: %s); trying again", type(e).__name__, e)
                    await asyncio.sleep(self.tick)
                self._changed.clear()
                waiter = asyncio.create_task(self._changed.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({waiter, stopper}, timeout=self.tick, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                await asyncio.sleep(0.01)  # let a burst of events fold before deciding on it
        finally:
            await follower.stop()
            await beats.stop()
            self._save_snapshot()

    def _on_beat(self, node: str) -> None:
        now = self.clock()
        self._last_seen[node] = now
        known = self.state.nodes.get(node)
        if known is not None and known.state == "lost" and now - self._asked_to_register.get(node, 0.0) >= self.resend_after:
            # Lost, yet its agent is alive: let it register again, so what it
            # runs is adopted or stopped rather than left running unseen.
            self._asked_to_register[node] = now
            msg = cmds.encode(cmds.Reregister(reason=f"node {node} was lost: {known.reason}"))
            asyncio.get_running_loop().create_task(self._send_quietly(node, msg))

    async def _send_quietly(self, node: str, data: bytes) -> None:
        try:
            await self.bus.send_command(node, data)
        except Exception as e:
            log.warning("could not send to %s: %s", node, e)

    async def step(self) -> None:
        """One pass: liveness, then decisions, then commands, then maybe a snapshot."""
        now = self.clock()
        # Heartbeats we could not receive while our own connection was down
        # say nothing about the nodes: their grace restarts at the reconnect.
        since = max(self._watching_since, getattr(self.bus, "reconnected_at", 0.0))
        for node, reason in lost_nodes(self.state, self._last_seen, since, now, self.node_grace):
            log.warning("node %s lost: %s", node, reason)
            with _tracer.start_as_current_span("node lost", attributes={"llmgw.node": node, "llmgw.reason": reason}):
                await self._publish(ev.NodeLost(at=now, node=node, reason=reason, basis=self.state.seq))
        with _tracer.start_as_current_span("control.pass", attributes={"llmgw.basis": self.state.seq}) as span:
            actions = decide(self.state, now)
            span.set_attribute("llmgw.actions", len(actions))
            if actions:
                self.passes += 1
                decided = ev.Decided(at=now, basis=self.state.seq, actions=actions, leader=self.leader)
                landed = await self._publish(decided)
                span.set_attribute("llmgw.landed", landed)
                if landed:
                    self._trace_decisions(actions)
        await self._send_commands(now)
        self._maybe_snapshot(now)

    def _trace_decisions(self, actions: list[ev.Action]) -> None:
        """A span per decision that landed, under its pass: what, about whom, and why."""
        for a in actions:
            kind, model, replica, node = action_about(a)
            words = describe_action(a)
            log.info("%s: %s", _log_words(a) or words, a.reason)
            _tracer.start_span(
                f"decision {kind}",
                attributes={
                    "llmgw.decision": words,
                    "llmgw.model": model,
                    "llmgw.replica": replica,
                    "llmgw.node": node,
                    "llmgw.reason": a.reason,
                },
            ).end()

    async def _publish(self, event: ev.Event) -> bool:
        """Publish one decision, fenced; True once it is folded back."""
        basis = self.state.control_seq
        try:
            seq = await self.bus.publish(
                ev.subject_for(event),
                ev.encode(event),
                msg_id=f"{self.leader}-{next(self._msg_numbers)}",
                expect_control_seq=basis,
            )
        except Fenced as e:
            self.fenced += 1
            log.info("decision refused (%s): folding what we missed and deciding again", e)
            await self._folded_to(self.state.seq + 1, timeout=1.0)
            return False
        await self._folded_to(seq)
        return True

    async def _send_commands(self, now: float) -> None:
        outstanding: set[tuple] = set()
        resend = self._resend_nodes
        self._resend_nodes = set()
        # Listed first: sending awaits, and the state folds on meanwhile.
        for node, cmd in list(cmds.outstanding(self.state)):
            key = (node, cmd.shard, cmd.generation, type(cmd).__name__)
            outstanding.add(key)
            sent = self._sent.get(key)
            if sent is None or now - sent >= self.resend_after or node in resend:
                try:
                    await self.bus.send_command(node, cmds.encode(cmd))
                except Exception as e:  # re-sent on a later pass
                    log.warning("could not send %s to %s: %s", type(cmd).__name__, node, e)
                    continue
                self._sent[key] = now
        for key in list(self._sent):
            if key not in outstanding:
                del self._sent[key]

    def _maybe_snapshot(self, now: float) -> None:
        if self.snapshots is None or self.state.seq == self._snapshot_seq:
            return
        if self.state.seq - self._snapshot_seq >= self.snapshot_every or now - self._snapshot_time >= self.snapshot_interval:
            self._save_snapshot()
            self._snapshot_time = now

    def _save_snapshot(self) -> None:
        if self.snapshots is not None and self.state.seq and self.state.seq != self._snapshot_seq:
            self.snapshots.save(self.state, self._log_id)
            self._snapshot_seq = self.state.seq


def _log_words(a: ev.Action) -> str:
    """A placement in the control plane's log: each shard's node, and its GPUs
    when it has any (a CPU replica's are not an empty list). "" for others."""
    if not isinstance(a, ev.PlaceReplica):
        return ""
    where = ", ".join(f"{s.node} (GPUs {','.join(map(str, s.gpus))})" if s.gpus else s.node for s in a.shards)
    instead = f" in place of {a.replaces}" if a.replaces else ""
    return f"place {a.replica} ({a.model}/{a.profile}) on {where}{instead}"
