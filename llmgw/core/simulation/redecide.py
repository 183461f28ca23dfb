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

from ..contract import events as ev
from ..contract import limits
from ..rules.decide import decide
from ..folding.decisions import as_recorded, describe_action
from ..folding.fold import apply, copy_state
from .history import Record
from ..contract.policy import Policy
from ..contract.reasons import words
from ..folding.state import LIVE_SHARD_STATES, State
from .figures import Figures, Meter
from .whatif import Sim, Timing, next_wake


class Plan(msgspec.Struct, kw_only=True):
    """What the file says; None: the file has no such section, the log's stands."""

    models: dict[str, ev.ModelSpec] | None = None
    owners: dict[str, ev.OwnerApplied] | None = None
    policy: Policy | None = None


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
    return [describe_action(a) + (f" ({why})" if (why := words(a)) else "") for a in actions]


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
        for _ in range(limits.LIMITS.what_if_passes_at_once):
            acts = self.sim.decide_pass(t)
            if not acts:
                return
            self.passes += 1

    def _run_until(self, t_end: float) -> None:
        """The simulated facts and the rules' deadlines up to `t_end`. A
        deadline is decided on at once (it is the moment a rule's answer
        changes); simulated facts, like recorded ones, once a burst of them
        is over (nothing more within limits' what_if_tick_s)."""
        while True:
            timer = self.sim.next_timer()
            wake = next_wake(self.sim.state, self.clock)
            if self.dirty:
                quiet = self.clock + limits.LIMITS.what_if_tick_s
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
                    if _key(d.actions) == _key(mine) and d.at - w <= limits.LIMITS.what_if_follow_slack_s:  # type: ignore[attr-defined]
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
            if as_recorded(mine, e.actions) == e.actions:
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
