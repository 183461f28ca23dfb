"""How fast llmgw answers "what if": a recorded history decided again under
another policy, and a dry run of a change on a big fleet.

    python benchmarks/whatif.py [--events 1000000] [--nodes 2000] [--replicas 10000] [--repeat 3]

(a) `llmgw replay --what-if` on the benchmark log (benchmarks/fleetgen.py,
    the same file benchmarks/replay.py folds, cached by N): events/s
    re-decided, beside the plain fold of the same log (the yardstick, timed
    in the same run, alternated):
    - under the log's own catalog and policy: the what-if follows the log,
      deciding again at every recorded pass (what `replay --verify` does)
      and keeping both sides' figures; it must report no difference;
    - under another policy (a minimum lifetime of 30 s instead of 120 s,
      a first back-off of 2 s instead of 5 s): it goes its own way from the
      first decision that differs, with simulated agents.
(b) `ctl apply --dry-run` on a full 2,000-node fleet (benchmarks/preemption.py's:
    ~10,000 replicas of every class and owner, every GPU taken): the latency
    of a dry run of a new critical model that must preempt, and of a restart,
    beside one `decide` pass on a copy of the same state (the yardstick: the
    least a dry run does).

The machine's cores are noisy: each figure is the best of --repeat runs, and
what matters is the ratio to the yardstick measured beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import fleetgen  # noqa: E402

from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.core.rules.decide import decide  # noqa: E402
from llmgw.core.folding.fold import apply, copy_state  # noqa: E402
from llmgw.core.contract.policy import Policy  # noqa: E402
from llmgw.core.simulation.redecide import Plan, what_if  # noqa: E402
from llmgw.core.folding.state import State  # noqa: E402
from llmgw.core.simulation.whatif import Timing, dry_run  # noqa: E402
from llmgw.replay import logfile  # noqa: E402

now = time.perf_counter
OTHER = Policy(min_lifetime_s=30.0, backoff_first_s=2.0)


def say(*args) -> None:
    print(*args, flush=True)


def fold(records) -> float:
    t = now()
    state = State()
    for seq, subject, data in records:
        apply(state, seq, subject, data)
    return now() - t


def timed_what_if(records, plan: Plan):
    t = now()
    report = what_if(records, plan)
    return now() - t, report


def bench_replay(a) -> None:
    path, info, generated = fleetgen.cached(a.events)
    records = logfile.read(path)
    whole = len(records)
    if a.first:
        records = records[: a.first]
    say(f"(a) the benchmark log: {len(records):,} events of {whole:,} ({path.name}{', generated now' if generated else ''})")
    runs = {"fold": [], "same": [], "other": []}
    reports = {}
    for i in range(a.repeat_replay):
        runs["fold"].append(fold(records))
        s, reports["same"] = timed_what_if(records, Plan())
        runs["same"].append(s)
        runs["fold"].append(fold(records))
        s, reports["other"] = timed_what_if(records, Plan(policy=OTHER))
        runs["other"].append(s)
        say(f"    run {i + 1}: fold {runs['fold'][-2]:.1f}/{runs['fold'][-1]:.1f} s, what-if as recorded "
            f"{runs['same'][-1]:.1f} s, under another policy {runs['other'][-1]:.1f} s")
    n = len(records)
    f = min(runs["fold"])
    same, other = reports["same"], reports["other"]
    say(f"    plain fold (yardstick):        {n / f:>10,.0f} events/s")
    say(f"    what-if as recorded:           {n / min(runs['same']):>10,.0f} events/s re-decided "
        f"(x{min(runs['same']) / f:.1f} the fold's time); {same.passes:,} passes, all as recorded: "
        f"{same.followed == same.passes}; no difference: {same.same}")
    d = other.diverged
    say(f"    what-if under another policy:  {n / min(runs['other']):>10,.0f} events/s re-decided "
        f"(x{min(runs['other']) / f:.1f} the fold's time); {other.passes:,} passes, {other.followed:,} as recorded, "
        f"diverged at sequence {d.seq if d else '-'}; models whose figures differ: "
        f"{sum(1 for r in other.models if r.recorded != r.what_if)} of {len(other.models)}")


def bench_dry_run(a) -> None:
    import random

    import preemption

    say(f"\n(b) dry runs on a full fleet of {a.nodes:,} nodes")
    t = now()
    log, at, info = preemption.full_fleet(argparse.Namespace(nodes=a.nodes, replicas=a.replicas))
    state = log.state
    say(f"    fleet: {info['replicas']:,} replicas, {info['free']} GPUs free; set up in {now() - t:.1f} s")
    rng = random.Random(7)
    timing = Timing(fixed=30.0)
    # A critical model that must preempt: the first of the preemption
    # benchmark's preemptors whose dry run finds victims (found untimed).
    critical = None
    for spec in preemption.preemptors(40, random.Random(preemption.SEED + 1)):
        if spec.priority == "critical":
            e = ev.ModelApplied(at=at, model=spec)
            if any(h.kind == "preempt" for h in dry_run(state, [e], at, timing=timing, max_passes=3).happenings):
                critical = e
                break
    assert critical is not None, "no preemptor finds victims on this fleet"
    ready = sorted(r.id for r in state.replicas.values() if r.state == "ready" and len(r.shards) == 1)
    restart = ev.ReplicasRestart(at=at, replicas=rng.sample(ready, 3))
    runs: dict[str, list[float]] = {"decide": [], "critical": [], "restart": []}
    out = {}
    for _ in range(a.repeat):
        t = now()
        decide(copy_state(state), at)
        runs["decide"].append(now() - t)
        for name, e in (("critical", critical), ("restart", restart)):
            t = now()
            out[name] = dry_run(state, [e], at, timing=timing)
            runs[name].append(now() - t)
    y = min(runs["decide"])
    say(f"    a copy of the state and one decide pass (yardstick): {y * 1000:,.0f} ms")
    spec = critical.model
    for name, what in (("critical", f"a critical model ({spec.min_replicas} x {spec.profiles[0].gpus} GPUs)"),
                       ("restart", "a restart of 3 replicas")):
        r = out[name]
        kinds: dict[str, int] = {}
        for h in r.happenings:
            kinds[h.kind] = kinds.get(h.kind, 0) + 1
        say(f"    dry run of {what}: {min(runs[name]) * 1000:,.0f} ms (x{min(runs[name]) / y:.1f} the yardstick), "
            f"{r.passes} passes, settled {r.settled}, {r.after_s:g} s simulated; {dict(sorted(kinds.items()))}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events in the benchmark log (default 1,000,000)")
    p.add_argument("--nodes", type=int, default=2000, help="nodes of the dry runs' fleet (default 2,000)")
    p.add_argument("--replicas", type=int, default=10_000, help="replicas on that fleet (default 10,000)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each dry-run figure; the best is kept (default 3)")
    p.add_argument("--repeat-replay", type=int, default=1, help="runs of each what-if on the log (default 1: they are long)")
    p.add_argument("--only", choices=("replay", "dry-run"), help="one of the two parts")
    p.add_argument("--first", type=int, default=0, metavar="K",
                   help="(a): the first K events of the log only (0: all); the whole 1M takes about 20 CPU-minutes")
    a = p.parse_args(argv)
    if a.only != "dry-run":
        bench_replay(a)
    if a.only != "replay":
        bench_dry_run(a)


if __name__ == "__main__":
    main()
