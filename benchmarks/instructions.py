"""Instructions per event and per placement, counted by valgrind: figures the machine's noise does not move.

    python benchmarks/instructions.py [--what fold,cold] [--nodes 2000] [--events 100000] [--root PATH ...]

On this 2-core machine the same code folds anywhere between 140k and 240k
events a second from one minute to the next, so a change of 5 % cannot be
seen in seconds, and the speed sessions of issues 14 and 18 chose their
changes by counting instructions instead (valgrind's cachegrind, cache
simulation off; `PYTHONHASHSEED=0` so that every run executes the same
instructions). Each figure is a run that does the work less a run that
only sets it up, divided by the work done:

  fold   the pure fold of the recorded logs (benchmarks/fleetgen.py: the
         status-heavy, realistic and decision-heavy mixes): instructions per
         event, beside msgspec decoding the same events alone, the yardstick
         (benchmarks/replay.py's, counted the same way)
  cold   a cold start of benchmarks/placement.py's fleet and catalog
         (`--nodes` × 8 GPUs, five replicas a node): decide, encode and fold
         until nothing is left, instructions per placement; without the
         facility and with it (50 racks, 100 PDUs, binding caps), and the
         facility's cost as their ratio (issue 14's goal: at most 1.5x)

`--root` counts another checkout the same way (a worktree of an older
commit: `git worktree add --detach ../base REV`), so that a change is
measured against its base in one command. Instructions are not time: a
dict lookup that misses the cache costs more than its count says; time is
what benchmarks/replay.py and benchmarks/placement.py measure. Needs
valgrind (Debian: `apt install valgrind`); it runs the work ~50x slower.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIXES = ("status", "realistic", "decisions")


def say(*args) -> None:
    print(*args, flush=True)


# ---------------------------------------------------------------------- what valgrind runs


def child(argv: list[str]) -> None:
    """One run under valgrind: `fold ROOT LOG decode|fold|none` or `cold ROOT NODES plain|facility go|none`."""
    what, root = argv[0], argv[1]
    sys.path.insert(0, str(Path(root) / "benchmarks"))
    sys.path.insert(0, root)
    if what == "fold":
        from llmgw.core.contract import events as ev
        from llmgw.core.folding.fold import apply
        from llmgw.core.folding.state import State
        from llmgw.replay import logfile

        records = list(logfile.parse(Path(argv[2]).read_bytes()))
        if argv[3] == "fold":
            state = State()
            for seq, subject, data in records:
                apply(state, seq, subject, data)
        elif argv[3] == "decode":
            decode = ev._decoder.decode
            for _seq, _subject, data in records:
                try:
                    decode(data)
                except Exception:
                    pass
        return
    import gc
    import random

    import placement as P  # benchmarks/placement.py of that root: its fleet, catalog and caps
    from llmgw.core.contract import events as ev
    from llmgw.core.rules.decide import decide
    from llmgw.core.folding.fold import apply, copy_state

    nodes, located, go = int(argv[2]), argv[3] == "facility", argv[4] == "go"
    base = P.Log()
    for e in P.fleet(nodes, located):
        base.publish(e)
    if located:
        budgets = {f"pdu/pdu-{p:03d}": P.PDU_CAP_W for p in range(P.PDUS)}
        budgets.update({f"rack/r{r:02d}": P.RACK_CAP_W for r in range(P.RACKS)})
        base.publish(ev.FacilityApplied(at=P.T0 + 30.0, budgets=budgets))
    for spec in P.catalog(5 * nodes, random.Random(P.SEED)):
        base.publish(ev.ModelApplied(at=P.T0 + 60.0, model=spec))
    state = copy_state(base.state)
    # The indexes the control plane keeps once caught up, where that root has
    # them (in core/folding/ since the core's subpackages, in core/ before).
    for keep in ("nodeindex", "replicaindex"):
        for where in ("llmgw.core.folding", "llmgw.core"):
            try:
                __import__(f"{where}.{keep}", fromlist=["track"]).track(state)
                break
            except (ImportError, AttributeError):
                pass
    gc.collect()
    gc.freeze()
    seq, at = len(base.records), P.T0 + 3600.0
    while go:
        at += 1.0
        actions = decide(state, at)  # the pass budget in force (core/contract/limits.py, before it MAX_PASS_BYTES)
        if not actions:
            break
        e = ev.Decided(at=at, basis=state.seq, actions=actions, leader="bench")
        seq += 1
        apply(state, seq, ev.subject_for(e), ev.encode(e))
        gc.freeze()  # as the control plane's step does (control/heap.py)
    if go:
        print(f"placed {len(state.replicas)}")


def instructions(args: list[str]) -> tuple[int, str]:
    """Instructions valgrind counted for one child run, and what it printed."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    r = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    m = re.search(r"I\s+refs:\s+([\d,]+)", r.stderr)
    if r.returncode != 0 or m is None:
        raise SystemExit(f"valgrind run {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return int(m.group(1).replace(",", "")), r.stdout


# ---------------------------------------------------------------------- the figures


def log_of(root: Path, mix: str, events: int) -> Path:
    """The recorded log of a mix, generated (and cached) by this checkout's fleetgen if missing."""
    sys.path.insert(0, str(HERE))
    import fleetgen  # (its name for the log, GEN_VERSION included: a name spelt here went stale at version 3)

    path = fleetgen.cache_path(events, mix=mix)
    if not path.exists():
        cmd = [sys.executable, str(HERE / "fleetgen.py"), "--events", str(events)]
        subprocess.run(cmd + ([] if mix == "status" else ["--mix", mix]), check=True, stdout=subprocess.DEVNULL)
    return path


def fold_figures(roots: list[Path], events: int) -> None:
    say(f"\nfold: instructions per event, {events:,} events of each recorded log")
    for mix in MIXES:
        log = log_of(roots[0], mix, events)
        for root in roots:
            setup, _ = instructions(["fold", str(root), str(log), "none"])
            decode = (instructions(["fold", str(root), str(log), "decode"])[0] - setup) / events
            fold = (instructions(["fold", str(root), str(log), "fold"])[0] - setup) / events
            say(f"    {mix:10s} {str(root):28s} fold {fold:9,.0f}   yardstick, decode alone {decode:7,.0f}   "
                f"fold / decode {fold / decode:5.2f}")


def cold_figures(roots: list[Path], nodes: int) -> None:
    say(f"\ncold start: instructions per placement, {nodes:,} nodes x 8 GPUs, {5 * nodes:,} replicas")
    for root in roots:
        per = {}
        for kind in ("plain", "facility"):
            setup, _ = instructions(["cold", str(root), str(nodes), kind, "none"])
            total, out = instructions(["cold", str(root), str(nodes), kind, "go"])
            placed = int(out.split()[-1])
            per[kind] = (total - setup) / placed
        say(f"    {str(root):28s} without the facility {per['plain']:9,.0f}   with {per['facility']:9,.0f}   "
            f"facility cost {per['facility'] / per['plain']:.2f}x (issue 14's goal <= 1.5x, in time)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--what", default="fold,cold", help="comma-separated: fold (per event), cold (per placement)")
    p.add_argument("--nodes", type=int, default=2000, help="nodes of the cold start (default 2,000)")
    p.add_argument("--events", type=int, default=100_000, help="events of each recorded log (default 100,000)")
    p.add_argument("--root", action="append", default=[], help="another checkout to count the same way (repeatable)")
    a = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt install valgrind)")
    roots = [HERE.parent] + [Path(r).resolve() for r in a.root]
    what = set(a.what.split(","))
    if "fold" in what:
        fold_figures(roots, a.events)
    if "cold" in what:
        cold_figures(roots, a.nodes)


if __name__ == "__main__":
    main()
