"""A fleet over real NATS: thousands of simulated nodes against `llmgw up`.

    python benchmarks/fleet.py [--nodes 2000] [--gpus 8] [--applies 10] [--failures 20] [--losses 5]
                               [--heartbeat 1.0] [--window 20] [--skip restart]

Real processes only: `llmgw up --no-agent --no-demo --no-gateway` (embedded
nats-server with auth, the control plane, the projector; free ports, its own
state dir) and one `llmgw agent --simulate --fleet N --no-serve` process
(every node on one connection, a fleet credential). This process watches the
log with the tools' credential, folds it, and injects what happens through
the simulated nodes' hooks (`llmgw.sim.<node>.fail`, `.silence`).

Figures (each printed with what it is):
  registration  the fleet's N registrations and a base catalog (about one
                4-GPU replica per node) placed and ready: seconds
  apply         a new model (8 one-GPU replicas) published -> the first pass
                placing it, as the log shows both: p50, p99 (ms)
  failure       a ready shard failed -> the pass placing its replacement
  node loss     a node falls silent -> node.lost (the grace, NODE_GRACE_S,
                by design), and node.lost -> the pass replacing its replicas
  traffic       per node in a quiet window: heartbeats/s and the bytes/s the
                fleet process wrote and read (/proc/PID/io, its only socket is
                NATS with --no-serve), log events/s and bytes/s
  log size      bytes in the log per event kind, and each incident's cost
                (an apply, a failure, a node loss), whence a simulated day
  restart       `llmgw up` stopped (Ctrl-C: NATS too) and started again on the
                same store: seconds until every node has registered again,
                until the last decision (steady), and what was placed after
                the restart (nothing: every replica adopted), GPUs held twice

The 2-core machine is shared and slow: sizes are flags, the issue's as defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llmgw.agent.fleet import ask  # noqa: E402
from llmgw.bus import HEARTBEAT_BUCKET, keystore  # noqa: E402
from llmgw.bus.nats import NatsBus  # noqa: E402
from llmgw.bus.server import free_port  # noqa: E402
from llmgw.control.config import NODE_GRACE_S  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.core.folding.fold import apply  # noqa: E402
from llmgw.core.folding.state import LIVE_SHARD_STATES, State  # noqa: E402

PY = sys.executable
DAY_S = 86_400
DECIDED = ev.subject_for(ev.Decided(at=0.0, basis=0, actions=[], leader=""))  # the subject of a pass


def say(text: str) -> None:
    print(text, flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:.0f} ms, p99 {pct(values, 0.99) * 1000:.0f} ms (n={len(values)})"


class Up:
    """`llmgw up --no-agent --no-demo --no-gateway` in a folder of its own."""

    def __init__(self, root: Path) -> None:
        self.root, self.state = root, root / "state"
        self.nats_port, self.metrics_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"nats://127.0.0.1:{self.nats_port}"

    def start(self) -> float:
        log = open(self.root / "up.log", "ab")
        self.proc = subprocess.Popen(
            [PY, "-m", "llmgw", "up", "--no-agent", "--no-demo", "--no-gateway", "--no-console", "--nats-port", str(self.nats_port),
             "--metrics-port", str(self.metrics_port), "--state-dir", str(self.state)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True,
        )  # fmt: skip
        began = time.monotonic()
        while "Ctrl-C stops everything" not in (self.root / "up.log").read_text().split("llmgw up: stopping")[-1]:
            if self.proc.poll() is not None or time.monotonic() - began > 120:
                raise RuntimeError("llmgw up did not come up:\n" + (self.root / "up.log").read_text()[-3000:])
            time.sleep(0.1)
        return began

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    @property
    def tools(self) -> str:
        return str(self.state / "creds" / "operator.creds")


class Watch:
    """The log, followed and folded here, each message with when it arrived."""

    def __init__(self) -> None:
        self.state = State()
        self.arrived: list[tuple[float, int, str, int]] = []  # (monotonic, seq, subject, bytes)
        self.waiters: list = []
        self.changed = asyncio.Event()
        self.bytes_by_kind: Counter = Counter()
        self.count_by_kind: Counter = Counter()
        self.decided: list[tuple[float, int, ev.Decided]] = []  # (arrived, seq, the pass)

    async def start(self, url: str, creds: str, from_seq: int = 1) -> "Watch":
        self.bus = await NatsBus.connect(url, name="bench-fleet", creds=creds, forever=True)
        await self.bus.wait_for_streams(60)
        self.follower = await self.bus.follow(from_seq, self.on_message)
        return self

    def on_message(self, seq: int, subject: str, data: bytes) -> None:
        if seq <= self.state.seq:
            return
        now = time.monotonic()
        apply(self.state, seq, subject, data)
        self.arrived.append((now, seq, subject, len(data)))
        kind = subject.split(".")[-2] + "." + subject.split(".")[-1] if subject.count(".") >= 3 else subject
        self.bytes_by_kind[kind] += len(data) + len(subject)
        self.count_by_kind[kind] += 1
        if subject == DECIDED:
            self.decided.append((now, seq, ev.decode(data)))
        if subject.startswith("llmgw.control.") or subject.endswith((".shard.status", ".node.registered")):
            for w in list(self.waiters):
                w(now, seq, subject, data)
        self.changed.set()

    async def until(self, what: str, check, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g}s")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        return time.monotonic()

    def decided_after(self, seq: int, match) -> float | None:
        """When the first pass after `seq` that `match` accepts arrived (None: none yet)."""
        return next((t for t, s, e in self.decided if s > seq and match(e)), None)

    def first_after(self, seq: int, match) -> asyncio.Future:
        """A future of the arrival time of the first control message after `seq` that `match(event)` accepts."""
        fut = asyncio.get_running_loop().create_future()

        def w(now, s, subject, data):
            if s > seq and not fut.done() and subject.startswith("llmgw.control."):
                e = ev.decode(data)
                if match(e):
                    fut.set_result((now, s))
                    self.waiters.remove(w)

        self.waiters.append(w)
        return fut

    async def close(self) -> None:
        await self.follower.stop()
        await self.bus.close()


def model(name: str, replicas: int, gpus: int) -> ev.ModelSpec:
    return ev.ModelSpec(name=name, min_replicas=replicas, profiles=[ev.ProfileSpec(name="p", gpus=gpus, gpu_memory_gb=40)])


async def publish_apply(bus: NatsBus, spec: ev.ModelSpec) -> None:
    e = ev.ModelApplied(at=time.time(), model=spec)
    await bus.publish(ev.subject_for(e), ev.encode(e), msg_id=f"bench-{spec.name}-{time.time_ns()}")


def places(model_name: str):
    return lambda e: isinstance(e, ev.Decided) and any(isinstance(a, ev.PlaceReplica) and a.model == model_name for a in e.actions)


def ready_count(state: State) -> int:
    return sum(1 for r in state.replicas.values() if r.state == "ready")


def gpus_twice(state: State) -> int:
    held: Counter = Counter()
    for r in state.replicas.values():
        for s in r.shards:
            if s.state in LIVE_SHARD_STATES:
                for g in s.gpus:
                    held[(s.node, g)] += 1
    return sum(1 for n in held.values() if n > 1)


def socket_bytes(pid: int, port: int) -> tuple[int, int]:
    """(bytes sent, bytes received) over the TCP connections of process `pid`
    to NATS on `port`, as the kernel counts them (`ss -ti`): the fleet's only
    traffic with --no-serve."""
    out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{port} )"], capture_output=True, text=True).stdout
    sent = received = 0
    mine = False
    for line in out.splitlines():
        if not line.startswith(("\t", " ")):
            mine = f"pid={pid}," in line
            continue
        if mine:
            sent += int(re.search(r"bytes_sent:(\d+)", line).group(1)) if "bytes_sent:" in line else 0
            received += int(re.search(r"bytes_received:(\d+)", line).group(1)) if "bytes_received:" in line else 0
    return sent, received


async def hb_last(bus: NatsBus) -> int:
    return (await bus.js.stream_info(f"KV_{HEARTBEAT_BUCKET}")).state.last_seq


async def log_info(bus: NatsBus) -> tuple[int, int]:
    info = (await bus.js.stream_info("LLMGW")).state
    return info.messages, info.bytes


async def beat_capacity(url: str, creds: str, seconds: float = 3.0, in_flight: int = 64) -> float:
    """The yardstick: heartbeats a second the bucket stores here (acked puts,
    `in_flight` at a time, as fast as it takes them), before the fleet runs.
    JetStream fsyncs every message (sync_interval: always), so this is what
    bounds nodes / heartbeat interval on this machine's disk."""
    bus = await NatsBus.connect(url, name="bench-beats", creds=creds)
    try:
        await bus.ensure_streams()
        done = 0
        end = time.monotonic() + seconds

        async def worker(k: int) -> None:
            nonlocal done
            while time.monotonic() < end:
                await bus.beat(f"yardstick-{k:03d}", b'{"at":0,"agent":"yardstick"}')
                done += 1

        for _ in range(600):  # until the control plane has made the bucket
            try:
                await bus.beat("yardstick-000", b"{}")
                break
            except Exception:
                await asyncio.sleep(0.1)
        end = time.monotonic() + seconds
        began = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(in_flight)))
        return done / (time.monotonic() - began)
    finally:
        await bus.close()


async def bench(args, root: Path) -> None:
    up = Up(root)
    up.start()
    say(f"llmgw up at {up.url} (state {up.state}); control plane metrics http://127.0.0.1:{up.metrics_port}/metrics")
    fleet_creds = str(keystore.Keystore(up.state / "creds").issue("fleet", "bench"))
    capacity = await beat_capacity(up.url, fleet_creds)
    say(
        f"yardstick: the heartbeat bucket stores {capacity:.0f} beats/s here (acked, 64 in flight): "
        f"{args.nodes} nodes at one beat every {args.heartbeat:g} s need {args.nodes / args.heartbeat:.0f}/s"
    )
    fleet_log = open(root / "fleet.log", "ab")
    fleet = subprocess.Popen(
        [PY, "-m", "llmgw", "agent", "--simulate", "--fleet", str(args.nodes), "--name", "sim-{i:05d}", "--gpus", str(args.gpus),
         "--no-serve", "--nats", up.url, "--creds", fleet_creds, "--heartbeat", str(args.heartbeat),
         "--loading-after", "0.05", "--ready-after", "0.1"],
        stdout=fleet_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root, start_new_session=True,
    )  # fmt: skip
    watch = await Watch().start(up.url, up.tools)
    results: dict[str, str] = {"yardstick": f"{capacity:.0f} heartbeats/s stored by the bucket (need {args.nodes / args.heartbeat:.0f}/s)"}
    try:
        began = time.monotonic()
        n = args.nodes
        await watch.until(f"{n} nodes registered", lambda: len(watch.state.nodes) >= n, args.timeout)
        registered = time.monotonic() - began
        say(f"registration: {n} nodes x {args.gpus} GPUs registered in {registered:.1f} s (one process, one connection)")
        # A base catalog: about one 4-GPU replica per node (half the GPUs).
        per_model = max(1, n // args.base_models)
        t0 = time.monotonic()
        for k in range(args.base_models):
            await publish_apply(watch.bus, model(f"base-{k:03d}", per_model, 4))
        want = per_model * args.base_models
        await watch.until(f"{want} base replicas ready", lambda: ready_count(watch.state) >= want, args.timeout)
        results["base"] = f"{want} replicas of 4 GPUs over {args.base_models} models: all ready {time.monotonic() - t0:.1f} s after the apply"
        say("base catalog: " + results["base"])

        # applies
        cost: dict[str, float] = {}
        m_before, b_before = await log_info(watch.bus)
        lat = []
        for k in range(args.applies):
            name = f"new-{k:03d}"
            fut = watch.first_after(watch.state.seq, places(name))
            await publish_apply(watch.bus, model(name, 8, 1))
            applied_at = await watch.until("the apply in the log", lambda: name in watch.state.models, 60)
            decided_at, _ = await asyncio.wait_for(fut, 60)
            lat.append(decided_at - applied_at)
        results["apply"] = ms(lat)
        say(f"apply -> first placing pass: {results['apply']}")
        await watch.until("new models ready", lambda: ready_count(watch.state) >= want + 8 * args.applies, args.timeout)
        m_after, b_after = await log_info(watch.bus)
        cost["apply"] = (b_after - b_before) / max(args.applies, 1)

        # failures
        m_before, b_before = await log_info(watch.bus)
        lat = []
        for k in range(args.failures):
            r = next(r for r in sorted(watch.state.replicas.values(), key=lambda r: r.id) if r.state == "ready" and r.model.startswith("base"))
            shard = r.shards[0]
            fut = watch.first_after(watch.state.seq, places(r.model))
            said = await ask(up.url, up.tools, shard.node, "fail", shard.id.encode())
            assert said == b"failed", said
            failed_at = await watch.until("the failure in the log", lambda: watch.state.replicas.get(r.id) is None or watch.state.replicas[r.id].state != "ready", 60)
            decided_at, _ = await asyncio.wait_for(fut, 60)
            lat.append(decided_at - failed_at)
        results["failure"] = ms(lat)
        say(f"shard failed -> pass placing its replacement: {results['failure']}")
        await watch.until("replacements ready", lambda: ready_count(watch.state) >= want + 8 * args.applies, args.timeout)
        m_after, b_after = await log_info(watch.bus)
        cost["failure"] = (b_after - b_before) / max(args.failures, 1)
        m_before, b_before = await log_info(watch.bus)

        # node losses: several nodes silent at once (far below the mass-silence share)
        victims = sorted({r.shards[0].node for r in watch.state.replicas.values() if r.state == "ready"})[: args.losses]
        lost_lat, replace_lat = [], []
        futs = {}
        silenced = {}
        for node in victims:
            on_node = {r.model for r in watch.state.replicas.values() if any(s.node == node for s in r.shards)}
            lost_fut = watch.first_after(watch.state.seq, lambda e, node=node: isinstance(e, ev.NodeLost) and e.node == node)
            futs[node] = (lost_fut, on_node)
            silenced[node] = time.monotonic()
            assert await ask(up.url, up.tools, node, "silence", b"on") == b"silent"
        for node, (lost_fut, on_node) in futs.items():
            lost_at, lost_seq = await asyncio.wait_for(lost_fut, NODE_GRACE_S * 6 + 60)
            lost_lat.append(lost_at - silenced[node])
            for m in on_node:
                try:
                    await watch.until(
                        f"a replacement for {m}", lambda m=m, q=lost_seq: watch.decided_after(q, places(m)) is not None, 60
                    )
                except TimeoutError:
                    continue
                replace_lat.append(watch.decided_after(lost_seq, places(m)) - lost_at)
        results["loss"] = f"silent -> node.lost {ms(lost_lat)} (grace {NODE_GRACE_S:g} s); node.lost -> replacement pass {ms(replace_lat)}"
        say(f"node loss: {results['loss']}")
        for node in victims:
            await ask(up.url, up.tools, node, "silence", b"off")
        await watch.until("steady after the losses", lambda: ready_count(watch.state) >= want + 8 * args.applies, args.timeout)
        await asyncio.sleep(3)
        m_after, b_after = await log_info(watch.bus)
        cost["loss"] = (b_after - b_before) / max(args.losses, 1)

        # traffic in a quiet window
        hb0, (m0, b0), (w0, r0), t0 = await hb_last(watch.bus), await log_info(watch.bus), socket_bytes(fleet.pid, up.nats_port), time.monotonic()
        await asyncio.sleep(args.window)
        hb1, (m1, b1), (w1, r1), t1 = await hb_last(watch.bus), await log_info(watch.bus), socket_bytes(fleet.pid, up.nats_port), time.monotonic()
        dt = t1 - t0
        results["traffic"] = (
            f"per node: {(hb1 - hb0) / dt / n:.2f} heartbeats/s, {(w1 - w0) / dt / n:.0f} B/s sent to NATS and "
            f"{(r1 - r0) / dt / n:.0f} B/s received (TCP, with --no-serve all of it NATS: heartbeats, unacked, and the ping-pong); the log grew {(m1 - m0) / dt / n:.4f} events/s and {(b1 - b0) / dt / n:.2f} B/s "
            f"(quiet window of {dt:.0f} s, heartbeat every {args.heartbeat:g} s)"
        )
        say(f"traffic: {results['traffic']}")

        # the log's size, per event kind and per incident
        msgs, size = await log_info(watch.bus)
        kinds = ", ".join(
            f"{k} {watch.count_by_kind[k]} x {watch.bytes_by_kind[k] / watch.count_by_kind[k]:.0f} B"
            for k, _ in watch.bytes_by_kind.most_common(6)
        )
        say(f"log: {msgs} events, {size / 1e6:.1f} MB stored ({size / max(msgs, 1):.0f} B/event with the store's overhead); by kind: {kinds}")
        results["log"] = f"{msgs} events, {size / 1e6:.1f} MB"
        results["day"] = day(args, cost, (b1 - b0) / dt)
        say(f"a simulated day: {results['day']}")

        if "restart" not in args.skip:
            await restart(args, up, watch, results)
    finally:
        try:
            await watch.close()
        except Exception:
            pass
        if fleet.poll() is None:
            fleet.send_signal(signal.SIGTERM)
            try:
                fleet.wait(60)
            except subprocess.TimeoutExpired:
                fleet.kill()
        up.stop()
    say("\nsummary (benchmarks/fleet.py " + " ".join(sys.argv[1:]) + f", {args.nodes} nodes x {args.gpus} GPUs):")
    for k, v in results.items():
        say(f"  {k:<9} {v}")


def day(args, cost: dict[str, float], idle_bytes_s: float) -> str:
    """The log's growth in a simulated day: the incidents measured here, at the
    day's rates (flags), plus the gateways' load reports (not simulated here:
    their size, encoded, at the assumed rate), plus the quiet rate measured."""
    scale = args.nodes / 2000
    load = ev.ModelLoad(at=1.7e9, gateway="gw-host-8080", model="base-000", in_flight=3, queued=0, last_used=1.7e9)
    load_bytes = len(ev.encode(load)) + len(ev.subject_for(load)) + 60  # + the store's per-message overhead, about
    models = args.base_models + args.applies
    reports = models * args.gateways * args.load_changes_per_day
    parts = {
        "applies": args.day_applies * cost.get("apply", 0),
        "failures": args.day_failures * scale * cost.get("failure", 0),
        "losses": args.day_losses * scale * cost.get("loss", 0),
        "load reports": reports * load_bytes,
        "quiet": idle_bytes_s * DAY_S,
    }
    total = sum(parts.values())
    said = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in parts.items())
    return (
        f"{total / 1e6:.1f} MB/day ({said}; per incident: apply of 8 replicas {cost.get('apply', 0) / 1e3:.1f} kB, "
        f"failure {cost.get('failure', 0) / 1e3:.1f} kB, node loss and return {cost.get('loss', 0) / 1e3:.1f} kB; rates a day: "
        f"{args.day_applies} applies, {args.day_failures * scale:g} failures, {args.day_losses * scale:g} node losses, {reports} load "
        f"reports = {models} models x {args.gateways} gateways x {args.load_changes_per_day} changes)"
    )


async def restart(args, up: Up, watch: Watch, results: dict) -> None:
    """Ctrl-C the whole `llmgw up` (NATS included), start it again on the same store."""
    before = {r.id: (r.model, tuple((s.node, tuple(s.gpus)) for s in r.shards)) for r in watch.state.replicas.values() if r.state == "ready"}
    last_seq = watch.state.seq
    up.stop()
    began = up.start()
    # The same watcher: its connection reconnects by itself, and it follows on
    # from the last sequence it folded (the log is the same store).
    w = watch
    n = args.nodes
    registered_after: set[str] = set()
    placed_after: list[str] = []
    stopped_after: list[str] = []
    elected: list[float] = []

    def on(now, seq, subject, data):
        if seq <= last_seq:
            return
        if subject.endswith(".node.registered"):
            registered_after.add(subject.split(".")[2])
        elif subject == DECIDED:
            for a in ev.decode(data).actions:
                if isinstance(a, ev.PlaceReplica):
                    placed_after.append(a.replica)
                elif isinstance(a, ev.StopReplica):
                    stopped_after.append(a.replica)
        elif isinstance(ev.decode(data), ev.LeaderElected):
            elected.append(now)

    w.waiters.append(on)
    try:
        all_at = await w.until(f"{n} nodes registered again", lambda: len(registered_after) >= n, args.timeout)
        led_at = await w.until("a leader elected again", lambda: bool(elected), args.timeout)
        # Steady: the leader has said nothing for a while (every node adopted, nothing to decide).
        quiet = 5.0
        while True:
            last_control = max(t for t, sq, subj, _b in w.arrived if subj.startswith("llmgw.control.") and sq > last_seq)
            if time.monotonic() - last_control >= quiet and ready_count(w.state) >= len(before):
                break
            if time.monotonic() - began > args.timeout:
                raise TimeoutError("no steady state after the restart")
            await asyncio.sleep(0.5)
        after = {r.id: (r.model, tuple((s.node, tuple(s.gpus)) for s in r.shards)) for r in w.state.replicas.values() if r.state == "ready"}
        moved = sum(1 for rid, where in before.items() if after.get(rid) != where)
        results["restart"] = (
            f"up started again: all {n} nodes registered again after {all_at - began:.1f} s, a leader after {led_at - began:.1f} s, "
            f"the last decision after {last_control - began:.1f} s (steady: {quiet:g} s quiet); decided after the restart: "
            f"{len(placed_after)} placements, {len(stopped_after)} stops; replicas ready before/after {len(before)}/{len(after)}, "
            f"moved or lost {moved}; GPUs held twice: {gpus_twice(w.state)}"
        )
        say(f"restart: {results['restart']}")
    finally:
        w.waiters.clear()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2000, help="simulated nodes (default 2,000, the issue's)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--base-models", type=int, default=40, help="models of the base catalog (about one 4-GPU replica per node in all)")
    p.add_argument("--applies", type=int, default=10, help="new models applied one at a time, each measured")
    p.add_argument("--failures", type=int, default=20, help="shards failed one at a time, each measured")
    p.add_argument("--losses", type=int, default=5, help="nodes silenced at once, each loss measured")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds between a node's heartbeats")
    p.add_argument("--window", type=float, default=20.0, help="seconds of the quiet window that measures traffic")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds any one stage may take")
    # A day's rates, per 2,000 nodes (scaled with --nodes): hardware interruptions
    # at about the rate Meta reported for Llama 3's 16k-GPU run (~8 a day),
    # engines crashing five times as often, a catalog changed 50 times a day.
    p.add_argument("--day-applies", type=int, default=50, help="catalog changes in a simulated day (default 50)")
    p.add_argument("--day-failures", type=float, default=40, help="shard failures a day per 2,000 nodes (default 40)")
    p.add_argument("--day-losses", type=float, default=8, help="node losses a day per 2,000 nodes (default 8)")
    p.add_argument("--gateways", type=int, default=3, help="gateways reporting load, for the day's estimate (default 3)")
    p.add_argument(
        "--load-changes-per-day", type=int, default=1440,
        help="load changes a day per model and gateway, each one report (default 1,440: once a minute)",
    )  # fmt: skip
    p.add_argument("--skip", default="", help="comma-separated: restart")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (logs) and say where")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmgw-fleet-"))
    try:
        asyncio.run(bench(args, root))
    finally:
        if args.keep:
            say(f"(the run's folder: {root})")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
