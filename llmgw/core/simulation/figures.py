"""The figures of a run, recorded or what-if (`llmgw replay --what-if`,
core/simulation/redecide.py): kept by a `Meter` as its events are folded, so that the
two runs are measured by the same code.

Per model: when its first replica was ready, how long it waited and why,
replicas placed and preempted, restarts refused, the GPU-hours its shards
held, the load (in flight and queued, as the gateways recorded it) that
came while it had no ready replica, and what it held at the end.
"""

from __future__ import annotations

import msgspec

from ..contract import events as ev
from ..contract import limits
from ..folding.replicas import RETIRING
from ..folding.state import LIVE_SHARD_STATES, State


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
            top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[: limits.LIMITS.top_reasons]  # the longest
            out[name] = Figures(
                first_ready_s=None if mm.first_ready is None else round(mm.first_ready - self.start, 3),
                waiting_s=round(waiting, 3), waiting_reasons=[Why(reason=r, seconds=round(s, 3)) for r, s in top],
                placed=mm.placed, preempted=mm.preempted, restarts_refused=mm.refused,
                gpu_hours=round(mm.gpu_s / 3600.0, 6), queued_request_s=round(mm.queued_s, 3),
                gpus_at_end=at_end.get(name, 0),
            )
        return out
