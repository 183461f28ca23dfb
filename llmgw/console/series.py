"""The console's plots and timelines (issue 34): what the fleet did over time,
per model, per owner and per GPU, made from the fold and the log, never from
Prometheus.

WHY a recorder that follows the fold, and not a fold per question: a plot
over the whole log at 120 points would fold the log 120 times. The
`Recorder` looks at each event once, right after the fold applied it (the
console's `_on_message`), and keeps only what changed: step series (ready
and desired replicas, GPUs held per owner, requests queued and in flight),
the gateways' load reports as they came (requests, tokens, cached prompt
tokens, time to first byte) and usage reports (tokens per owner), marks per model (placed, ready, drained,
preempted, failed, each with its reason) and what each GPU held, from when
to when. Any window of the log is then cut from these (`plots`, `timeline`,
`gpus`), pure functions of the recorder.

Time is the log's: each event's `at`, never going back (an event stamped
earlier than one before it counts at the later time). A step series' value
at time T is then exactly what the fold says after the events up to T
(replay.tool.fold_until at ("time", T)): the tests compare the two.
Quarantined events change nothing here, as they change nothing in the fold.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

import msgspec

from ..core.contract import events as ev
from ..core.folding.decisions import describe_action
from ..core.folding.fold import apply
from ..core.simulation.history import Record
from ..core.contract.reasons import victim_words, words
from ..core.rules.scaling import decided
from ..core.folding.state import LIVE_SHARD_STATES, State

NO_OWNER = "(no owner)"


class Steps:
    """A value that holds until it changes: the times of its changes and the values."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []

    def set(self, t: float, value: float) -> None:
        if self.values and self.values[-1] == value:
            return
        if self.times and self.times[-1] == t:  # changed twice at one time: the last word holds
            self.values[-1] = value
            if len(self.values) > 1 and self.values[-2] == value:
                self.times.pop()
                self.values.pop()
            return
        self.times.append(t)
        self.values.append(value)

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[i] if i >= 0 else 0


class Mark(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One moment in a model's lane of the timeline."""

    t: float
    seq: int
    kind: str  # placed | ready | drained | preempted | failed
    replica: str
    nodes: list[str] = []
    reason: str = ""
    voided: str = ""  # why the fold did not carry the decision out


class Segment(msgspec.Struct, kw_only=True, array_like=True):
    start: float
    end: float  # math.inf while it holds
    model: str
    replica: str


class _Loads:
    """One model's load reports, by time (every gateway's): the times, for
    bisecting, and (requests, tokens in, tokens out, cached, p50, p90) each."""

    __slots__ = ("times", "reports")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.reports: list[tuple[int, int, int, int, float, float]] = []


class _Usage:
    """One model's usage reports (UsageReported rows, every gateway's), by time: (owner, tokens in and out) each."""

    __slots__ = ("times", "rows")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.rows: list[tuple[str, int]] = []


class Recorder:
    """What the plots and timelines need, kept as the log is folded: call
    `observe` after `apply` of each event, with the state it left."""

    def __init__(self) -> None:
        self.t = 0.0  # the log's time so far (never going back)
        self.first = 0.0  # the first event's (the first with a time: one that cannot be read has none)
        self.times: list[float] = []  # each time of the log, and its last event (a time to a point of the slider)
        self.seqs: list[int] = []
        self.ready: dict[str, Steps] = {}
        self.desired: dict[str, Steps] = {}
        self.queued: dict[str, Steps] = {}
        self.in_flight: dict[str, Steps] = {}
        self.owner_gpus: dict[str, Steps] = {}
        self.loads: dict[str, _Loads] = {}
        self.usage: dict[str, _Usage] = {}  # model -> its usage per owner (issue 32)
        self.marks: dict[str, list[Mark]] = {}
        self.segments: dict[str, dict[int, list[Segment]]] = {}  # node -> GPU -> what it held, in order
        # What each replica counted for when last looked at: (model, owner, state, GPUs held, nodes).
        self._reps: dict[str, tuple[str, str, str, int, tuple[str, ...]]] = {}
        self._on_node: dict[str, set[str]] = {}  # node -> replicas seen there
        self._ready_n: dict[str, int] = {}
        self._owner_n: dict[str, int] = {}
        self._held: dict[str, dict[int, str]] = {}  # node -> GPU -> shard, as last seen
        self._quarantined = 0
        self._voided = 0

    # ------------------------------------------------------------------ following the fold

    def observe(self, state: State, seq: int, subject: str, data: bytes) -> None:
        quarantined, self._quarantined = state.quarantine_count != self._quarantined, state.quarantine_count
        voided = state.voided_count - self._voided
        self._voided = state.voided_count
        if subject.startswith("llmgw.agent.") and b'"node.power"' in data:  # the most frequent, and nothing here
            self._tick(seq, None)
            return
        try:
            e = ev.decode(data)
        except msgspec.MsgspecError:
            self._tick(seq, None)
            return
        t = self._tick(seq, e.at)
        if quarantined:
            return
        cls = type(e)
        if cls is ev.ModelLoad:
            self._load(state, e, t)
        elif cls is ev.UsageReported:
            for r in e.rows:
                if r.tokens_in or r.tokens_out:
                    u = self.usage.get(r.model)
                    if u is None:
                        u = self.usage[r.model] = _Usage()
                    u.times.append(t)
                    u.rows.append((r.owner or NO_OWNER, r.tokens_in + r.tokens_out))
        elif cls is ev.ShardStatus:
            self._replica(state, e.replica, t, seq)
            self._node(state, e.node, t)
        elif cls is ev.Decided:
            self._decided(state, e, seq, t, voided)
        elif cls is ev.NodeRegistered or cls is ev.NodeLost:
            self._node_moved(state, e.node, t, seq)
        elif cls is ev.ModelApplied or cls is ev.ModelRemoved:
            name = e.model.name if cls is ev.ModelApplied else e.name
            self._desired(state, name, t)
            for rid in [r for r, v in self._reps.items() if v[0] == name]:
                self._replica(state, rid, t, seq)

    def _tick(self, seq: int, at: float | None) -> float:
        """The log's time after this event; `times`/`seqs` keep the last event of each time."""
        if at is not None and at > self.t:
            if not self.first:
                self.first = at
            self.t = at
        if self.times and self.times[-1] == self.t:
            self.seqs[-1] = seq
        else:
            self.times.append(self.t)
            self.seqs.append(seq)
        return self.t

    def _decided(self, state: State, e: ev.Decided, seq: int, t: float, voided: int) -> None:
        undone = {v.action: v.reason for v in state.voided[-voided:] if v.seq == seq} if voided > 0 else {}
        models: set[str] = set()
        for a in e.actions:
            k = type(a)
            why = undone.get(describe_action(a), "") if undone else ""
            if k is ev.PlaceReplica:
                nodes = [s.node for s in sorted(a.shards, key=lambda s: s.rank)]
                self._mark(Mark(t=t, seq=seq, kind="placed", replica=a.replica, nodes=nodes, reason=words(a), voided=why),
                           a.model)
                self._replica(state, a.replica, t, seq)
                for n in nodes:
                    self._node(state, n, t)
                models.add(a.model)
            elif k is ev.StopReplica:
                rep = state.replicas.get(a.replica)
                model = rep.model if rep is not None else a.replica.rpartition("-")[0]
                nodes = list(self._reps.get(a.replica, ("", "", "", 0, ()))[4])
                self._mark(Mark(t=t, seq=seq, kind="drained", replica=a.replica, nodes=nodes, reason=words(a), voided=why),
                           model)
                self._replica(state, a.replica, t, seq)
                for n in nodes:
                    self._node(state, n, t)
                models.add(model)
            elif k is ev.Preempt:
                for v in a.victims:
                    nodes = list(self._reps.get(v.replica, ("", "", "", 0, ()))[4])
                    self._mark(Mark(t=t, seq=seq, kind="preempted", replica=v.replica, nodes=nodes,
                                    reason=f"for {a.model}: {victim_words(v)}; {words(a)}", voided=why), v.model)
                models.add(a.model)
            elif k is ev.ScaleModel or k is ev.ModelWaiting or k is ev.ParkModel:
                models.add(a.model)
            elif k is ev.RestartReplica or k is ev.RefuseRestart:
                self._replica(state, a.replica, t, seq)
        for name in models:
            self._desired(state, name, t)

    def _mark(self, mark: Mark, model: str) -> None:
        self.marks.setdefault(model, []).append(mark)

    def _desired(self, state: State, name: str, t: float) -> None:
        m = state.models.get(name)
        self.desired.setdefault(name, Steps()).set(t, decided(m) if m is not None else 0)

    def _load(self, state: State, e: ev.ModelLoad, t: float) -> None:
        """(Most events of a real day's log are these: kept short.)"""
        name = e.model
        m = state.models.get(name)
        if m is None:
            return  # the fold drops a load on no model of the catalog
        queued = self.queued.get(name)
        if queued is None:
            queued = self.queued[name] = Steps()
            self.in_flight[name] = Steps()
        q = f = 0
        for x in m.load.values():
            q += x.queued
            f += x.in_flight
        queued.set(t, q)
        self.in_flight[name].set(t, f)
        if e.requests or e.tokens_in or e.tokens_out:
            lo = self.loads.get(name)
            if lo is None:
                lo = self.loads[name] = _Loads()
            lo.times.append(t)
            tin = e.tokens_in
            lo.reports.append((e.requests, tin, e.tokens_out, e.tokens_cached if e.tokens_cached < tin else tin,
                               e.ttft_p50, e.ttft_p90))

    def _replica(self, state: State, rid: str, t: float, seq: int) -> None:
        """Count the replica again: its model's ready count, its owner's GPUs."""
        rep = state.replicas.get(rid)
        old = self._reps.get(rid)
        if rep is None:
            new = None
        else:
            model = state.models.get(rep.model)
            owner = rep.owner or (model.spec.owner if model is not None else "") or NO_OWNER
            live = [s for s in rep.shards if s.state in LIVE_SHARD_STATES]
            new = (rep.model, owner, rep.state, sum(len(s.gpus) for s in live),
                   tuple(sorted({s.node for s in rep.shards})))
        if new == old:
            return
        if old is not None:
            self._count(old, -1, t)
            for n in old[4]:
                self._on_node.get(n, set()).discard(rid)
        if new is not None:
            self._count(new, 1, t)
            for n in new[4]:
                self._on_node.setdefault(n, set()).add(rid)
            self._reps[rid] = new
            was = old[2] if old is not None else ""
            if new[2] != was and new[2] in ("ready", "failed"):  # (a node lost fails its replicas in the fold alone)
                self._mark(Mark(t=t, seq=seq, kind=new[2], replica=rid, nodes=list(new[4]),
                                reason=rep.reason if new[2] == "failed" else ""), new[0])
        else:
            del self._reps[rid]

    def _count(self, rep: tuple[str, str, str, int, tuple[str, ...]], sign: int, t: float) -> None:
        model, owner, now, gpus, _nodes = rep
        if now == "ready":
            n = self._ready_n[model] = self._ready_n.get(model, 0) + sign
            self.ready.setdefault(model, Steps()).set(t, n)
        if gpus:
            n = self._owner_n[owner] = self._owner_n.get(owner, 0) + sign * gpus
            self.owner_gpus.setdefault(owner, Steps()).set(t, n)

    def _node_moved(self, state: State, name: str, t: float, seq: int) -> None:
        """A node registered (perhaps with engines running) or lost: everything on it is counted again."""
        node = state.nodes.get(name)
        rids = set(self._on_node.get(name, ()))
        if node is not None:
            rids |= {shard.rpartition(".")[0] for shard in node.used.values()}
        for rid in sorted(rids):
            self._replica(state, rid, t, seq)
        self._node(state, name, t)

    def _node(self, state: State, name: str, t: float) -> None:
        """What the node's GPUs hold now, against what they held."""
        node = state.nodes.get(name)
        now = dict(node.used) if node is not None else {}
        was = self._held.get(name, {})
        if now == was:
            return
        per_gpu = self.segments.setdefault(name, {})
        for g in sorted(set(now) | set(was)):
            if now.get(g) == was.get(g):
                continue
            segs = per_gpu.setdefault(g, [])
            if was.get(g) and segs and segs[-1].end == math.inf:
                segs[-1].end = t
            shard = now.get(g)
            if shard:
                rid = shard.rpartition(".")[0]
                rep = state.replicas.get(rid)
                segs.append(Segment(start=t, end=math.inf, model=rep.model if rep is not None else rid.rpartition("-")[0],
                                    replica=rid))
        self._held[name] = now


def record(records: Iterable[Record]) -> tuple[State, Recorder]:
    """Fold `records` from nothing, recording as the console does."""
    state, rec = State(), Recorder()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
        rec.observe(state, seq, subject, data)
    return state, rec


# ---------------------------------------------------------------------- windows


def window(rec: Recorder, start: float | None, end: float | None) -> tuple[float, float]:
    """[start, end] of the log's time, the whole log by default; never empty."""
    lo = rec.first if start is None else start
    hi = rec.t if end is None else end
    if hi <= lo:
        hi = lo + 1.0
    return lo, hi


def seq_at(rec: Recorder, t: float) -> int:
    """The last event at or before time `t` (0: before the log)."""
    i = bisect.bisect_right(rec.times, t) - 1
    return rec.seqs[i] if i >= 0 else 0


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def plots(rec: Recorder, model: str, start: float, end: float, points: int) -> dict:
    """The model's series and every owner's GPUs over [start, end], at
    `points` + 1 times: x[0] = start, then the end of each of `points` equal
    buckets. A step series (replicas, GPUs, queued, in flight) is its value
    at each x; a rate (requests/s, tokens/s) is what the bucket ending at x
    counted over its width; TTFT is the requests-weighted mean of the
    gateways' percentiles reported in the bucket, and the prefix-hit ratio
    cached prompt tokens over prompt tokens there (None where nothing was
    answered: a gap in the line, not a zero)."""
    step = (end - start) / points
    xs = [start + i * step for i in range(points + 1)]
    xs[-1] = end

    def steps(series: dict[str, Steps], key: str) -> list[float]:
        s = series.get(key)
        return [s.at(x) if s is not None else 0 for x in xs]

    out: dict = {
        "x": xs, "step": step,  # (not rounded: a time cut short would fall before its event)
        "owners": {o: steps(rec.owner_gpus, o) for o in sorted(rec.owner_gpus)},
    }
    series = {"ready": steps(rec.ready, model), "desired": steps(rec.desired, model),
              "queued": steps(rec.queued, model), "in_flight": steps(rec.in_flight, model)}
    rates = {k: [None] for k in ("requests_s", "tokens_in_s", "tokens_out_s", "ttft_p50", "ttft_p90", "prefix_hit")}
    lo = rec.loads.get(model)
    for i in range(1, len(xs)):
        if lo is None:
            a = b = 0
        else:  # the reports in (x[i-1], x[i]]
            a, b = bisect.bisect_right(lo.times, xs[i - 1]), bisect.bisect_right(lo.times, xs[i])
            if i == 1:
                a = bisect.bisect_left(lo.times, xs[0])  # the first bucket holds its start
        width = xs[i] - xs[i - 1] or 1.0
        if a == b:
            for k in rates:
                rates[k].append(0.0 if k.endswith("_s") else None)
            continue
        got = lo.reports[a:b]
        req, tin, tout, cached = (sum(r[k] for r in got) for k in range(4))
        rates["requests_s"].append(_r(req / width))
        rates["tokens_in_s"].append(_r(tin / width))
        rates["tokens_out_s"].append(_r(tout / width))
        timed = [(max(r[0], 1), r[4], r[5]) for r in got if r[4] > 0]
        weight = sum(w for w, _, _ in timed)
        rates["ttft_p50"].append(_r(sum(w * p for w, p, _ in timed) / weight) if weight else None)
        rates["ttft_p90"].append(_r(sum(w * p for w, _, p in timed) / weight) if weight else None)
        rates["prefix_hit"].append(_r(cached / tin) if tin else None)
    out["series"] = {**series, **rates}
    out["usage"] = _usage(rec.usage.get(model), xs)
    return out


def _usage(u: _Usage | None, xs: list[float]) -> dict[str, list]:
    """Tokens/s per owner over the buckets ending at xs[1:] (None at xs[0], as the rates)."""
    if u is None:
        return {}
    owners = sorted({o for o, _ in u.rows})
    out = {o: [None] for o in owners}
    for i in range(1, len(xs)):
        a, b = bisect.bisect_right(u.times, xs[i - 1]), bisect.bisect_right(u.times, xs[i])
        if i == 1:
            a = bisect.bisect_left(u.times, xs[0])
        width = xs[i] - xs[i - 1] or 1.0
        got = dict.fromkeys(owners, 0)
        for o, n in u.rows[a:b]:
            got[o] += n
        for o in owners:
            out[o].append(_r(got[o] / width))
    return out


def timeline(rec: Recorder, start: float, end: float, models: list[str], limit: int, cells: int,
             named: int = 8) -> list[dict]:
    """One lane per model: its marks in [start, end], those of one kind
    within one of `cells` equal stretches of the window made one (a pass
    that places 200 replicas is one mark of 200, not 200 marks drawn on one
    pixel): its first time, its last event (where a click travels: after
    all of them), how many, the first `named` replicas and nodes, and its
    reasons (each once). The last `limit` of each lane."""
    width = (end - start) / cells
    lanes = []
    for name in models:
        marks = rec.marks.get(name, [])
        a = bisect.bisect_left(marks, start, key=lambda m: m.t)
        b = bisect.bisect_right(marks, end, key=lambda m: m.t)
        groups: dict[tuple[int, str], dict] = {}
        for m in marks[a:b]:
            key = (min(int((m.t - start) / width), cells - 1), m.kind)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"t": m.t, "seq": m.seq, "kind": m.kind, "n": 0, "replicas": [], "nodes": [],
                                   "reasons": [], "voided": []}
            g["n"] += 1
            g["seq"] = max(g["seq"], m.seq)
            if len(g["replicas"]) < named:
                g["replicas"].append(m.replica)
            for n in m.nodes:
                if len(g["nodes"]) < named and n not in g["nodes"]:
                    g["nodes"].append(n)
            for said, into in ((m.reason, g["reasons"]), (m.voided, g["voided"])):
                if said and len(into) < named and said not in into:
                    into.append(said)
        shown = sorted(groups.values(), key=lambda g: (g["t"], g["seq"]))
        lanes.append({"model": name, "total": b - a, "groups": len(shown), "marks": shown[-limit:]})
    return lanes


def gpus(rec: Recorder, state: State, node: str, start: float, end: float, limit: int) -> list[dict]:
    """What each of the node's GPUs held within [start, end]: segments cut to
    the window (the last `limit` of each GPU), an open one ending at `end`."""
    n = state.nodes.get(node)
    per_gpu = rec.segments.get(node, {})
    indices = sorted({g.index for g in n.gpus} | set(per_gpu)) if n is not None else sorted(per_gpu)
    out = []
    for g in indices:
        segs = [s for s in per_gpu.get(g, []) if s.end > start and s.start <= end]
        out.append({"index": g, "segments": [{"from": max(s.start, start), "to": min(s.end, end),
                                              "model": s.model, "replica": s.replica} for s in segs[-limit:]]})
    return out
