"""How fast the log folds: from a file, from JetStream, and at a restart.

    python benchmarks/replay.py [--events N] [--auth] [--mixes status,realistic,decisions] [--fold-only]

(default 1,000,000 events per log)

With --auth the server runs as `llmgw up` runs it (bus/auth.py: JWT auth,
every reader a user of its role): the log is read as the projector, the
restart is the control plane's credential.

(a) the pure fold (`llmgw.core.folding.fold.apply`) of a recorded log read from a file
    in the format of `llmgw.replay.logfile`; reading+parsing and folding are
    timed apart, and beside it, in the same run, msgspec decoding the same
    events alone (the yardstick: the machine's speed drifts). For each mix
    of `--mixes` (fleetgen.py's status-heavy log, fleetmix.py's realistic
    day and decision-heavy one). Goals (issue 18): >= 300,000 events/s on
    the status-heavy and the realistic mix, >= 150,000 on decision-heavy.
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
import os
import signal
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
import msgspec  # noqa: E402
from llmgw.control.snapshots import Snapshot, SnapshotStore  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.core.folding.fold import apply, encode_state  # noqa: E402
from llmgw.core.folding.state import State  # noqa: E402
from llmgw.replay import logfile  # noqa: E402

GOAL_FOLD = 300_000
GOAL_FOLD_DECISIONS = 150_000
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


def fold_records(records: list, cut: int, snapshot_path: Path | None) -> tuple[float, State]:
    """Fold every record into a fresh state; the seconds it took, snapshot aside."""
    state = State()
    t0 = now()
    for seq, subject, data in records[:cut]:
        apply(state, seq, subject, data)
    t1 = now()
    if snapshot_path is not None:  # the snapshot for (c), taken outside the timing
        # The log's id is known once the stream exists; (c) stamps it then.
        SnapshotStore(snapshot_path).save(state, log_id="not yet loaded")
    t2 = now()
    for seq, subject, data in records[cut:]:
        apply(state, seq, subject, data)
    return (t1 - t0) + (now() - t2), state


def bench_file(path: Path, snapshot_path: Path, repeat: int, results: dict) -> tuple[list, State]:
    say(f"\n(a) pure fold of {path.name}")
    t0 = now()
    with open(path, "rb") as f:
        blob = f.read()
    t1 = now()
    records = list(logfile.parse(blob))
    t2 = now()
    del blob
    n = len(records)
    read_s, parse_s = t1 - t0, t2 - t1
    say(f"    read {read_s:.2f} s, parse {parse_s:.2f} s ({rate(n, read_s + parse_s)} records/s)")
    cut = max(n - SNAPSHOT_BEHIND, 1)
    runs = []
    for i in range(repeat):
        fold_s, state = fold_records(records, cut, snapshot_path if i == 0 else None)
        runs.append(fold_s)
        say(f"    fold {fold_s:.2f} s: {rate(n, fold_s)} events/s; with read+parse {rate(n, read_s + parse_s + fold_s)}/s")
    fold_s = min(runs)
    # The machine's speed drifts between runs: a yardstick measured beside the
    # fold (decoding the same events, nothing else) lets runs be compared.
    decode = ev._decoder.decode
    decode_runs = []
    for _ in range(repeat):
        t = now()
        for _seq, _subject, data in records:
            try:
                decode(data)
            except Exception:
                pass
        decode_runs.append(now() - t)
    decode_s = min(decode_runs)
    say(f"    yardstick: msgspec decode alone {rate(n, decode_s)} events/s; the fold takes {fold_s / decode_s:.1f}x as long")
    results["a_decode"] = n / decode_s
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


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user+system) of this process, or of another one (Linux /proc)."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


async def timed_read(url: str, name: str, read, server_pid: int) -> tuple[float, str, object]:
    """Run one read on a connection of its own, as a restarted process would have."""
    bus = await NatsBus.connect(url, name=name, creds=CREDS.get("reader"))
    try:
        c0, s0 = cpu_seconds(), cpu_seconds(server_pid)
        seconds, out = await read(bus)
        cpu = f"CPU: this process {cpu_seconds() - c0:.1f} s, nats-server {cpu_seconds(server_pid) - s0:.1f} s"
        return seconds, cpu, out
    finally:
        await bus.close()


async def bench_jetstream(url: str, server_pid: int, records: list, expect: State, repeat: int, results: dict) -> None:
    n = len(records)
    say(f"\n(b) replay from JetStream ({url})")
    bus = await NatsBus.connect(url, name="bench-load", creds=CREDS.get("loader"))
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

    bare, fold, same = [], [], True

    async def read_bare(bus):
        return await bare_consumer(bus, n), None

    for i in range(repeat):
        # The bare read first: it also warms the server's caches for the fold.
        seconds, cpu, _ = await timed_read(url, "bench-bare", read_bare, server_pid)
        bare.append(seconds)
        say(f"    bare ordered consumer (count only): {seconds:.2f} s, {rate(n, seconds)} msgs/s ({cpu})")
        seconds, cpu, state = await timed_read(url, "bench-follow", lambda bus: follow_fold(bus, n), server_pid)
        fold.append(seconds)
        same = same and digest(state) == digest(expect)
        say(f"    NatsBus.follow + fold.apply: {seconds:.2f} s, {rate(n, seconds)} events/s ({cpu}); "
            f"state {'identical to' if same else 'DIFFERS from'} the fold of the file")
    bare_s, fold_s = min(bare), min(fold)
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
        stamp = await NatsBus.connect(url, name="bench-stamp", creds=CREDS.get("reader"))
        saved = msgspec.msgpack.decode(snapshot.read_bytes(), type=Snapshot)
        store.write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(saved, log_id=await stamp.log_id())))
        await stamp.close()
    t0 = now()
    bus = await NatsBus.connect(url, name="bench-control", creds=CREDS.get("control"))
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
    bus = await NatsBus.connect(url, name="bench-ctl", creds=CREDS.get("ctl"))
    try:
        event = ev.ModelApplied(at=time.time(), model=fleetgen.final_model(name))
        return await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=f"bench-{name}")
    finally:
        await bus.close()


async def bench_restart(url: str, snapshot: Path, tmp: Path, results: dict) -> None:
    say("\n(c) control plane restart to its first decision")
    r = await restart(url, snapshot, tmp / "snap-c1.msgpack")
    say(f"    with a snapshot at seq {r['restored']}: connected {r['connect']:.3f} s, caught up at seq "
        f"{r['seq']} ({r['seq'] - r['restored']} events folded) {r['ready']:.3f} s, first pass done {r['first']:.3f} s "
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


CREDS: dict[str, str] = {}  # role -> .creds, with --auth


async def bench_nats(records: list, state: State, snapshot: Path, tmp: Path, repeat: int, results: dict, auth: bool = False) -> None:
    keys = None
    if auth:
        import authbench

        keys = authbench.keystore(tmp / "creds")
        CREDS.update(loader=authbench.loader_creds(keys), reader=str(keys.ensure("projector")),
                     control=str(keys.ensure("control")), ctl=str(keys.ensure("operator")))  # fmt: skip
    server = NatsServer(tmp / "nats", port=free_port(), auth=keys)
    server.start()
    try:
        await bench_jetstream(server.url, server.proc.pid, records, state, repeat, results)
        await bench_restart(server.url, snapshot, tmp, results)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events in the recorded log (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=3,
                   help="fold and read (a) and (b) this many times and keep the best (default 3: the cores are noisy)")
    p.add_argument("--auth", action="store_true", help="the server with auth on, each reader a user of its role (as llmgw up)")
    p.add_argument("--mixes", default=",".join(fleetgen.MIXES),
                   help="the logs (a) folds, comma-separated, of status, realistic, decisions (default all three; "
                        "(b) and (c) read the status one)")
    p.add_argument("--fold-only", action="store_true", help="(a) only: no nats-server, no JetStream replay or restart")
    a = p.parse_args(argv)
    n = a.events
    # A plain kill runs the finally blocks too, so the nats-server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = now()

    mixes = [m for m in a.mixes.split(",") if m]
    for m in mixes:
        if m not in fleetgen.MIXES:
            p.error(f"--mixes: no mix {m!r} (there are {', '.join(fleetgen.MIXES)})")
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
        records, state = bench_file(path, snapshot, a.repeat, results)
        results["a_same"] = digest(state) == info["state_sha256"]
        if not results["a_same"]:
            say("    WARNING: the fold of the file differs from the generator's own state: the fold has changed "
                "since the log was recorded (or the file is damaged); delete benchmarks/.cache/ to record it anew")
        for mix in mixes:
            if mix == "status":
                results["mix_status"] = (results["a_fold"], results["a_decode"], results["a_same"], info)
                continue
            mpath, minfo, _ = fleetgen.cached(n, mix=mix)
            say(f"\n    the {mix} mix: {mpath.name}, simulated {minfo['simulated_hours']} h: "
                + ", ".join(f"{k} {v:,} ({v / minfo['events']:.1%})" for k, v in minfo["kinds"].items()))
            sub: dict = {}
            _, mstate = bench_file(mpath, tmp / f"snapshot-{mix}.msgpack", a.repeat, sub)
            results[f"mix_{mix}"] = (sub["a_fold"], sub["a_decode"], digest(mstate) == minfo["state_sha256"], minfo)
        if not a.fold_only:
            asyncio.run(bench_nats(records, state, snapshot, tmp, a.repeat, results, auth=a.auth))

    total = now() - t_start
    r = results
    w = 46
    best = f", best of {a.repeat} for (a) and (b)" if a.repeat > 1 else ""
    say(f"\n== figures: {n:,} events{best} ==")
    say(f"{'(a) pure fold from file:':{w}} {r['a_fold']:>10,.0f} events/s (goal >= {GOAL_FOLD:,})  "
        f"{verdict(r['a_fold'] >= GOAL_FOLD)}")
    say(f"{'(a) yardstick, msgspec decode alone:':{w}} {r['a_decode']:>10,.0f} events/s (fold / decode = "
        f"{r['a_fold'] / r['a_decode']:.2f})")
    say(f"{'(a) read+parse+fold from file:':{w}} {r['a_total']:>10,.0f} events/s (read+parse alone "
        f"{r['a_parse']:,.0f}/s)")
    for mix in mixes:
        fold, decode, _same, minfo = r[f"mix_{mix}"]
        goal = GOAL_FOLD_DECISIONS if mix == "decisions" else GOAL_FOLD
        decided = minfo["kinds"].get("control.decided", 0) / minfo["events"]
        say(f"{f'(a) fold, {mix} mix:':{w}} {fold:>10,.0f} events/s (goal >= {goal:,})  {verdict(fold >= goal)}  "
            f"[decode alone {decode:,.0f}/s, fold / decode = {fold / decode:.2f}; {decided:.1%} decisions]")
    if a.fold_only:
        checks = [(f"fold of the {m} log = generator's state", r[f"mix_{m}"][2]) for m in mixes]
        say("checks: " + ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in checks))
        return
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
