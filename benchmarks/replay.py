"""How fast the log folds: from a file, from JetStream, and at a restart.

    python benchmarks/replay.py [--events N]      (default 1,000,000)

(a) the pure fold (`llmgw.core.fold.apply`) of a recorded log read from a file
    in the format of `llmgw.replay.logfile`; reading+parsing and folding are
    timed apart. Goal: >= 300,000 events/s.
(b) a full replay from JetStream: a real nats-server (`NatsServer`, a free
    port, a temp dir), the streams from `NatsBus.ensure_streams()`, the log
    published to it (`publish_async`, one Nats-Msg-Id each; loading is
    printed, not the figure), then `NatsBus.follow(1, ...)` folding every
    message until the state's seq is the last. For comparison, a bare nats-py
    ordered push consumer reading the same stream and only counting.
    Goal: >= 120,000 events/s.
(c) a control plane restart over that server: from connecting and creating
    the `ControlPlane` until its first pass (`step`) has run and published its
    decision, with a snapshot ~1000 events before the end of the log, and
    without one. Goal: <= 1 s with the snapshot, whatever the log's length.

The log is a simulated fleet recorded through the real core (see
`fleetgen.py`), cached under benchmarks/.cache/ by N and generator version.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import fleetgen  # noqa: E402
from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: E402

from llmgw.bus import STREAM  # noqa: E402
from llmgw.bus.nats import NatsBus  # noqa: E402
from llmgw.bus.server import NatsServer, free_port  # noqa: E402
from llmgw.control.plane import ControlPlane  # noqa: E402
from llmgw.control.snapshots import SnapshotStore  # noqa: E402
from llmgw.core import events as ev  # noqa: E402
from llmgw.core.fold import apply, encode_state  # noqa: E402
from llmgw.core.state import State  # noqa: E402
from llmgw.replay import logfile  # noqa: E402

GOAL_FOLD = 300_000
GOAL_REPLAY = 120_000
GOAL_RESTART = 1.0
SNAPSHOT_BEHIND = 1000
LOAD_BATCH = 5000

now = time.perf_counter


def say(*args) -> None:
    print(*args, flush=True)


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "inf"


def digest(state: State) -> str:
    return hashlib.sha256(encode_state(state)).hexdigest()


# ---------------------------------------------------------------------- (a)


def bench_file(path: Path, snapshot_path: Path, results: dict) -> tuple[list, State]:
    say(f"\n(a) pure fold of {path.name}")
    t0 = now()
    with open(path, "rb") as f:
        blob = f.read()
    t1 = now()
    records = list(logfile.parse(blob))
    t2 = now()
    del blob
    n = len(records)
    cut = max(n - SNAPSHOT_BEHIND, 1)
    state = State()
    t3 = now()
    for seq, subject, data in records[:cut]:
        apply(state, seq, subject, data)
    t4 = now()
    # The snapshot for (c), taken outside the timing.
    SnapshotStore(snapshot_path).save(state)
    t5 = now()
    for seq, subject, data in records[cut:]:
        apply(state, seq, subject, data)
    t6 = now()
    read_s, parse_s, fold_s = t1 - t0, t2 - t1, (t4 - t3) + (t6 - t5)
    say(f"    read {read_s:.2f} s, parse {parse_s:.2f} s ({rate(n, parse_s)} records/s), "
        f"fold {fold_s:.2f} s ({rate(n, fold_s)} events/s), "
        f"read+parse+fold {rate(n, read_s + parse_s + fold_s)} events/s")
    say(f"    state: seq {state.seq}, {len(state.nodes)} nodes, {len(state.models)} models, "
        f"{len(state.replicas)} replicas, {state.quarantine_count} quarantined, {state.voided_count} voided; "
        f"snapshot at seq {cut} ({snapshot_path.stat().st_size / 1e6:.1f} MB)")
    results["a_fold"] = n / fold_s
    results["a_total"] = n / (read_s + parse_s + fold_s)
    results["a_parse"] = n / (read_s + parse_s)
    results["snapshot_seq"] = cut
    return records, state


# ---------------------------------------------------------------------- (b)


async def load(bus: NatsBus, records: list) -> float:
    js = bus.nc.jetstream(timeout=60.0, publish_async_max_pending=LOAD_BATCH * 2)
    t = now()
    for i in range(0, len(records), LOAD_BATCH):
        batch = records[i : i + LOAD_BATCH]
        futures = [
            await js.publish_async(subject, data, headers={"Nats-Msg-Id": f"bench-{seq}"})
            for seq, subject, data in batch
        ]
        acks = await asyncio.gather(*futures)
        first, last = acks[0], acks[-1]
        if first.seq != batch[0][0] or last.seq != batch[-1][0] or last.duplicate:
            raise RuntimeError(f"stream sequences {first.seq}..{last.seq} do not match the log's "
                               f"{batch[0][0]}..{batch[-1][0]}: was the stream empty?")
    return now() - t


async def bare_consumer(bus: NatsBus, n: int) -> float:
    count = 0
    done = asyncio.Event()

    async def cb(msg) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    t = now()
    sub = await bus.js.subscribe(
        "llmgw.>", stream=STREAM, ordered_consumer=True, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        cb=cb, pending_msgs_limit=-1,
    )
    try:
        await asyncio.wait_for(done.wait(), timeout=max(120.0, n / 5000))
        return now() - t
    finally:
        await sub.unsubscribe()


async def follow_fold(bus: NatsBus, last: int) -> tuple[float, State]:
    state = State()
    done = asyncio.Event()

    def on_message(seq: int, subject: str, data: bytes) -> None:
        apply(state, seq, subject, data)
        if state.seq >= last:
            done.set()

    t = now()
    follower = await bus.follow(1, on_message)
    try:
        await asyncio.wait_for(done.wait(), timeout=max(120.0, last / 5000))
        return now() - t, state
    finally:
        await follower.stop()


async def bench_jetstream(url: str, records: list, expect: State, results: dict) -> None:
    n = len(records)
    say(f"\n(b) replay from JetStream ({url})")
    bus = await NatsBus.connect(url, name="bench-load")
    try:
        await bus.ensure_streams()
        load_s = await load(bus, records)
        last = await bus.last_seq()
        say(f"    loaded {n:,} messages in {load_s:.1f} s ({rate(n, load_s)} msgs/s, publish_async, "
            f"batches of {LOAD_BATCH}); stream last seq {last}")
        if last != n:
            raise RuntimeError(f"the stream ends at {last}, the log at {n}")
    finally:
        await bus.close()

    # Each read on a connection of its own, as a restarted process would have.
    bus = await NatsBus.connect(url, name="bench-bare")
    try:
        bare_s = await bare_consumer(bus, n)
    finally:
        await bus.close()
    say(f"    bare ordered consumer (count only): {bare_s:.2f} s, {rate(n, bare_s)} msgs/s")

    bus = await NatsBus.connect(url, name="bench-follow")
    try:
        fold_s, state = await follow_fold(bus, n)
    finally:
        await bus.close()
    same = digest(state) == digest(expect)
    say(f"    NatsBus.follow + fold.apply: {fold_s:.2f} s, {rate(n, fold_s)} events/s; "
        f"state {'identical to' if same else 'DIFFERS from'} the fold of the file")
    results["b_load"] = load_s
    results["b_fold"] = n / fold_s
    results["b_bare"] = n / bare_s
    results["b_same"] = same


# ---------------------------------------------------------------------- (c)


class TimedPlane(ControlPlane):
    """A control plane that notes when it is ready and when its first pass ends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_step = asyncio.Event()
        self.ready_at = 0.0
        self.step_at = 0.0
        self.restored_seq = 0
        self.ready_seq = 0
        self.decided_first = False

    async def step(self) -> None:
        passes = self.passes
        if not self.ready_at:
            self.ready_at = now()
            self.ready_seq = self.state.seq
            self.restored_seq = self._snapshot_seq  # set by run() when it restored one
        await super().step()
        if not self.first_step.is_set():
            self.step_at = now()
            self.decided_first = self.passes > passes
            self.first_step.set()


async def restart(url: str, snapshot: Path | None, store: Path) -> dict:
    """Connect, build a control plane and run it until its first pass is done."""
    if snapshot is not None:
        shutil.copyfile(snapshot, store)
    t0 = now()
    bus = await NatsBus.connect(url, name="bench-control")
    t_conn = now()
    # No agents beat here: a long grace keeps the plane from declaring the fleet lost.
    plane = TimedPlane(bus, snapshots=SnapshotStore(store), node_grace=1e9)
    stop = asyncio.Event()
    task = asyncio.create_task(plane.run(stop))
    try:
        await asyncio.wait_for(plane.first_step.wait(), timeout=600.0)
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30.0)
        finally:
            await bus.close()
    return {
        "connect": t_conn - t0,
        "ready": plane.ready_at - t0,
        "first": plane.step_at - t0,
        "restored": plane.restored_seq,
        "seq": plane.ready_seq,
        "decided": plane.decided_first,
    }


async def publish_model(url: str, name: str) -> int:
    """Something new for the next restart to decide on."""
    bus = await NatsBus.connect(url, name="bench-ctl")
    try:
        event = ev.ModelApplied(at=time.time(), model=fleetgen.final_model(name))
        return await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"bench-{name}")
    finally:
        await bus.close()


async def bench_restart(url: str, snapshot: Path, tmp: Path, results: dict) -> None:
    say("\n(c) control plane restart to its first decision")
    r = await restart(url, snapshot, tmp / "snap-c1.msgpack")
    say(f"    with a snapshot at seq {r['restored']}: connected {r['connect']:.3f} s, caught up at seq "
        f"{r['seq']} {r['ready']:.3f} s, first pass done {r['first']:.3f} s "
        f"({'it decided' if r['decided'] else 'NOTHING decided'})")
    results["c_snap"] = r["first"]
    results["c_snap_ok"] = r["decided"] and r["restored"] > 0
    # The first restart decided on the log's last model: give the next one something too.
    await publish_model(url, "bench-final-1")
    r = await restart(url, None, tmp / "snap-c2.msgpack")
    say(f"    without a snapshot: connected {r['connect']:.3f} s, caught up at seq {r['seq']} {r['ready']:.3f} s, "
        f"first pass done {r['first']:.3f} s ({'it decided' if r['decided'] else 'NOTHING decided'})")
    results["c_nosnap"] = r["first"]
    results["c_nosnap_ok"] = r["decided"] and r["restored"] == 0


# ---------------------------------------------------------------------- main


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


async def bench_nats(records: list, state: State, snapshot: Path, tmp: Path, results: dict) -> None:
    server = NatsServer(tmp / "nats", port=free_port())
    server.start()
    try:
        await bench_jetstream(server.url, records, state, results)
        await bench_restart(server.url, snapshot, tmp, results)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events in the recorded log (default 1,000,000)")
    a = p.parse_args(argv)
    n = a.events
    t_start = now()

    say(f"recorded log: {n:,} events")
    path, info, generated = fleetgen.cached(n)
    say(f"    {path} ({path.stat().st_size / 1e6:.0f} MB), "
        + (f"generated now in {info['generate_s']:.1f} s" if generated
           else f"from the cache (generated in {info['generate_s']:.1f} s when made)"))
    say(f"    simulated {info['simulated_hours']} h of {info['nodes']} nodes, {info['models']} models: "
        + ", ".join(f"{k} {v:,}" for k, v in info["kinds"].items()))
    say(f"    {info['decide_passes']:,} decide passes ({info['decide_s']:.1f} s), {info['quarantined']} quarantined, "
        f"{info['voided']} voided; at the end {info['replicas']} replicas, "
        f"{info['gpus_used']}/{info['gpus']} GPUs in use, {info['nodes_lost']} nodes lost")

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as d:
        tmp = Path(d)
        snapshot = tmp / "snapshot.msgpack"
        records, state = bench_file(path, snapshot, results)
        results["a_same"] = digest(state) == info["state_sha256"]
        if not results["a_same"]:
            say("    WARNING: the fold of the file differs from the generator's own state")
        asyncio.run(bench_nats(records, state, snapshot, tmp, results))

    total = now() - t_start
    r = results
    w = 46
    say(f"\n== figures: {n:,} events ==")
    say(f"{'(a) pure fold from file:':{w}} {r['a_fold']:>10,.0f} events/s (goal >= {GOAL_FOLD:,})  "
        f"{verdict(r['a_fold'] >= GOAL_FOLD)}")
    say(f"{'(a) read+parse+fold from file:':{w}} {r['a_total']:>10,.0f} events/s (read+parse alone "
        f"{r['a_parse']:,.0f}/s)")
    say(f"{'(b) JetStream replay, NatsBus.follow + fold:':{w}} {r['b_fold']:>10,.0f} events/s "
        f"(goal >= {GOAL_REPLAY:,})  {verdict(r['b_fold'] >= GOAL_REPLAY)}")
    say(f"{'(b) bare ordered consumer, count only:':{w}} {r['b_bare']:>10,.0f} msgs/s "
        f"(follow+fold / bare = {r['b_fold'] / r['b_bare']:.2f})")
    say(f"{'(b) loading the stream (not a figure):':{w}} {r['b_load']:>10.1f} s")
    say(f"{'(c) restart to first decision, snapshot:':{w}} {r['c_snap']:>10.3f} s (goal <= {GOAL_RESTART:g} s, "
        f"snapshot {n - r['snapshot_seq']} events behind)  {verdict(r['c_snap'] <= GOAL_RESTART and r['c_snap_ok'])}")
    say(f"{'(c) restart to first decision, no snapshot:':{w}} {r['c_nosnap']:>10.3f} s")
    checks = [("fold of the file = generator's state", r["a_same"]), ("JetStream fold = file fold", r["b_same"]),
              ("restart with snapshot restored it and decided", r["c_snap_ok"]),
              ("restart without snapshot decided", r["c_nosnap_ok"])]
    say("checks: " + ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in checks))
    say(f"total run time: {total:.1f} s")


if __name__ == "__main__":
    main()
