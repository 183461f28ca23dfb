"""Re-decide a recorded history under another catalog and policy
(`llmgw replay --what-if FILE`), and say, side by side, how it would have gone.

Facts that do not depend on decisions are replayed as recorded: nodes
registering and lost, operator requests, gateways' load, failures of engines
the what-if runs too. Catalog events are replaced by the file's version of
the same thing (a model the file leaves out is never applied; one the log
never defines is applied at the start, or at the log's first catalog event).
Decisions are the current core's (`decide`), and the facts that follow from
them (a shard placed starts and is ready) are the simulated agents'
(whatif.Sim), timed as the recorded log shows for that profile.

While the what-if decides what the log recorded, it follows the recorded
facts exactly (so a file equal to the recorded catalog reports no
difference, byte for byte); at the first decision that differs, said with
both versions and their reasons, it goes its own way.

Pure and deterministic: time is the log's, output sorted.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from . import events as ev
from .decide import decide
from .decisions import describe_action
from .fold import apply
from .history import Record
from .policy import Policy
from .replicas import RETIRING
from .state import LIVE_SHARD_STATES, State
from .whatif import Sim, Timing, next_wake

# A pass the what-if takes at a deadline of a rule (whatif.next_wake) that
# the log took this much later still counts as the recorded one: the
# recorded control plane decides on its own tick, not at the deadline.
FOLLOW_SLACK_S = 2.0
# Passes in a row at one moment (a pass bounded by its message's size goes on in the next).
PASSES_AT_ONCE = 20
# Going its own way, the what-if decides after the facts of a burst, as a
# control plane does: once no other recorded fact follows within this long.
TICK_S = 0.1
TOP_REASONS = 3


class Plan(msgspec.Struct, kw_only=True):
    """What the file says; None: the file has no such section, the log's stands."""

    models: dict[str, ev.ModelSpec] | None = None
    owners: dict[str, ev.OwnerApplied] | None = None
    policy: Policy | None = None


class Why(msgspec.Struct, kw_only=True):
    reason: str
    seconds: float


class Figures(msgspec.Struct, kw_only=True):
    first_ready_s: float | None = None  # seconds from the window's start to its first replica ready
    waiting_s: float = 0.0  # time it had fewer replicas than it wanted
    waiting_reasons: list[Why] = []  # the longest, first
    placed: int = 0  # replicas placed
    preempted: int = 0  # of its replicas, stopped to make room for another model
    restarts_refused: int = 0
    gpu_hours: float = 0.0  # GPUs its live shards held, over time
    queued_request_s: float = 0.0  # load (in flight and queued, as recorded) while it had no ready replica
    gpus_at_end: int = 0


class ModelRow(msgspec.Struct, kw_only=True):
    model: str
    recorded: Figures
    what_if: Figures


class Divergence(msgspec.Struct, kw_only=True):
    """The first pass of the what-if that is not the recorded one."""

    at: float  # when the what-if decided it
    seq: int  # the recorded event it was decided before (or the recorded pass compared)
    recorded_at: float | None  # when the log's pass compared was taken (None: none was left)
    recorded: list[str]
    what_if: list[str]


class Report(msgspec.Struct, kw_only=True):
    first_seq: int
    last_seq: int
    start_at: float
    end_at: float
    events: int  # recorded events in the window
    passes: int  # what-if passes taken
    followed: int  # of them, the recorded pass
    diverged: Divergence | None
    models: list[ModelRow]
    gpus: int  # in the fleet at the end (the same in both)
    gpus_free_at_end: list[int]  # [recorded, what-if]
    same: bool  # no decision diverged and every figure is the same


# --------------------------------------------------------------------------- figures


class _M:
    __slots__ = ("first_ready", "wait_since", "wait_reason", "reasons", "waiting_s", "placed", "preempted", "refused",
                 "gpu_s", "queued_s", "ready", "level", "since")

    def __init__(self) -> None:
        self.first_ready: float | None = None
        self.wait_since = 0.0
        self.wait_reason = ""
        self.reasons: dict[str, float] = {}
        self.waiting_s = 0.0
        self.placed = self.preempted = self.refused = 0
        self.gpu_s = 0.0
        self.queued_s = 0.0
        self.ready: set[str] = set()
        self.level: dict[str, int] = {}  # gateway -> in flight + queued
        self.since = 0.0  # the last time the queued integral was brought up to date


class Meter:
    """The figures of one run, kept as events are folded (observe after each)."""

    def __init__(self, state: State, start: float) -> None:
        self.start = start
        self.m: dict[str, _M] = {}
        self.held: dict[str, tuple[str, int, float]] = {}  # replica -> (model, GPUs, since)
        for rid in sorted(state.replicas):
            self._replica(state, rid, start)
        for name in sorted(state.models):
            if state.models[name].waiting:
                mm = self._of(name)
                mm.wait_since, mm.wait_reason = start, state.models[name].waiting
            for gw, load in state.models[name].load.items():
                self._of(name).level[gw] = load.in_flight + load.queued

    def _of(self, model: str) -> _M:
        mm = self.m.get(model)
        if mm is None:
            mm = self.m[model] = _M()
            mm.since = self.start
        return mm

    def _queued(self, mm: _M, t: float) -> None:
        if not mm.ready and t > mm.since:
            mm.queued_s += sum(mm.level.values()) * (t - mm.since)
        mm.since = max(mm.since, t)

    def _replica(self, state: State, rid: str, t: float) -> None:
        rep = state.replicas.get(rid)
        old = self.held.get(rid)
        model = rep.model if rep is not None else (old[0] if old else "")
        if not model:
            return
        gpus = sum(len(s.gpus) for s in rep.shards if s.state in LIVE_SHARD_STATES) if rep is not None else 0
        if old is not None and old[1] != gpus:
            self._of(model).gpu_s += old[1] * (t - old[2])
        if gpus:
            if old is None or old[1] != gpus:
                self.held[rid] = (model, gpus, t)
        elif old is not None:
            del self.held[rid]
        mm = self._of(model)
        ready = rep is not None and rep.state == "ready" and rep.restart not in RETIRING
        if ready != (rid in mm.ready):
            self._queued(mm, t)
            if ready:
                mm.ready.add(rid)
                if mm.first_ready is None and t >= self.start:
                    mm.first_ready = t
            else:
                mm.ready.discard(rid)

    def _waiting(self, state: State, name: str, t: float) -> None:
        model = state.models.get(name)
        now = model.waiting if model is not None else ""
        mm = self._of(name)
        if now == mm.wait_reason:
            return
        if mm.wait_reason:
            mm.waiting_s += t - mm.wait_since
            mm.reasons[mm.wait_reason] = mm.reasons.get(mm.wait_reason, 0.0) + t - mm.wait_since
        mm.wait_reason, mm.wait_since = now, t

    def observe(self, state: State, event: ev.Event) -> None:
        t = event.at
        cls = type(event)
        if cls is ev.ShardStatus:
            self._replica(state, event.replica, t)
        elif cls is ev.Decided:
            models: set[str] = set()
            for a in event.actions:
                k = type(a)
                if k is ev.PlaceReplica:
                    models.add(a.model)
                    if a.replica in state.replicas:
                        self._of(a.model).placed += 1
                    self._replica(state, a.replica, t)
                elif k is ev.Preempt:
                    models.add(a.model)
                    for v in a.victims:
                        rep = state.replicas.get(v.replica)
                        if rep is not None and rep.preempted_for == a.model:
                            self._of(v.model).preempted += 1
                        models.add(v.model)
                elif k is ev.ModelWaiting or k is ev.ScaleModel or k is ev.ParkModel:
                    models.add(a.model)
                elif k is ev.StopReplica or k is ev.RestartReplica or k is ev.RefuseRestart:
                    rep = state.replicas.get(a.replica)
                    if k is ev.RefuseRestart and rep is not None and rep.restart == "refused":
                        self._of(rep.model).refused += 1
                    self._replica(state, a.replica, t)
                    if rep is not None:
                        models.add(rep.model)
            for name in sorted(models):
                self._waiting(state, name, t)
        elif cls is ev.ModelLoad:
            mm = self._of(event.model)
            self._queued(mm, t)
            mm.level[event.gateway] = event.in_flight + event.queued
        elif cls is ev.NodeLost or cls is ev.NodeRegistered:
            on = {rid for rid, rep in state.replicas.items() if any(s.node == event.node for s in rep.shards)}
            on |= {rid for rid in self.held if rid not in state.replicas}
            for rid in sorted(on):
                self._replica(state, rid, t)
            for name in sorted(state.models):
                self._waiting(state, name, t)
        elif cls is ev.ModelApplied or cls is ev.ModelRemoved:
            name = event.model.name if cls is ev.ModelApplied else event.name
            self._waiting(state, name, t)

    def figures(self, state: State, end: float) -> dict[str, Figures]:
        for rid in sorted(self.held):
            model, gpus, since = self.held[rid]
            self._of(model).gpu_s += gpus * (end - since)
            self.held[rid] = (model, gpus, end)
        at_end: dict[str, int] = {}
        for rep in state.replicas.values():
            at_end[rep.model] = at_end.get(rep.model, 0) + sum(
                len(s.gpus) for s in rep.shards if s.state in LIVE_SHARD_STATES)
        out = {}
        for name in sorted(self.m):
            mm = self.m[name]
            self._queued(mm, end)
            reasons = dict(mm.reasons)
            waiting = mm.waiting_s
            if mm.wait_reason:
                waiting += end - mm.wait_since
                reasons[mm.wait_reason] = reasons.get(mm.wait_reason, 0.0) + end - mm.wait_since
            top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
            out[name] = Figures(
                first_ready_s=None if mm.first_ready is None else round(mm.first_ready - self.start, 3),
                waiting_s=round(waiting, 3), waiting_reasons=[Why(reason=r, seconds=round(s, 3)) for r, s in top],
                placed=mm.placed, preempted=mm.preempted, restarts_refused=mm.refused,
                gpu_hours=round(mm.gpu_s / 3600.0, 6), queued_request_s=round(mm.queued_s, 3),
                gpus_at_end=at_end.get(name, 0),
            )
        return out


# --------------------------------------------------------------------------- the window

class _At(msgspec.Struct):
    at: float = 0.0


_at = msgspec.json.Decoder(_At)


def at_of(data: bytes) -> float:
    try:
        return _at.decode(data).at
    except msgspec.MsgspecError:
        return 0.0


def window(records: Sequence[Record], start: tuple[str, float] | None, end: tuple[str, float] | None) -> tuple[int, int]:
    """The indexes [first, last) of the records from `start` to `end`, each
    ("seq", n) or ("time", unix seconds); None: the log's first, its last."""
    first, last = 0, len(records)
    if start is not None:
        kind, v = start
        first = next((i for i, (seq, _, data) in enumerate(records)
                      if (seq >= v if kind == "seq" else at_of(data) >= v)), len(records))
    if end is not None:
        kind, v = end
        last = next((i for i, (seq, _, data) in enumerate(records)
                     if i >= first and (seq > v if kind == "seq" else at_of(data) > v)), len(records))
    return first, last


# --------------------------------------------------------------------------- re-deciding

_CATALOG = (ev.ModelApplied, ev.ModelRemoved, ev.OwnerApplied, ev.OwnerRemoved, ev.PolicyApplied)


def _said(actions: list[ev.Action]) -> list[str]:
    return [describe_action(a) + (f" ({a.reason})" if a.reason else "") for a in actions]


def _key(actions: list[ev.Action]) -> list[str]:
    return [describe_action(a) for a in actions]


class _Run:
    """The what-if: follows the log while it decides what the log recorded, then goes its own way."""

    def __init__(self, base: State, plan: Plan, timing: Timing, records: Sequence[Record], first: int, last: int,
                 start: float) -> None:
        self.plan = plan
        self.sim = Sim(base, timing)
        self.meter = Meter(base, start)
        self.sim.on_fold = self.meter.observe
        self.records, self.first, self.last = records, first, last
        self.following = True
        self.same = True  # the what-if's events are the recorded ones so far
        self.clock = start
        self.passes = self.followed = 0
        self.diverged: Divergence | None = None
        self.defined: set[tuple[str, str]] = set()  # catalog things the window's log defines
        self.next_decided: list[int] = []  # per index, the index of the next recorded pass (or `last`)
        self.bases: dict[int, list[int]] = {}  # basis -> indexes of the recorded passes decided on it
        self.pending: dict[int, list[ev.Action]] = {}  # index of a recorded pass -> the what-if's, on its basis
        self.dirty = False  # going its own way: facts folded since its last pass
        self._index()
        self.installed = False

    def _index(self) -> None:
        nxt = self.last
        out = [0] * (self.last - self.first + 1)
        out[-1] = nxt
        for i in range(self.last - 1, self.first - 1, -1):
            seq, subject, data = self.records[i]
            if subject.startswith("llmgw.control.") and b'"control.decided"' in data:
                nxt = i
                try:
                    d = ev.decode(data)
                except msgspec.MsgspecError:
                    d = None
                if isinstance(d, ev.Decided):
                    self.bases.setdefault(d.basis, []).insert(0, i)
            elif subject.startswith("llmgw.ctl."):
                try:
                    e = ev.decode(data)
                except msgspec.MsgspecError:
                    e = None
                if isinstance(e, (ev.ModelApplied, ev.ModelRemoved)):
                    self.defined.add(("model", e.model.name if isinstance(e, ev.ModelApplied) else e.name))
                elif isinstance(e, (ev.OwnerApplied, ev.OwnerRemoved)):
                    self.defined.add(("owner", e.name))
                elif isinstance(e, ev.PolicyApplied):
                    self.defined.add(("policy", ""))
            out[i - self.first] = nxt
        self.next_decided = out

    # ---- the file's catalog in place of the log's

    def install(self, at: float) -> list[ev.Event]:
        """The file's things the window's log never defines, against the state now."""
        self.installed = True
        state, plan, out = self.sim.state, self.plan, []
        if plan.policy is not None and ("policy", "") not in self.defined and plan.policy != state.policy:
            out.append(ev.PolicyApplied(at=at, policy=plan.policy))
        if plan.owners is not None:
            for name in sorted(plan.owners):
                o = plan.owners[name]
                had = state.owners.get(name)
                if ("owner", name) not in self.defined and (had is None or (had.guarantee, had.limit) != (o.guarantee, o.limit)):
                    out.append(msgspec.structs.replace(o, at=at))
            for name in sorted(state.owners):
                if name not in plan.owners and ("owner", name) not in self.defined:
                    out.append(ev.OwnerRemoved(at=at, name=name))
        if plan.models is not None:
            for name in sorted(plan.models):
                had = state.models.get(name)
                if ("model", name) not in self.defined and (had is None or had.spec != plan.models[name]):
                    out.append(ev.ModelApplied(at=at, model=plan.models[name]))
            for name in sorted(state.models):
                if name not in plan.models and ("model", name) not in self.defined:
                    out.append(ev.ModelRemoved(at=at, name=name))
        return out

    def substitute(self, e: ev.Event) -> list[ev.Event] | None:
        """The file's version of a catalog event ([]: dropped), or None: as recorded."""
        plan, cls = self.plan, type(e)
        if cls is ev.ModelApplied or cls is ev.ModelRemoved:
            if plan.models is None:
                return None
            name = e.model.name if cls is ev.ModelApplied else e.name
            if name in plan.models:
                return [ev.ModelApplied(at=e.at, model=plan.models[name])] if cls is ev.ModelApplied else []
            return [] if cls is ev.ModelApplied else None
        if cls is ev.OwnerApplied or cls is ev.OwnerRemoved:
            if plan.owners is None:
                return None
            if e.name in plan.owners:
                return [msgspec.structs.replace(plan.owners[e.name], at=e.at)] if cls is ev.OwnerApplied else []
            return [] if cls is ev.OwnerApplied else None
        if cls is ev.PolicyApplied:
            return None if plan.policy is None else [ev.PolicyApplied(at=e.at, policy=plan.policy)]
        return None

    # ---- folding

    def _fold(self, e: ev.Event, seq: int | None = None) -> None:
        if seq is not None:
            self.sim.seq = seq - 1
        self.sim.fold(e)

    def _on_basis(self, seq: int) -> None:
        """Following: decide on the state the recorded passes of this basis
        were decided on (the log may hold facts between it and them)."""
        for j in self.bases.get(seq, ()):
            d = ev.decode(self.records[j][2])
            self.pending[j] = decide(self.sim.state, d.at)  # type: ignore[attr-defined]

    def _decide(self, t: float) -> None:
        self.dirty = False
        for _ in range(PASSES_AT_ONCE):
            acts = self.sim.decide_pass(t)
            if not acts:
                return
            self.passes += 1

    def _run_until(self, t_end: float) -> None:
        """The simulated facts and the rules' deadlines up to `t_end`. A
        deadline is decided on at once (it is the moment a rule's answer
        changes); simulated facts, like recorded ones, once a burst of them
        is over (nothing more within TICK_S)."""
        while True:
            timer = self.sim.next_timer()
            wake = next_wake(self.sim.state, self.clock)
            if self.dirty:
                quiet = self.clock + TICK_S
                if (timer is None or timer > quiet) and (wake is None or wake > quiet) and t_end > quiet:
                    self.clock = quiet
                    self._decide(quiet)
                    continue
            nxt = [x for x in (timer, wake) if x is not None]
            if not nxt or min(nxt) > t_end:
                return
            self.clock = max(self.clock, min(nxt))
            if timer is not None and timer <= self.clock:
                self.sim.advance(self.clock)
                self.dirty = True
            if wake is not None and wake <= self.clock:
                self._decide(self.clock)

    def _diverge(self, at: float, seq: int, i: int, mine: list[ev.Action]) -> None:
        j = self.next_decided[i - self.first]
        recorded_at, recorded = None, []
        if j < self.last:
            d = ev.decode(self.records[j][2])
            recorded_at, recorded = d.at, _said(d.actions)  # type: ignore[attr-defined]
        self.diverged = Divergence(at=at, seq=seq, recorded_at=recorded_at, recorded=recorded, what_if=_said(mine))
        self.following = False
        if mine:
            self.sim.fold(ev.Decided(at=at, basis=self.sim.state.seq, actions=mine, leader="what-if"))
            self.sim.agents(mine, at)
            self.passes += 1

    def _follow_deadlines(self, i: int, until: float) -> None:
        """While following with other events than the log's: the what-if may
        act on a rule's deadline where the log decided nothing."""
        t = self.clock
        while self.following:
            w = next_wake(self.sim.state, t)
            if w is None or w >= until:
                return
            mine = decide(self.sim.state, w)
            if mine:
                j = self.next_decided[i - self.first]
                if j < self.last:
                    d = ev.decode(self.records[j][2])
                    if _key(d.actions) == _key(mine) and d.at - w <= FOLLOW_SLACK_S:  # type: ignore[attr-defined]
                        t = w
                        continue
                self.clock = w
                self._diverge(w, self.records[i][0], i, mine)
                return
            t = w

    def run(self) -> None:
        base = self.sim.state
        if base.models or base.owners:
            for e in self.install(self.clock):
                self.same = False
                self._fold(e)
        first_seq = self.records[self.first][0] if self.first < self.last else 0
        for basis in sorted(b for b in self.bases if b < first_seq):
            self._on_basis(basis)
        for i in range(self.first, self.last):
            seq, subject, data = self.records[i]
            try:
                e = ev.decode(data)
                ev.check_origin(subject, e)
            except (msgspec.MsgspecError, ev.OriginError):
                if self.following:
                    apply(self.sim.state, seq, subject, data)  # quarantined, as recorded
                    self.sim.seq = seq
                    self._on_basis(seq)
                continue
            t = e.at
            if self.following and not self.same:
                self._follow_deadlines(i, t)
            if self.following:
                self._follow(i, seq, e)
                if self.following:
                    self._on_basis(seq)
            else:
                self._run_until(t)
                self.clock = max(self.clock, t)
                self._own(e)
        end = at_of(self.records[self.last - 1][2]) if self.last > self.first else self.clock
        if not self.following:
            self._run_until(end)
            if self.dirty:
                self._decide(end)

    def _follow(self, i: int, seq: int, e: ev.Event) -> None:
        self.clock = max(self.clock, e.at)
        cls = type(e)
        if cls is ev.Decided:
            mine = self.pending.pop(i, None)
            if mine is None:
                mine = decide(self.sim.state, e.at)
            if mine == e.actions:
                self._fold(e, seq)
                self.passes += 1
                self.followed += 1
                return  # the recorded agents' facts follow, as recorded
            self.sim.seq = seq - 1
            self._diverge(e.at, seq, i, mine)
            return
        if cls in _CATALOG:
            if not self.installed:
                for extra in self.install(e.at):
                    self.same = False
                    self._fold(extra, seq)
            instead = self.substitute(e)
            if instead is None:
                self._fold(e, seq)
            else:
                if instead != [e]:
                    self.same = False
                if not instead:
                    self.sim.seq = seq
                    self.sim.state.seq = seq
                for x in instead:
                    self._fold(x, seq)
            return
        self._fold(e, seq)

    def _own(self, e: ev.Event) -> None:
        """A recorded event once the what-if goes its own way: facts that do
        not depend on decisions folded (and decided on), the others dropped."""
        cls = type(e)
        state = self.sim.state
        if cls is ev.Decided:
            self._decide(e.at)  # the log's control plane decided then: so does the what-if
            return
        if cls is ev.ShardStatus:
            if e.state != "failed":
                return  # what the log's engines did: the what-if's are simulated
            rep = state.replicas.get(e.replica)
            sh = next((s for s in rep.shards if s.id == e.shard), None) if rep is not None else None
            if sh is None or sh.node != e.node or sh.state not in LIVE_SHARD_STATES or sh.state == "stopping":
                return  # an engine the what-if does not run
            self.sim.fold(msgspec.structs.replace(e, generation=sh.generation))
        elif cls is ev.NodeRegistered:
            self.sim.fold(msgspec.structs.replace(e, running=_running_on(state, e.node)))
        elif cls is ev.LeaderElected:
            return  # who led the log's control plane says nothing of the what-if's
        elif cls in _CATALOG:
            if not self.installed:
                for extra in self.install(e.at):
                    self.sim.fold(extra)
            instead = self.substitute(e)
            for x in ([e] if instead is None else instead):
                self.sim.fold(x)
        else:
            self.sim.fold(e)
        self.dirty = True


def _running_on(state: State, node: str) -> list[ev.RunningShard]:
    """What the simulated agent of a node says it runs when it registers: the what-if's shards there."""
    out = []
    for rep in state.replicas.values():
        for sh in rep.shards:
            if sh.node == node and sh.state in LIVE_SHARD_STATES:
                out.append(ev.RunningShard(
                    shard=sh.id, replica=rep.id, model=rep.model, profile=rep.profile, generation=sh.generation,
                    rank=sh.rank, gpus=list(sh.gpus), port=sh.port, state="ready" if sh.state == "stopping" else sh.state,
                    endpoint=sh.endpoint, fingerprint=rep.fingerprint, identity=sh.identity,
                ))
    return sorted(out, key=lambda r: r.shard)


def what_if(
    records: Sequence[Record], plan: Plan, start: tuple[str, float] | None = None, end: tuple[str, float] | None = None,
    ready_after: float | None = None,
) -> Report:
    """Recorded vs what-if over the window of `records`, under `plan`."""
    first, last = window(records, start, end)
    base = State()
    for seq, subject, data in records[:first]:
        apply(base, seq, subject, data)
    start_at = at_of(records[first][2]) if first < last else 0.0
    end_at = at_of(records[last - 1][2]) if first < last else start_at

    # The log as it went, measured; what it shows of start times.
    from .fold import copy_state

    recorded = copy_state(base)
    meter = Meter(recorded, start_at)
    timing = Timing(fixed=ready_after)
    placed_at: dict[str, float] = {}
    for seq, subject, data in records[first:last]:
        apply(recorded, seq, subject, data)
        try:
            e = ev.decode(data)
        except msgspec.MsgspecError:
            continue
        meter.observe(recorded, e)
        if type(e) is ev.ShardStatus and e.state == "ready":
            rep = recorded.replicas.get(e.replica)
            if rep is not None and rep.ready_at == e.at and rep.placed_at and rep.id not in placed_at:
                placed_at[rep.id] = rep.placed_at
                timing.add(rep.model, rep.profile, e.at - rep.placed_at)
    rec_figures = meter.figures(recorded, end_at)

    run = _Run(copy_state(base), plan, timing, records, first, last, start_at)
    run.run()
    mine = run.meter.figures(run.sim.state, end_at)

    rows = [ModelRow(model=name, recorded=rec_figures.get(name, Figures()), what_if=mine.get(name, Figures()))
            for name in sorted(set(rec_figures) | set(mine))]
    rows = [r for r in rows if r.recorded != Figures() or r.what_if != Figures()]
    gpus = sum(len(n.gpus) for n in recorded.nodes.values() if n.state == "ready")
    free = [gpus - sum(len(n.used) for n in s.nodes.values() if n.state == "ready") for s in (recorded, run.sim.state)]
    same = run.diverged is None and all(r.recorded == r.what_if for r in rows)
    return Report(
        first_seq=records[first][0] if first < last else 0, last_seq=records[last - 1][0] if first < last else 0,
        start_at=start_at, end_at=end_at, events=last - first, passes=run.passes, followed=run.followed,
        diverged=run.diverged, models=rows, gpus=gpus, gpus_free_at_end=free, same=same,
    )
