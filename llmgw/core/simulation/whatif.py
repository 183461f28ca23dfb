"""What a change would do, before it does it: events "as if published",
folded on a copy of the state, and `decide` run until the fleet settles,
with the simulated agents' rules for what happens between passes.

`ctl apply --dry-run`, `ctl restart --dry-run` (and any other operator
command: a facility hold is one more event in the list) call `dry_run`
with the events they would publish and the state folded from the live log;
nothing is published. `llmgw replay --what-if` (replay.py) runs the same
simulated agents (`Sim`) under recorded history.

Between passes, the simulated agent's rules: a placed shard is starting at
once and ready after its profile's typical start time (`Timing`: what the
log shows for that profile, or a time given); a stopped one exits after its
drain, at most `sim_stop_s` (an idle simulated engine has nothing to
finish; this module's numbers are contract/limits.py's). Time
is simulated: after a pass that decided nothing the clock jumps to the next
simulated fact or to the next moment at which time alone changes a rule's
answer (`next_wake`: a young replica's minimum lifetime ends, a hold ends, a
back-off ends...), so a wait of two minutes costs one pass, not 120.

Pure: no I/O, no clock (the shell passes `now`), sorted output.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

import msgspec

from ..contract import events as ev
from ..contract import limits
from ..rules.decide import decide
from ..folding.decisions import describe_action
from ..folding.fold import copy_state, evolve, quarantine
from ..folding.refused import Refused
from ..rules.quota import _within
from ..contract import reasons
from ..folding.replicas import RETIRING
from ..rules.scaling import backoff_until
from ..folding.state import LIVE_SHARD_STATES, State
from ..rules.waits import WaitKind

ROOM_LATER = WaitKind.ROOM_LATER.value  # a model that waits for young victims (decide._why_young_victims)


class Timing:
    """How long a shard of a profile takes from placed to ready: the median
    of what the log shows for that (model, profile), else for the profile's
    name in any model, else `default` (None: limits' sim_ready_after_s).
    `fixed` (--ready-after) overrides all."""

    def __init__(self, default: float | None = None, fixed: float | None = None) -> None:
        self.default = limits.LIMITS.sim_ready_after_s if default is None else default
        self.fixed = fixed
        self.samples: dict[tuple[str, str], list[float]] = {}
        self._median: dict[tuple[str, str], float] = {}

    def add(self, model: str, profile: str, seconds: float) -> None:
        if seconds >= 0:
            self.samples.setdefault((model, profile), []).append(seconds)
            self.samples.setdefault(("", profile), []).append(seconds)
            self._median.clear()

    def learn(self, state: State) -> "Timing":
        """Samples from the replicas a folded state holds (placed by a
        decision and ready since)."""
        for r in sorted(state.replicas.values(), key=lambda r: r.id):
            if r.ready_at and r.placed_at and not r.replaced:
                self.add(r.model, r.profile, r.ready_at - r.placed_at)
        return self

    def ready_after(self, model: str, profile: str) -> float:
        if self.fixed is not None:
            return self.fixed
        for key in ((model, profile), ("", profile)):
            got = self._median.get(key)
            if got is not None:
                return got
            xs = self.samples.get(key)
            if xs:
                s = sorted(xs)
                got = self._median[key] = round(s[len(s) // 2], 3)
                return got
        return self.default


# --------------------------------------------------------------------------- the simulated fleet


class Sim:
    """A state folded forward by decisions and simulated agents' facts.

    `fold` applies one event (quarantined, as the fold does, if it breaks a
    rule); `decide_pass` decides, folds the pass and schedules what the
    simulated agents report of it; `advance` folds the simulated facts due."""

    def __init__(self, state: State, timing: Timing, stop_s: float | None = None) -> None:
        self.state = state
        self.seq = state.seq
        self.timing = timing
        self.stop_s = limits.LIMITS.sim_stop_s if stop_s is None else stop_s
        self.timers: list[tuple[float, int, ev.Event]] = []
        self._n = itertools.count()
        self.on_fold: Callable[[State, ev.Event], None] | None = None  # called after each event folded

    def fold(self, event: ev.Event) -> int:
        self.seq += 1
        state = self.state
        try:
            evolve(state, event, self.seq)
        except Refused as e:
            quarantine(state, self.seq, ev.subject_for(event), str(e))
        state.seq = self.seq
        if ev.ORIGIN[type(event)] == "control":
            state.control_seq = self.seq
        if self.on_fold is not None:
            self.on_fold(state, event)
        return self.seq

    def decide_pass(self, now: float, leader: str = "what-if") -> list[ev.Action]:
        actions = decide(self.state, now)
        if actions:
            self.fold(ev.Decided(at=now, basis=self.state.seq, actions=actions, leader=leader))
            self.agents(actions, now)
        return actions

    def later(self, at: float, event: ev.Event) -> None:
        heapq.heappush(self.timers, (at, next(self._n), event))

    def next_timer(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    def advance(self, until: float) -> int:
        """Fold the simulated facts due by `until`; how many."""
        n = 0
        while self.timers and self.timers[0][0] <= until:
            at, _, event = heapq.heappop(self.timers)
            self.fold(event)
            n += 1
        return n

    def agents(self, actions: list[ev.Action], now: float) -> None:
        """What the simulated agents will report of a pass that landed."""
        state = self.state
        exits: dict[str, float] = {}  # replica -> when its shards exit
        for a in actions:
            cls = type(a)
            if cls is ev.StopReplica:
                rep = state.replicas.get(a.replica)
                if rep is None:
                    continue
                t = now + min(a.drain_s, self.stop_s)
                exits[a.replica] = t
                for sh in rep.shards:
                    if sh.state in LIVE_SHARD_STATES:
                        self.later(t, ev.ShardStatus(at=t, node=sh.node, replica=rep.id, shard=sh.id,
                                                     generation=sh.generation, state="stopped", reason=a.reason))
            elif cls is ev.StopStray:
                t = now + self.stop_s
                self.later(t, ev.ShardStatus(at=t, node=a.node, replica=a.shard.rpartition(".")[0], shard=a.shard,
                                             generation=a.generation, state="stopped", reason=a.reason))
        for a in actions:
            if type(a) is not ev.PlaceReplica:
                continue
            rep = state.replicas.get(a.replica)
            if rep is None:
                continue  # voided at fold time
            start = max(now, exits.get(a.replaces, now))
            ready = start + self.timing.ready_after(a.model, a.profile)
            for sh in rep.shards:
                endpoint = f"http://{sh.node}:{sh.port}"
                self.later(start, ev.ShardStatus(at=start, node=sh.node, replica=rep.id, shard=sh.id,
                                                 generation=sh.generation, state="starting"))
                self.later(ready, ev.ShardStatus(at=ready, node=sh.node, replica=rep.id, shard=sh.id,
                                                 generation=sh.generation, state="ready", endpoint=endpoint))


def next_wake(state: State, now: float, traffic: bool = True) -> float | None:
    """The next moment after `now` at which time alone may change what
    `decide` says (None: none): a ready replica's minimum lifetime ends
    (a waiting model may preempt it), a hold or a back-off ends, an adopted
    replica's wait for its shards ends, a restart's drain grace ends; and,
    with `traffic`, a gateway's load goes stale, a peak leaves the
    scale-down delay, an on-demand model's idle time is over (a dry run
    holds the traffic as it stands: `hold_load`)."""
    policy = state.policy
    times: list[float] = []
    # Only a model that waits for young victims can be helped by a lifetime
    # ending (and reading every replica costs: this runs between passes).
    waiting = any(m.waiting_kind == ROOM_LATER for m in state.models.values())
    for m in state.models.values():
        if m.held_for:
            times.append(m.held_until)
        if m.start_failures and not m.parked:
            times.append(backoff_until(m, policy))
        if not traffic:
            continue
        for load in m.load.values():
            if load.in_flight or load.queued:
                times.append(load.at + limits.LIMITS.load_fresh_s + 1e-3)
        for p in m.peaks:
            times.append(p.at + m.spec.scale_down_delay_s + 1e-3)
        if m.spec.on_demand and m.last_used:
            times.append(m.last_used + m.spec.idle_s)
            times.append(m.last_used + policy.eviction_grace_s)
    if not waiting and not any(t.retiring or t.assembling for t in state.tallies.values()):
        later = [t for t in times if t > now]
        return min(later) if later else None
    for r in state.replicas.values():
        if waiting and r.ready_at:
            times.append(r.ready_at + policy.min_lifetime_s)
        if r.want_shards:
            times.append(r.placed_at + policy.adopt_wait_s + 1e-3)
        if r.restart in RETIRING:
            model = state.models.get(r.model)
            if model is not None:
                times.append(r.retiring_at + model.spec.drain_grace_s + 1e-3)
    later = [t for t in times if t > now]
    return min(later) if later else None


# --------------------------------------------------------------------------- what a dry run says


class Happening(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One thing that would happen, `after_s` seconds from now."""

    after_s: float
    kind: str  # place, ready, stop, restart, refuse-restart, preempt, wait, scale, park, stop-stray
    model: str = ""
    replica: str = ""
    what: str = ""  # in words: where, which victims and their tiers, ...
    reason: str = ""
    victims: list[ev.Victim] = []
    shards: list[str] = []  # node:gpu+gpu, rank order


class Change(msgspec.Struct, kw_only=True):
    """A field a file changes: before → after (None: not there)."""

    field: str
    before: object = None
    after: object = None


class Changed(msgspec.Struct, kw_only=True):
    kind: str  # model, owner, api key, policy
    name: str
    verb: str  # created, configured
    fields: list[Change] = []


class Standing(msgspec.Struct, kw_only=True):
    """A model before and after: replicas ready, and why it waits at the end."""

    model: str
    ready_before: int
    ready_after: int
    waiting: str = ""


class OwnerPast(msgspec.Struct, kw_only=True):
    owner: str
    guarantee: ev.Resources
    before: ev.Resources
    after: ev.Resources


class DryRun(msgspec.Struct, kw_only=True):
    basis: int  # the log's sequence the state was folded to
    passes: int
    settled: bool  # False: stopped at its most passes or its horizon with things still to do
    after_s: float  # simulated time it took to settle
    changes: list[Changed] = []
    happenings: list[Happening] = []
    models: list[Standing] = []
    owners_past_guarantee: list[OwnerPast] = []


def _shards(a: ev.PlaceReplica) -> list[str]:
    return [f"{s.node}:{'+'.join(map(str, s.gpus)) or '-'}" for s in sorted(a.shards, key=lambda s: s.rank)]


def happenings(actions: Iterable[ev.Action], after_s: float) -> list[Happening]:
    out = []
    for a in actions:
        cls = type(a)
        said, why = describe_action(a), reasons.words(a)
        if cls is ev.PlaceReplica:
            h = Happening(after_s=after_s, kind="place", model=a.model, replica=a.replica, what=said,
                          reason=why, shards=_shards(a))
        elif cls is ev.Preempt:
            h = Happening(after_s=after_s, kind="preempt", model=a.model, what=said, reason=why,
                          victims=list(a.victims))
        elif cls is ev.StopReplica or cls is ev.RestartReplica or cls is ev.RefuseRestart:
            h = Happening(after_s=after_s, kind=str(cls.__struct_config__.tag), model=a.replica.rpartition("-")[0],
                          replica=a.replica, what=said, reason=why)
        elif cls is ev.StopStray:
            h = Happening(after_s=after_s, kind="stop-stray", replica=a.shard, what=said, reason=why)
        else:  # wait, scale, park
            h = Happening(after_s=after_s, kind=str(cls.__struct_config__.tag), model=a.model, what=said,
                          reason=why)
        out.append(h)
    return out


def ready_counts(state: State) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in state.replicas.values():
        if r.state == "ready" and r.restart not in RETIRING:
            out[r.model] = out.get(r.model, 0) + 1
    return out


def past_guarantee(state: State) -> dict[str, ev.Resources]:
    """Owners holding more than their guarantee: what they hold."""
    out = {}
    for name in sorted(state.owners):
        g = state.owners[name].guarantee
        used = state.usage.get(name, ev.Resources())
        if (g.gpus or g.cpu_cores or g.memory_gb) and not _within(used, g):
            out[name] = used
    return out


def hold_load(state: State, since: float, t: float) -> None:
    """The gateways' load as it stood at `since`, still reported at `t`: a
    dry run says what a change does to the fleet, not what traffic going
    quiet would (the gateways repeat a load every few seconds)."""
    for m in state.models.values():
        for load in m.load.values():
            if since - load.at <= limits.LIMITS.load_fresh_s:
                load.at = t


def dry_run(
    state: State, as_if: list[ev.Event], now: float, *, timing: Timing | None = None,
    changes: list[Changed] | None = None, max_passes: int | None = None, horizon_s: float | None = None,
) -> DryRun:
    """Fold `as_if` (stamped `now`) on a copy of `state` and decide until
    nothing more happens, or `max_passes` passes, or `horizon_s` simulated
    seconds (None: limits' dry_run_passes, dry_run_horizon_s): what would
    happen, in order. `state` is left as it was."""
    max_passes = limits.LIMITS.dry_run_passes if max_passes is None else max_passes
    horizon_s = limits.LIMITS.dry_run_horizon_s if horizon_s is None else horizon_s
    timing = timing or Timing().learn(state)
    before_ready = ready_counts(state)
    before_owners = past_guarantee(state)
    sim = Sim(copy_state(state), timing)
    for e in as_if:
        sim.fold(msgspec.structs.replace(e, at=now))
    t = now
    out: list[Happening] = []
    passes = 0
    settled = False
    while passes < max_passes:
        hold_load(sim.state, now, t)
        acts = sim.decide_pass(t)
        passes += 1
        if acts:
            out.extend(happenings(acts, round(t - now, 3)))
            continue
        nxt = [x for x in (sim.next_timer(), next_wake(sim.state, t, traffic=False)) if x is not None]
        if not nxt or min(nxt) - now > horizon_s:
            settled = True
            break
        t = max(t, min(nxt))
        timers = sim.timers[:]
        sim.advance(t)
        became = _became_ready(timers, t, sim.state)
        out.extend(Happening(after_s=round(at - now, 3), kind="ready", model=m, replica=r,
                             what=f"{r} ready (simulated)") for at, m, r in became)
    end = sim.state
    after_ready = ready_counts(end)
    models = [
        Standing(model=name, ready_before=before_ready.get(name, 0), ready_after=after_ready.get(name, 0),
                 waiting=end.models[name].waiting if name in end.models else "")
        for name in sorted(set(before_ready) | set(after_ready) | set(end.models) | set(state.models))
    ]
    after_owners = past_guarantee(end)
    owners = [
        OwnerPast(owner=o, guarantee=end.owners[o].guarantee if o in end.owners else state.owners[o].guarantee,
                  before=state.usage.get(o, ev.Resources()), after=end.usage.get(o, ev.Resources()))
        for o in sorted(set(after_owners) - set(before_owners))
    ]
    return DryRun(basis=state.seq, passes=passes, settled=settled, after_s=round(t - now, 3), changes=changes or [],
                  happenings=out, models=models, owners_past_guarantee=owners)


def _became_ready(timers: list, until: float, state: State) -> list[tuple[float, str, str]]:
    """The replicas the simulated facts due by `until` made ready: (when, model, replica)."""
    out = []
    seen = set()
    for at, _, e in sorted(timers):
        if at > until or type(e) is not ev.ShardStatus or e.state != "ready" or e.replica in seen:
            continue
        rep = state.replicas.get(e.replica)
        if rep is not None and rep.state == "ready" and rep.ready_at == at:
            seen.add(e.replica)
            out.append((at, rep.model, rep.id))
    return out


# --------------------------------------------------------------------------- what a file changes


def _plain(v):
    """A struct as plain data with every field, defaults too (to_builtins
    leaves defaults out, and a field back at its default is a change)."""
    if isinstance(v, msgspec.Struct):
        return {f: _plain(getattr(v, f)) for f in v.__struct_fields__}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _flat(value, prefix: str = "") -> dict[str, object]:
    """A struct as dotted fields; profiles (lists of named things) by name."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and all(isinstance(x, dict) and "name" in x for x in value):
        out = {}
        for x in value:
            out.update(_flat({k: v for k, v in x.items() if k != "name"}, f"{prefix}{x['name']}."))
            out[f"{prefix}{x['name']}"] = "(defined)"
        return out
    return {prefix.rstrip("."): value}


def field_changes(before, after) -> list[Change]:
    """What differs between two versions of a thing (None: it did not exist), field by field, sorted."""
    b = _flat(_plain(before)) if before is not None else {}
    a = _flat(_plain(after)) if after is not None else {}
    return [Change(field=k, before=b.get(k), after=a.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

