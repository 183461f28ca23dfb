"""The control plane's shell: consume, evolve, decide, publish, repeat.

All policy is in `llmgw.core`; this module only waits. Its one rule of its
own is that it never acts on a state it has not folded: a decision is
published with the last control sequence it was taken on, and if the server
refuses it (another writer, or our own previous decision not yet folded) we
fold what we missed and decide again. Decisions are never applied locally:
they take effect when they come back from the log, exactly as in a replay.

One leader, standbys that follow hot. Every control plane folds the log
from the start (a snapshot, then the tail) and keeps folding it; the one
that holds the lease (a key with a TTL in LEADER_BUCKET: created to
campaign, updated with its last revision to renew) leads. It records that
in the log (`LeaderElected`, fenced like a decision, with the next term) and
only then decides and sends commands, each carrying its term and signed
for its node (bus/signing.py: agents obey nothing else); agents refuse a
command of an older term than they have seen. A leader that cannot renew
stops acting before its lease can expire; one that finds the lease another's
is a standby again. A standby decides nothing and sends nothing: it
publishes only its position, in the lease bucket (`llmgw ctl get leader`).

A node is declared lost on evidence only (core/folding/liveness.py): not while our
connection is down or the heartbeat bucket does not answer, with every
node's grace counted again from when they can be read, and not when most of
the fleet falls silent at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
import uuid
from typing import Callable

from ..bus import LEASE_KEY, Bus, Fenced, LeaseTaken
from ..bus.signing import Signer
from ..bus.msgids import MsgIds
from ..core.folding import commands as cmds
from ..core.contract import events as ev
from ..core.rules.decide import decide
from ..core.folding.decisions import describe_action
from ..core.folding.fold import apply
from ..core.simulation.history import action_about
from ..core.folding.liveness import lost_nodes, mass_silence
from ..core.folding import replicaindex
from ..core.contract import reasons
from ..core.folding.nodeindex import track
from ..core.folding.state import State
from ..telemetry import tracer
from . import heap
from .config import ControlConfig, listen_address
from .metrics import ControlMetrics
from .rates import NodeRates
from .snapshots import SnapshotStore

log = logging.getLogger("llmgw.control")
_tracer = tracer("llmgw.control")


def control_plane_id() -> str:
    """Who this control plane is, for people and for the lease: host, pid
    and a few random digits (a restarted one is another)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:32] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class ControlPlane:
    def __init__(
        self,
        bus: Bus,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
        config: ControlConfig | None = None,
        signer: Signer | None = None,
        **overrides,
    ) -> None:
        self.bus = bus
        # Signs every command for the node it is sent to (bus/signing.py); None: sent unsigned (a dev NATS).
        self.signer = signer
        self.snapshots = snapshots
        self.clock = clock
        config = config or ControlConfig()
        for name, value in overrides.items():  # node_grace=..., tick=...: a field of ControlConfig
            if name not in ControlConfig.__struct_fields__:
                raise TypeError(f"ControlPlane has no setting {name!r}")
            setattr(config, name, value)
        self.config = config
        self.node_grace = config.node_grace
        self.resend_after = config.resend_after
        self.tick = config.tick
        self.snapshot_every = config.snapshot_every
        self.snapshot_interval = config.snapshot_interval
        self.leader = control_plane_id()  # our id, in the lease and in every decision
        self.term = 0  # the term we lead in; 0: not leading
        self.state = State()
        self.passes = 0
        self.fenced = 0
        self.commands_sent = 0
        self.elected_at = 0.0  # monotonic: when we last began to lead
        self._changed = asyncio.Event()
        self._folded = asyncio.Event()
        self._last_seen: dict[str, float] = {}
        self._watching_since = 0.0
        self._bus_ok_since: float | None = None  # heartbeats readable since (our clock); None: not now
        self._bus_trouble = ""
        self._silence_said = ""
        self._sent: dict[tuple, float] = {}
        self._asked_to_register: dict[str, float] = {}
        self._resend_nodes: set[str] = set()
        self._snapshot_seq = 0
        self._snapshot_time = 0.0
        self._reclaimed_at = 0.0  # the last full collection of the frozen state (heap.reclaim)
        self._log_id = ""
        self._msg_ids = MsgIds(self.leader)  # unpredictable: see bus/msgids.py
        self._lease = None
        self._lease_rev = 0  # the revision of our lease key; 0: we do not hold it
        self._lease_until = 0.0  # monotonic: we act as leader until then, unless renewed
        self._holder = ""  # who holds the lease, as last seen by a standby
        self.ready = asyncio.Event()  # set once caught up with the log
        # Each node's rate (control/rates.py): counted once caught up; a node
        # past it is muted by the leader's next pass (NodeMuted).
        self.rates = NodeRates(config.node_rate, config.node_rate_window, config.node_burst)
        self._past_rate: set[str] = set()
        self.muted_sent = 0
        self.metrics = ControlMetrics(self)
        self.metrics_port = 0  # where /metrics is served once running (0: not served)

    @property
    def snapshot_seq(self) -> int:
        """The sequence of the last snapshot written or restored."""
        return self._snapshot_seq

    # ----------------------------------------------------------------- folding

    def _on_message(self, seq: int, subject: str, data: bytes) -> None:
        if seq <= self.state.seq:
            return  # redelivered after a reconnect
        apply(self.state, seq, subject, data)
        if subject.startswith("llmgw.agent.") and self.ready.is_set() and self.config.node_rate > 0:
            node = subject[12:].partition(".")[0]
            if self.rates.count(node, time.monotonic()) and node not in self.state.muted:
                self._past_rate.add(node)
        if subject.endswith(".node.registered"):
            # A registration follows a fresh connection: whatever we sent that
            # node before may be lost, so everything outstanding goes again.
            node = subject.split(".")[2]
            self._resend_nodes.add(node)
            # And it is a sign of life (core/folding/liveness.py counts it as seen): a
            # node lost and registering again was lost again at once, on its
            # old last heartbeat, when a pass came before its next one
            # (benchmarks/fleet.py, a simulated node speaking again).
            self._last_seen[node] = self.clock()
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
        if self.signer is not None:
            log.info("commands are signed with the key %s (agents check them with it)", self.signer.public_key)
        else:
            log.warning("NO COMMAND-SIGNING KEY: commands are sent unsigned, and an agent given a command key refuses "
                        "them (give --signing-key, creds/keys/commands.nk)")
        if self.snapshots is not None:
            restored = self.snapshots.load(self._log_id, last)
            if restored is not None:
                self.state = restored
                self._snapshot_seq = restored.seq
                log.info("restored a snapshot at sequence %d; folding %d more", restored.seq, last - restored.seq)
        follower = await self.bus.follow(self.state.seq + 1, self._on_message)
        beats = await self.bus.follow_heartbeats(self._on_beat)
        metrics_server = await self._serve_metrics()
        self._watching_since = self.clock()
        background = [
            asyncio.create_task(self._lease_loop(stop)),
            asyncio.create_task(self._probe_loop(stop)),
        ]
        try:
            while not await self._folded_to(last, timeout=60.0):
                log.warning("still catching up with the log: at %d of %d", self.state.seq, last)
            self.ready.set()
            # The state caught up is what this process keeps for its life: out
            # of the cycle collector's way (the gateway does the same), so no
            # collection goes over a million live objects again (heap.py).
            heap.settle()
            self._reclaimed_at = self.clock()
            track(self.state)  # placement's node index, kept by the fold from here on (core/folding/nodeindex.py)
            replicaindex.track(self.state)  # and each model's replicas (core/folding/replicaindex.py)
            log.info("caught up at sequence %d; control plane %s follows, and campaigns for the lease", self.state.seq,
                     self.leader)
            while not stop.is_set():
                try:
                    if self.holds_lease():
                        if not self.leading():
                            await self._take_office()
                        if self.leading():
                            await self.step()
                    else:
                        self._maybe_snapshot(self.clock())
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
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._resign()
            await follower.stop()
            await beats.stop()
            if metrics_server is not None:
                metrics_server.close()
            self._save_snapshot()

    async def _serve_metrics(self) -> asyncio.AbstractServer | None:
        """/metrics where config.metrics_listen says; a taken port is said
        and the plane goes on without (its metrics are not worth its job)."""
        if not self.config.metrics_listen:
            return None
        host, port = listen_address(self.config.metrics_listen)
        try:
            server = await self.metrics.serve(host, port)
        except OSError as e:
            log.warning("cannot serve /metrics on %s (%s): going on without", self.config.metrics_listen, e.strerror or e)
            return None
        self.metrics_port = server.sockets[0].getsockname()[1]
        log.info("metrics (Prometheus) at http://%s:%d/metrics", host if ":" not in host else f"[{host}]", self.metrics_port)
        return server

    # ----------------------------------------------------------------- the lease

    def holds_lease(self) -> bool:
        """We hold the lease and it cannot have expired yet."""
        return bool(self._lease_rev) and time.monotonic() < self._lease_until

    def leading(self) -> bool:
        """We hold the lease and the log says we lead, in our term: only then
        do we decide and send commands."""
        return self.holds_lease() and self.term > 0 and self.state.term == self.term and self.state.leader == self.leader

    def _lease_value(self, term: int) -> bytes:
        return json.dumps(
            {"id": self.leader, "term": term, "since": self.state.leader_since if term == self.state.term else 0.0,
             "seq": self.state.seq, "at": self.clock()}
        ).encode()

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        cfg = self.config
        reported = 0.0
        while not stop.is_set():
            try:
                if self._lease is None:
                    self._lease = await self.bus.lease(cfg.lease_ttl)
                if self._lease_rev:
                    await self._renew()
                elif self.ready.is_set():
                    await self._campaign()
                if not self._lease_rev and time.monotonic() - reported >= cfg.standby_report_every:
                    reported = time.monotonic()
                    standby = {"id": self.leader, "seq": self.state.seq, "at": self.clock()}
                    await self._lease.put(f"standby.{self.leader}", json.dumps(standby).encode())
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as e:
                log.warning("the lease: %s: %s", type(e).__name__, e)
            delay = cfg.renew_every if self._lease_rev else cfg.campaign_every
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except asyncio.TimeoutError:
                pass

    def _ttl(self) -> float:
        return getattr(self._lease, "ttl", None) or self.config.lease_ttl

    async def _campaign(self) -> None:
        sent = time.monotonic()
        try:
            rev = await self._lease.create(LEASE_KEY, self._lease_value(self.state.term + 1))
        except LeaseTaken:
            return
        self._lease_rev = rev
        self._lease_until = sent + self._ttl() - self.config.lease_margin
        log.info("took the lease (revision %d): leading once the log says so", rev)
        self._changed.set()

    async def _renew(self) -> None:
        sent = time.monotonic()
        try:
            self._lease_rev = await self._lease.update(LEASE_KEY, self._lease_value(self.term), last=self._lease_rev)
        except LeaseTaken:
            self._step_down("the lease is another's now, or expired")
            return
        except Exception as e:
            if time.monotonic() >= self._lease_until and self.term:
                log.warning("could not renew the lease (%s): not deciding until it is renewed", e)
            raise
        self._lease_until = sent + self._ttl() - self.config.lease_margin

    def _step_down(self, why: str) -> None:
        if self.term:
            log.warning("no longer leading (term %d): %s; following as a standby", self.term, why)
        self._lease_rev = 0
        self.term = 0

    async def _resign(self) -> None:
        """Stopping: let go of the lease at once, so a standby need not wait for it to expire."""
        if self._lease is not None and self._lease_rev:
            try:
                await asyncio.wait_for(self._lease.delete(LEASE_KEY, last=self._lease_rev), 2.0)
                log.info("let go of the lease")
            except Exception as e:
                log.debug("could not let go of the lease: %s", e)
        self._lease_rev = 0
        self.term = 0

    async def _take_office(self) -> None:
        """We hold the lease: say so in the log, in the next term, fenced like
        a decision (a deposed leader's decision in flight refuses ours, or ours
        refuses it). Once folded back, we lead."""
        # Hot already; the last few events first, so the first pass is on all of it.
        try:
            last = await asyncio.wait_for(self.bus.last_seq(), self.config.bus_probe_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return  # the bus in trouble: the next pass tries again
        await self._folded_to(last, timeout=self.config.lease_margin)
        if not self.holds_lease():
            return
        previous = self.state.leader
        term = self.state.term + 1
        event = ev.LeaderElected(at=self.clock(), term=term, leader=self.leader, previous=previous, basis=self.state.seq)
        if not await self._publish(event):
            return  # refused: folded what we missed; the next pass tries again
        if self.state.term == term and self.state.leader == self.leader:
            self.term = term
            self.elected_at = time.monotonic()
            self._sent.clear()  # everything outstanding goes again, in our term
            self._resend_nodes.clear()
            log.info("leading in term %d%s", term, f", after {previous}" if previous else "")

    # ----------------------------------------------------------------- liveness

    async def _probe_loop(self, stop: asyncio.Event) -> None:
        """Whether the heartbeats can be read, every so often: a node's
        silence is evidence only from then on."""
        probe = getattr(self.bus, "heartbeats_readable", None)
        cfg = self.config
        while not stop.is_set():
            why = ""
            if probe is not None:
                try:
                    why = await probe(cfg.bus_probe_timeout)
                except Exception as e:
                    why = f"{type(e).__name__}: {e}"
            if not why:  # the log's end, for llmgw_control_log_lag_events
                try:
                    self.metrics.log_last = await asyncio.wait_for(self.bus.last_seq(), cfg.bus_probe_timeout)
                except Exception:
                    pass  # said by the next probe, if it is the bus
            if why:
                if self._bus_ok_since is not None or why != self._bus_trouble:
                    log.warning("heartbeats cannot be read (%s): no node is declared lost until they can", why)
                self._bus_ok_since = None
            elif self._bus_ok_since is None:
                self._bus_ok_since = self.clock()
                if self._bus_trouble:
                    log.info("heartbeats readable again: every node's grace starts again now")
            self._bus_trouble = why
            try:
                await asyncio.wait_for(stop.wait(), cfg.bus_probe_every)
            except asyncio.TimeoutError:
                pass

    def _on_beat(self, node: str) -> None:
        now = self.clock()
        self._last_seen[node] = now
        known = self.state.nodes.get(node)
        if (
            self.leading() and known is not None and known.state == "lost" and node not in self.state.muted
            and now - self._asked_to_register.get(node, 0.0) >= self.resend_after
        ):  # fmt: skip
            # Lost, yet its agent is alive: let it register again, so what it
            # runs is adopted or stopped rather than left running unseen.
            self._asked_to_register[node] = now
            msg = self._command_for(node, cmds.Reregister(reason=f"node {node} was lost: {known.reason}"))
            if msg is not None:
                asyncio.get_running_loop().create_task(self._send_quietly(node, msg))

    def _command_for(self, node: str, cmd: cmds.Command) -> bytes | None:
        """`cmd` as sent to `node`: in our term and log, signed. None unless we
        lead: `leading()` holds only once our own LeaderElected of this term
        is folded back from the log, so no command is ever signed for a term
        the log has not recorded us elected in (agents trust the signature
        for that: they cannot read the log)."""
        if not self.leading():
            return None
        cmd.term, cmd.log = self.term, self._log_id
        data = cmds.encode(cmd)
        return self.signer.seal(node, data) if self.signer is not None else data

    async def _send_quietly(self, node: str, data: bytes) -> None:
        try:
            await self.bus.send_command(node, data)
        except Exception as e:
            log.warning("could not send to %s: %s", node, e)

    async def step(self) -> None:
        """One pass: liveness, then decisions, then commands, then maybe a snapshot."""
        now = self.clock()
        await self._mute_past_rate(now)
        await self._liveness(now)
        with _tracer.start_as_current_span("control.pass", attributes={"llmgw.basis": self.state.seq}) as span:
            began = time.perf_counter()
            actions = decide(self.state, now)
            self.metrics.pass_seconds.observe(time.perf_counter() - began)
            span.set_attribute("llmgw.actions", len(actions))
            if actions:
                self.passes += 1
                decided = ev.Decided(at=now, basis=self.state.seq, actions=actions, leader=self.leader)
                landed = await self._publish(decided)
                span.set_attribute("llmgw.landed", landed)
                if landed:
                    self.metrics.landed(actions)
                    self._trace_decisions(actions)
        await self._send_commands(now)
        self._maybe_snapshot(now)
        # What the pass added to the state (folded back as it landed) joins
        # the frozen rest: a cold start's passes grow it by a million objects.
        if now - self._reclaimed_at >= self.config.reclaim_every:
            heap.reclaim()
            self._reclaimed_at = now
        else:
            heap.settle()

    async def _mute_past_rate(self, now: float) -> None:
        """Record that each node past its rate is muted (core/folding/muting.py):
        from then on every reader of the log skips what it says."""
        past, self._past_rate = self._past_rate, set()
        for node in sorted(past):
            if node in self.state.muted or not self.rates.past(node, time.monotonic()):
                continue
            events, rate = self.rates.seen(node)
            limit = self.config.node_rate
            log.warning("node %s muted: %d events in %d s (%.0f/s), past its limit of %.0f/s", node, events,
                        self.rates.window_s, rate, limit)
            muted = ev.NodeMuted(at=now, node=node, rate=rate, limit=limit, window_s=float(self.rates.window_s),
                                 events=events, basis=self.state.seq)
            if await self._publish(muted):
                self.muted_sent += 1
                self.rates.forget(node)
            elif node not in self.state.muted:
                self._past_rate.add(node)  # refused (fenced): the next pass tries again

    async def _liveness(self, now: float) -> None:
        if self._bus_ok_since is None:
            return  # the heartbeats cannot be read: silence is no evidence
        # Heartbeats we could not receive while our own connection was down,
        # or while the bucket did not answer, say nothing about the nodes:
        # their grace restarts when they can be read again.
        since = max(self._watching_since, getattr(self.bus, "reconnected_at", 0.0), self._bus_ok_since)
        lost = lost_nodes(self.state, self._last_seen, since, now, self.node_grace)
        held = mass_silence(self.state, lost, self.config.mass_silence)
        if held:
            if held != self._silence_said:
                log.warning("%s (%s)", held, ", ".join(n for n, _ in lost))
            self._silence_said = held
            return
        self._silence_said = ""
        for node, reason in lost:
            log.warning("node %s lost: %s", node, reason)
            with _tracer.start_as_current_span("node lost", attributes={"llmgw.node": node, "llmgw.reason": reason}):
                await self._publish(ev.NodeLost(at=now, node=node, reason=reason, basis=self.state.seq))

    def _trace_decisions(self, actions: list[ev.Action]) -> None:
        """A span per decision that landed, under its pass: what, about whom, and why."""
        for a in actions:
            kind, model, replica, node = action_about(a)
            said, why = describe_action(a), reasons.words(a)
            log.info("%s: %s", _log_words(a) or said, why)
            _tracer.start_span(
                f"decision {kind}",
                attributes={
                    "llmgw.decision": said,
                    "llmgw.model": model,
                    "llmgw.replica": replica,
                    "llmgw.node": node,
                    "llmgw.reason": why,
                    "llmgw.cause": reasons.kind_of(a),
                },
            ).end()

    async def _publish(self, event: ev.Event) -> bool:
        """Publish one decision, fenced; True once it is folded back. Only
        while we hold the lease (and, but for our election, lead)."""
        if not (self.leading() or (type(event) is ev.LeaderElected and self.holds_lease())):
            return False
        basis = self.state.control_seq
        try:
            seq = await self.bus.publish(
                ev.subject_for(event),
                ev.encode(event),
                msg_id=next(self._msg_ids),
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
                data = self._command_for(node, cmd)
                if data is None:
                    return  # deposed while sending: a standby sends nothing
                try:
                    await self.bus.send_command(node, data)
                    self.commands_sent += 1
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
