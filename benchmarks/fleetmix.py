"""Recorded logs with other mixes of events than fleetgen's status-heavy one.

fleetgen.py's log is 97 % `shard.status` from 200 nodes with no owners, no
load reports, no restarts and no preemptions (issue 18). Two more mixes,
generated the same way (the real core folds and decides every event, time
simulated, randomness seeded), on the same 200 nodes:

**realistic**: what a day of a real fleet writes. How the proportions were
chosen, per simulated day of 200 nodes x 8 GPUs, ~40 models:

- Gateway load reports dominate. A gateway publishes `model.load` per model
  when its in-flight/queued count changes, coalesced to at most about one a
  second, and once more when it falls to nothing (gateway/server.py). With 4
  gateways and ~40 models, a busy pair reports every few seconds; traffic
  follows the day (a sine with its trough at night, when a third of the
  models are quiet), so a pair reports every ~25 s on average (`load_every`):
  ~4.6 events/s, ~94 % of the log.
- Shard status is a shard's lifecycle only (starting, loading, ready,
  stopped or failed: heartbeats are in the KV bucket, not the log). Shards
  come and go with scaling on load (half the models scale between min and
  max with `target_load`), with on-demand models (a tenth: asleep until a
  session of requests wakes them, asleep again `idle_s` after it), with
  failures (one replica in ~600 a day fails: one every 2 minutes fleet-wide,
  what large GPU fleets report for ECC, NCCL and OOM failures) and with
  restarts: ~5 % of the log (~0.26 events/s: these mechanisms make fewer
  than the 10-15 % first estimated here).
- Decisions: a pass per 15 s window with anything new, most of them with a
  scale step, a placement, a stop or a waiting reason: ~1 % (one pass per
  ~24 s).

  (The shares are those of the 1,000,000-event log, 56.7 simulated hours:
  `python benchmarks/fleetgen.py --mix realistic` prints them.)
- Owners with guarantees (one per model family, guaranteeing a share of the
  fleet) and priorities (critical, standard, opportunistic): at the daily
  peak the scaled models ask for more than the fleet has, so critical
  models preempt opportunistic ones.
- Operators: a rolling restart (`replicas.restart`, surge 1) every ~2 hours,
  a model changed, scaled or removed every ~20 minutes; node crashes every
  ~1.5 h and partitions every ~4 h (as fleetgen), agent restarts every
  ~30 min.

**decisions**: the same fleet pressed to decide: shards fail every ~3 s,
operators restart and change models every minute or two, on-demand models
wake and sleep every few minutes, load is reported rarely, and the control
plane decides after every burst (a pass per second with anything new, as
its tick allows, not per 15 s window): one event in ten or so is a
`control.decided`, most with a stop and a placement or a restart step.

    python benchmarks/fleetgen.py --events 1000000 --mix realistic
"""

from __future__ import annotations

import heapq
import math

import fleetgen
from fleetgen import Fleet, msgspec_replace

from llmgw.core.contract import events as ev

GATEWAYS = ("gw-a", "gw-b", "gw-c", "gw-d")
DAY = 86_400.0
PRIORITY_CYCLE = ("critical", "standard", "standard", "opportunistic")


class Mix:
    """Rates (per simulated second) and shares of one mix."""

    def __init__(self, name: str, **rates: float) -> None:
        self.name = name
        self.shard_failures = rates.get("shard_failures", 1.0 / 60)
        self.operator = rates.get("operator", 1.0 / 1200)
        self.rolling_restarts = rates.get("rolling_restarts", 1.0 / 7200)
        self.load_every = rates.get("load_every", 25.0)  # mean seconds between a busy pair's reports
        self.session_rate = rates.get("session_rate", 1.0 / 1800)  # on-demand sessions per model
        self.session_s = rates.get("session_s", 600.0)
        self.idle_s = rates.get("idle_s", 600.0)
        self.window = rates.get("window", fleetgen.WINDOW)  # seconds between control plane passes


MIXES = {
    "realistic": Mix("realistic"),
    "decisions": Mix(
        "decisions", shard_failures=1.0 / 3, operator=1.0 / 90, rolling_restarts=1.0 / 300, load_every=120.0,
        session_rate=1.0 / 300, session_s=120.0, idle_s=60.0, window=1.0,
    ),
}


def mixed_catalog(models: list[ev.ModelSpec], mix: Mix) -> list[ev.ModelSpec]:
    """fleetgen's catalog, given priorities, scaling on load (half), on demand (a tenth)."""
    out = []
    for i, m in enumerate(models):
        changes: dict = {"priority": PRIORITY_CYCLE[i % len(PRIORITY_CYCLE)]}
        if i % 10 == 7:
            changes.update(on_demand=True, min_replicas=0, max_replicas=max(2, m.min_replicas // 4),
                           target_load=8.0, idle_s=mix.idle_s)
        elif i % 2 == 0:
            changes.update(min_replicas=max(1, m.min_replicas // 2), max_replicas=m.min_replicas * 3 // 2,
                           target_load=16.0, scale_down_delay_s=300.0)
        out.append(msgspec_replace(m, **changes))
    return out


class MixedFleet(Fleet):
    """fleetgen's fleet with owners, gateways, on-demand models and restarts."""

    def __init__(self, n_events: int, out, seed: int, mix: Mix) -> None:
        self.mix = mix
        super().__init__(n_events, out, seed)
        self.window = mix.window
        self.models = {m.name: m for m in mixed_catalog(list(self.models.values()), mix)}
        self.busy_until: dict[str, float] = {}  # on-demand model -> end of its current session
        self.reported: dict[tuple[str, str], tuple[int, int]] = {}
        self.load_chain: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        # Owners first: one per family, guaranteed a share of the fleet's GPUs.
        families = sorted({m.owner for m in self.models.values() if m.owner})
        gpus = (fleetgen.BIG_NODES + fleetgen.SMALL_NODES) * fleetgen.GPUS_PER_NODE
        for i, owner in enumerate(families):
            share = gpus // (2 * len(families))
            self.emit(ev.OwnerApplied(at=self.now, name=owner, guarantee=ev.Resources(gpus=share),
                                      limit=ev.Limit(gpus=share * 3 if i % 2 else None)))
        # The failures of fleetgen's run come at its fixed rate: ours replace them.
        self.every(self.mix.shard_failures, "mixfail")
        self.every(self.mix.rolling_restarts, "rolling")
        for i, name in enumerate(self.models):
            for gw in GATEWAYS:
                self.at(60.0 + i + self.rng.random() * self.mix.load_every, "load", gw, name)
            if self.models[name].on_demand:
                self.at(self.rng.expovariate(self.mix.session_rate), "session", name)
        super().run()

    def on_fail(self) -> None:
        """fleetgen's failure source, at this mix's rate instead (on_mixfail)."""

    def on_mixfail(self) -> None:
        self.every(self.mix.shard_failures, "mixfail")
        agent = self.agents[self.rng.choice(self.names)]
        if not agent.speaks or not agent.running:
            return
        # A serving shard: one failing while it starts counts towards parking its model.
        ready = [k for k, r in agent.running.items() if r.state == "ready"]
        if not ready:
            return
        shard = self.rng.choice(ready)
        sh = agent.running.pop(shard)
        agent.tasks.pop(shard, None)
        self.status(agent, sh.replica, shard, sh.generation, "failed", reason=self.rng.choice(fleetgen.FAILURE_REASONS))

    def on_operator(self) -> None:
        super().on_operator()
        # fleetgen's operator reschedules at its own rate: this mix's instead.
        # In place: run_until pops from the list it holds. A new list here
        # left it popping the old one while new events went to the new one,
        # so every event pending at an operator's change ran twice, and the
        # failures that reschedule themselves doubled at each change (a
        # 1,000,000-event decision-heavy log was hours to generate, its
        # failures hundreds at a time instead of one every few seconds).
        self.heap[:] = [x for x in self.heap if x[2] != "operator"]
        heapq.heapify(self.heap)
        self.every(self.mix.operator, "operator")

    # ------------------------------------------------------------------ load

    def demand(self, name: str) -> int:
        """Requests in flight for a model now, fleet-wide: the day's curve times the model's size."""
        spec = self.models[name]
        if name in self.removed:
            return 0
        if spec.on_demand:
            return self.rng.randint(1, 12) if self.busy_until.get(name, 0.0) > self.now else 0
        day = 0.5 - 0.5 * math.cos(2 * math.pi * ((self.now - fleetgen.T0) % DAY) / DAY)  # 0 at night, 1 at noon
        base = (spec.max_replicas or spec.min_replicas) * 16.0
        quiet = hash(name) % 3 == 0 and day < 0.3  # a third of the models are quiet at night
        if quiet:
            return 0
        return max(0, int(base * (0.15 + 0.85 * day) * self.rng.uniform(0.7, 1.3)))

    def on_load(self, gw: str, name: str, token: int = 0) -> None:
        if self.load_chain.get((gw, name), token) != token:
            return  # another report of this pair is on its way
        total = self.demand(name)
        share = total // len(GATEWAYS) + (1 if self.rng.random() < (total % len(GATEWAYS)) / len(GATEWAYS) else 0)
        ready = self.state.tallies.get(name)
        serving = ready is not None and ready.live > 0
        in_flight, queued = (share, 0) if serving else (0, share)
        last = self.reported.get((gw, name))
        if (in_flight, queued) != last and (last is not None or in_flight or queued):
            self.reported[(gw, name)] = (in_flight, queued)
            self.emit(ev.ModelLoad(at=self.now, gateway=gw, model=name, in_flight=in_flight, queued=queued,
                                   last_used=self.now if in_flight or queued else 0.0))
        wait = self.rng.expovariate(1.0 / self.mix.load_every) if (in_flight or queued) else self.mix.load_every * 4
        token = self.load_chain[(gw, name)] = next(self.tokens)
        self.at(max(1.0, wait), "load", gw, name, token)

    def on_session(self, name: str) -> None:
        self.at(self.rng.expovariate(self.mix.session_rate), "session", name)
        self.busy_until[name] = max(self.busy_until.get(name, 0.0), self.now + self.rng.expovariate(1.0 / self.mix.session_s))

    # ------------------------------------------------------------------ restarts

    def on_rolling(self) -> None:
        self.every(self.mix.rolling_restarts, "rolling")
        ready = sorted({r.model for r in self.state.replicas.values() if r.state == "ready"})
        if not ready:
            return
        model = self.rng.choice(ready)
        ids = sorted(r.id for r in self.state.replicas.values() if r.model == model and r.state == "ready")
        self.emit(ev.ReplicasRestart(at=self.now, replicas=ids, in_place=self.rng.random() < 0.3, max_surge=1))
